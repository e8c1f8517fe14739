// The elastic manager's profiling run: times prefills at degrees
// 1..N (a group of N members, one compute thread each, the K/V all-gathered
// per layer over UCX as `language --role=elastic` does; degree 1 is one
// instance's Forward) over a range of prompt lengths, fits T_d(S) = a + b S
// + c S^2 seconds per degree (non-negative least squares), prints measured
// against fitted, writes the file `router --elastic --elastic_step_models=FILE`
// reads and a JSON line last.
//
//   bazel build --config=opt //bench:elastic_profile
//   bazel-bin/bench/elastic_profile --degrees=2 --tokens=256,512,1024,2048,4096 --layers=2
//       --fit_out=deploy/elastic_step_models.txt
//
// Dimensions: Qwen2-0.5B's (random bf16 weights), or a model directory's
// config.json (--model_dir, its own dtype). Only --layers run; the times
// are scaled to --model_layers (default: the model's own count), since
// every layer costs the same (the embedding and the one-row LM head, which
// do not scale, are a small part). Each point is the median of --reps
// runs; the degrees alternate within a run, their order reversed every
// other run (the machine is shared and noisy: the load average is
// recorded).
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/elastic_group.h"
#include "bench/elastic_profile_fit.h"
#include "bench/qwen2_dims.h"
#include "common/logging.h"
#include "model/model_config.h"
#include "router/elastic_step_models.h"
#include "transfer/ucx_context.h"

ABSL_FLAG(int, degrees, 2, "profile degrees 1..N (N members, one thread each)");
ABSL_FLAG(std::vector<std::string>, tokens,
          std::vector<std::string>({"256", "512", "1024", "2048", "4096"}),
          "prompt lengths S, comma-separated");
ABSL_FLAG(int, layers, 2, "decoder layers run (times are scaled to --model_layers)");
ABSL_FLAG(int, model_layers, 0, "the layers the models are for (0: the model's own)");
ABSL_FLAG(std::string, model_dir, "", "take the dimensions from this model (default Qwen2-0.5B)");
ABSL_FLAG(std::string, rows, "contiguous",
          "rows of a member: contiguous (the router's) or striped");
ABSL_FLAG(int, reps, 3, "runs per point (the median is fitted)");
ABSL_FLAG(std::string, fit_out, "", "write the models file here");

namespace mmserve::bench {
namespace {

struct Setup {
  model::TextConfig cfg;
  model::DType dtype = model::DType::kBF16;
  std::string dims = "Qwen2-0.5B";
  int model_layers = 0;
  std::vector<int64_t> tokens;
  ElasticRows rows = ElasticRows::kContiguous;
};

absl::StatusOr<Setup> SetupFromFlags() {
  Setup s;
  s.cfg = Qwen2HalfBDims();
  if (const std::string dir = absl::GetFlag(FLAGS_model_dir); !dir.empty()) {
    auto config = model::LoadModelConfig(dir);
    if (!config.ok()) return config.status();
    s.cfg = config->text;
    s.dims = dir;
    if (config->torch_dtype == "float32") s.dtype = model::DType::kF32;
  }
  s.model_layers = absl::GetFlag(FLAGS_model_layers) > 0 ? absl::GetFlag(FLAGS_model_layers)
                                                         : s.cfg.num_hidden_layers;
  s.cfg.num_hidden_layers = std::min(absl::GetFlag(FLAGS_layers), s.model_layers);
  for (const std::string& t : absl::GetFlag(FLAGS_tokens)) {
    int64_t v = 0;
    if (!absl::SimpleAtoi(t, &v) || v < 2) {
      return absl::InvalidArgumentError(absl::StrCat("--tokens: bad length ", t));
    }
    s.tokens.push_back(v);
  }
  std::sort(s.tokens.begin(), s.tokens.end());
  const std::string rows = absl::GetFlag(FLAGS_rows);
  if (rows != "contiguous" && rows != "striped") {
    return absl::InvalidArgumentError("--rows: contiguous or striped");
  }
  s.rows = rows == "striped" ? ElasticRows::kStriped : ElasticRows::kContiguous;
  if (s.tokens.empty() || absl::GetFlag(FLAGS_degrees) < 1 || absl::GetFlag(FLAGS_reps) < 1 ||
      s.cfg.num_hidden_layers < 1) {
    return absl::InvalidArgumentError("--tokens, --degrees, --reps and --layers must be >= 1");
  }
  return s;
}

double LoadAverage() {
  double v = -1;
  if (std::FILE* f = std::fopen("/proc/loadavg", "r")) {
    if (std::fscanf(f, "%lf", &v) != 1) v = -1;
    std::fclose(f);
  }
  return v;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Seconds of one prefill of `len` tokens at `degree`, scaled to the model's
// layers.
double TimeOne(transfer::UcxContext& ctx, const Setup& s,
               const std::vector<std::unique_ptr<ElasticBenchNode>>& nodes, int degree,
               int64_t len) {
  const double seconds =
      degree == 1 ? TimedSinglePrefill(*nodes[0], s.cfg, len)
                  : TimedGroupPrefill(ctx, s.cfg, nodes, ElasticSplit(len, degree, s.rows));
  return seconds * s.model_layers / s.cfg.num_hidden_layers;
}

// Every point's median over the runs.
std::vector<ElasticProfilePoint> Profile(transfer::UcxContext& ctx, const Setup& s,
                                         const model::Qwen2Weights& w) {
  const int degrees = absl::GetFlag(FLAGS_degrees);
  std::vector<std::unique_ptr<ElasticBenchNode>> nodes;
  for (int m = 0; m < degrees; ++m) {
    nodes.push_back(std::make_unique<ElasticBenchNode>(s.cfg, w, s.tokens.back()));
  }
  for (int d = 1; d <= degrees; ++d) TimeOne(ctx, s, nodes, d, s.tokens.front());  // warm-up
  std::vector<std::vector<std::vector<double>>> runs(
      degrees, std::vector<std::vector<double>>(s.tokens.size()));
  for (int rep = 0; rep < absl::GetFlag(FLAGS_reps); ++rep) {
    for (size_t t = 0; t < s.tokens.size(); ++t) {
      for (int i = 0; i < degrees; ++i) {
        const int d = rep % 2 == 0 ? i + 1 : degrees - i;
        runs[d - 1][t].push_back(TimeOne(ctx, s, nodes, d, s.tokens[t]));
      }
    }
  }
  std::vector<ElasticProfilePoint> points;
  for (int d = 1; d <= degrees; ++d) {
    for (size_t t = 0; t < s.tokens.size(); ++t) {
      points.push_back({d, s.tokens[t], Median(runs[d - 1][t])});
    }
  }
  return points;
}

std::vector<std::string> Comments(const Setup& s, double load_before, double load_after) {
  const std::string when = absl::FormatTime("%Y-%m-%dT%H:%MZ", absl::Now(), absl::UTCTimeZone());
  return {
      absl::StrFormat("bench:elastic_profile %s: %s dims, T_d(S) = a + b S + c S^2 seconds for a "
                      "prefill of S prompt tokens, %d layers (%d run, scaled)",
                      when, s.dims, s.model_layers, s.cfg.num_hidden_layers),
      absl::StrFormat("degrees 1..%d, 1 thread a member, UCX shm, rows %s, prompts %s tokens, "
                      "median of %d runs",
                      absl::GetFlag(FLAGS_degrees), absl::GetFlag(FLAGS_rows),
                      absl::StrJoin(s.tokens, ","), absl::GetFlag(FLAGS_reps)),
      absl::StrFormat("loadavg %.2f before, %.2f after (a shared machine)", load_before,
                      load_after),
      "degree a b c"};
}

std::string Json(const Setup& s, const ElasticProfileFit& fit, double load_before,
                 double load_after) {
  std::vector<std::string> points, models;
  for (const ElasticProfileFit::Row& r : fit.rows) {
    points.push_back(absl::StrFormat(
        "{\"degree\": %d, \"tokens\": %d, \"measured_s\": %.6g, \"fitted_s\": %.6g, "
        "\"rel_err\": %.4f}",
        r.degree, r.tokens, r.measured, r.fitted, r.relative_error));
  }
  for (size_t d = 0; d < fit.models.size(); ++d) {
    models.push_back(absl::StrFormat(
        "{\"degree\": %d, \"a\": %.6g, \"b\": %.6g, \"c\": %.6g, \"max_abs_rel_err\": %.4f}", d + 1,
        fit.models[d].a, fit.models[d].b, fit.models[d].c, fit.max_abs_error[d]));
  }
  return absl::StrFormat(
      "{\"bench\": \"elastic_profile\", \"dims\": \"%s\", \"model_layers\": %d, \"layers_run\": "
      "%d, "
      "\"rows\": \"%s\", \"reps\": %d, \"loadavg\": [%.2f, %.2f], \"fit_out\": \"%s\", "
      "\"models\": [%s], \"points\": [%s]}",
      s.dims, s.model_layers, s.cfg.num_hidden_layers, absl::GetFlag(FLAGS_rows),
      absl::GetFlag(FLAGS_reps), load_before, load_after, absl::GetFlag(FLAGS_fit_out),
      absl::StrJoin(models, ", "), absl::StrJoin(points, ", "));
}

int Main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  absl::StatusOr<Setup> s = SetupFromFlags();
  if (!s.ok()) {
    std::fprintf(stderr, "elastic_profile: %s\n", std::string(s.status().message()).c_str());
    return 2;
  }
  const auto weights = model::Qwen2Weights::Random(s->cfg, s->dtype, /*seed=*/1);
  auto ctx = transfer::UcxContext::Create(transfer::TransportProfile::kShm);
  CHECK_OK(ctx.status());
  const double load_before = LoadAverage();
  const std::vector<ElasticProfilePoint> points = Profile(**ctx, *s, *weights);
  const double load_after = LoadAverage();
  absl::StatusOr<ElasticProfileFit> fit = FitElasticProfile(points);
  CHECK_OK(fit.status());
  const std::vector<std::string> comments = Comments(*s, load_before, load_after);
  for (const std::string& c : comments) std::printf("%s\n", c.c_str());
  std::fputs(ElasticProfileTable(*fit).c_str(), stdout);
  if (const std::string out = absl::GetFlag(FLAGS_fit_out); !out.empty()) {
    std::ofstream f(out);
    f << router::FormatElasticStepModels(fit->models, comments);
    if (!f.good()) {
      std::fprintf(stderr, "elastic_profile: cannot write %s\n", out.c_str());
      return 1;
    }
    std::printf("wrote %s\n", out.c_str());
  }
  std::printf("%s\n", Json(*s, *fit, load_before, load_after).c_str());
  return 0;
}

}  // namespace
}  // namespace mmserve::bench

int main(int argc, char** argv) { return mmserve::bench::Main(argc, argv); }
