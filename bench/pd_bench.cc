// pd_bench: prefill/decode disaggregation against role both, through the
// real services: a router with a `--role=prefill` and a `--role=decode`
// language instance (the KV handed over UCX, shm), against a router with one
// role-both instance, every instance with --threads compute threads. Text
// prompts of exact lengths (random token ids, so no prefix-cache hits),
// greedy, EOS ignored, sent one at a time through the router's Generate.
//
// Arms (every stack is up before the first timed request; arms alternate
// within each round so that they see the same machine load):
//   both       role both, --threads (the TTFT baseline);
//   pd         P/D with the binary's default hand-off flags;
//   pd_whole   P/D with --handoff_layer_group=0 (every hand-off whole after
//              the forward);
//   pd_gN      P/D with --handoff_layer_group=N and
//              --handoff_layerwise_min_tokens=0 (the sweep, "all": one
//              group of every layer), each measured beside pd_whole;
//   both_x2    role both with twice --threads (the goodput baseline: the
//              cores of the prefill and the decode instance together).
//
// Reported, per prompt length: TTFT of both and pd and their ratio; the
// hand-off time alone, handoff_alone (pd_whole's exposed hand-off: from the
// first token sampled to CommitKv acknowledged, nothing else running,
// mmserve_language_kv_handoff_exposed_seconds); pd's exposed hand-off; the
// fraction hidden behind the forward, 1 - exposed(pd) / handoff_alone. (The
// TTFT difference ttft_pd - ttft_both is not used for it: on the CPU it is a
// few milliseconds inside seconds of prefill, below the run-to-run noise.)
// The sweep gives, per group size and length, the exposed hand-off and the
// TTFT against pd_whole's. Goodput: --goodput_requests requests of
// --goodput_prompt tokens, --goodput_output tokens each, --goodput_concurrency
// at a time, on pd against both_x2 (the same requests); a request is good
// when its TTFT and TPOT are within --slo_x times both's single-request
// ones, measured in the same run.
//
// --prefill_tp=N (> 1) adds a P/D arm whose prefill instance runs --tp=N
// (each rank on --threads threads) and a role-both arm with N x --threads,
// each measured at the longest length beside its baseline (pd, both); it
// prints tpN_prefill_vs_ceiling (pd's TTFT over the TP prefill's, divided
// by parallel_ceiling, both's TTFT over N x --threads') and
// parallel_ceiling, null when an arm did not run (the reason is printed).
//
//   python3 tools/make_random_qwen2.py --out /tmp/qwen2-0.5b-random
//   bazel run --config=opt //bench:pd_bench -- --model_dir=/tmp/qwen2-0.5b-random
//
// Prints a human table, then one JSON line last.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "bench/loadgen/stats.h"
#include "common/clock.h"
#include "common/grpc_server.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"
#include "deploy/launcher/local_stack.h"
#include "proto/inference.grpc.pb.h"
#include "tests/stack_harness.h"

ABSL_FLAG(std::string, model_dir, "", "model directory (default: the bundled demo model)");
ABSL_FLAG(std::vector<std::string>, lengths, std::vector<std::string>({"512", "2048", "4096"}),
          "prompt lengths (tokens) of the TTFT comparison");
ABSL_FLAG(std::vector<std::string>, sweep_lengths,
          std::vector<std::string>({"128", "256", "512", "2048"}),
          "prompt lengths of the layer-group sweep (empty: no sweep)");
ABSL_FLAG(std::vector<std::string>, layer_groups,
          std::vector<std::string>({"1", "2", "4", "8", "all"}),
          "--handoff_layer_group values of the sweep (all: one group of every layer)");
ABSL_FLAG(int, rounds, 2, "timed requests per arm and length");
ABSL_FLAG(int, threads, 1, "compute threads of each instance (each rank)");
ABSL_FLAG(int, kv_cache_mb, 384, "every instance's --kv_cache_mb");
ABSL_FLAG(int, goodput_requests, 8, "requests of the goodput run (0: none)");
ABSL_FLAG(int, goodput_concurrency, 4, "requests in flight at once in the goodput run");
ABSL_FLAG(int, goodput_prompt, 512, "prompt tokens of each goodput request");
ABSL_FLAG(int, goodput_output, 32, "output tokens of each goodput request");
ABSL_FLAG(double, slo_x, 4, "goodput SLO: TTFT and TPOT within this many times both's alone");
ABSL_FLAG(int, prefill_tp, 1, "> 1: also a P/D arm whose prefill instance runs --tp=N");
ABSL_FLAG(double, timeout_s, 600, "per-request deadline");
ABSL_FLAG(std::string, log_dir, "/tmp", "where the services' logs go");

namespace mmserve::bench {
namespace {

constexpr char kExposed[] = "mmserve_language_kv_handoff_exposed_seconds";

std::string LoadAverage() {
  std::ifstream f("/proc/loadavg");
  std::string one;
  f >> one;
  return one.empty() ? "0" : one;
}

absl::StatusOr<std::vector<int>> Ints(const std::vector<std::string>& v, const char* flag) {
  std::vector<int> out;
  for (const std::string& s : v) {
    int n = 0;
    if (!absl::SimpleAtoi(s, &n) || n < 1) {
      return absl::InvalidArgumentError(absl::StrCat("--", flag, ": bad length '", s, "'"));
    }
    out.push_back(n);
  }
  return out;
}

// 512 -> "512", 2048 -> "2k": the JSON keys' suffixes.
std::string LengthKey(int n) {
  return n % 1024 == 0 ? absl::StrCat(n / 1024, "k") : absl::StrCat(n);
}

double Mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0 : s / v.size();
}

// a / b; NaN (null in the JSON line) when b is not positive.
double Ratio(double a, double b) { return b > 0 ? a / b : std::nan(""); }

// A timed Generate call.
struct Timed {
  absl::Status status;
  double ttft_s = -1, end_s = 0, sent_s = 0;
  std::vector<double> token_s;
  int tokens = 0;
};

class Arm {
 public:
  struct Spec {
    std::string name;
    bool pd = false;
    int threads = 1;
    std::vector<std::string> prefill_args;  // pd only
  };

  static absl::StatusOr<std::unique_ptr<Arm>> Start(const Spec& spec) {
    launcher::StackOptions o;
    o.bin_dir = testing::RunfilesRoot();
    o.model_dir = absl::GetFlag(FLAGS_model_dir).empty() ? testing::DemoModelDir()
                                                         : absl::GetFlag(FLAGS_model_dir);
    o.log_dir = absl::StrCat(absl::GetFlag(FLAGS_log_dir), "/pd_bench_", spec.name);
    std::filesystem::create_directories(o.log_dir);
    o.encoders = 0;
    o.http_port = -1;
    o.ready_timeout = absl::Seconds(300);
    // A loaded machine's instance in a long forward may answer the router's
    // health polls late; it must not drop out of placement mid-run.
    o.router_args = {"--poll_timeout_ms=5000"};
    o.language_args = {absl::StrCat("--threads=", spec.threads),
                       absl::StrCat("--kv_cache_mb=", absl::GetFlag(FLAGS_kv_cache_mb))};
    if (spec.pd) {
      o.prefill = o.decode = 1;
      // The prefill instance's flags; the decode instance's come after them
      // (the last of a repeated flag counts).
      for (const std::string& a : spec.prefill_args) o.language_args.push_back(a);
      o.decode_args = {"--tp=1", "--handoff_layer_group=0"};
    }
    auto stack = launcher::LocalStack::Start(o);
    if (!stack.ok()) {
      return absl::Status(stack.status().code(),
                          absl::StrCat(spec.name, ": ", stack.status().message()));
    }
    auto arm = std::unique_ptr<Arm>(new Arm(spec));
    arm->stack_ = std::move(*stack);
    arm->stub_ = v1::Inference::NewStub(InternalChannel(arm->stack_->router_address()));
    return arm;
  }

  const std::string& name() const { return spec_.name; }
  bool pd() const { return spec_.pd; }

  // One request; the exposed hand-off it added on the prefill instance
  // (seconds, pd arms) into `exposed_s`.
  Timed Ask(const v1::GenerateRequest& request, const Stopwatch& clock, double* exposed_s) {
    const double before = ExposedSum();
    Timed t = Call(request, clock);
    if (exposed_s != nullptr && pd() && t.status.ok()) {
      // Observed before the first token went out, so it is in by now.
      const double after = ExposedSum();
      *exposed_s = after >= 0 && before >= 0 ? after - before : -1;
    }
    return t;
  }

  Timed Call(const v1::GenerateRequest& request, const Stopwatch& clock) {
    Timed t;
    grpc::ClientContext ctx;
    ctx.set_deadline(
        std::chrono::system_clock::now() +
        std::chrono::milliseconds(static_cast<int64_t>(absl::GetFlag(FLAGS_timeout_s) * 1000)));
    t.sent_s = clock.ElapsedSeconds();
    auto reader = stub_->Generate(&ctx, request);
    v1::GenerateResponse r;
    while (reader->Read(&r)) {
      if (r.token_ids_size() == 0) continue;
      const double now = clock.ElapsedSeconds();
      if (t.ttft_s < 0) t.ttft_s = now - t.sent_s;
      t.token_s.push_back(now);
      t.tokens += r.token_ids_size();
    }
    t.status = FromGrpcStatus(reader->Finish());
    t.end_s = clock.ElapsedSeconds();
    if (t.status.ok() && t.ttft_s < 0) t.status = absl::InternalError("no token came");
    return t;
  }

 private:
  explicit Arm(Spec spec) : spec_(std::move(spec)) {}
  double ExposedSum() {
    if (!pd()) return 0;
    return testing::ScrapeMetric(stack_->prefill(0).metrics_port(), absl::StrCat(kExposed, "_sum"));
  }

  Spec spec_;
  std::unique_ptr<launcher::LocalStack> stack_;
  std::unique_ptr<v1::Inference::Stub> stub_;
};

// A prompt of `n` random token ids (below the demo tokenizer's specials,
// which every model directory the bench runs has), `max_tokens` out.
v1::GenerateRequest Request(int n, int max_tokens, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<uint32_t> id(0, 999);
  v1::GenerateRequest r;
  for (int i = 0; i < n; ++i) r.mutable_raw()->add_token_ids(id(rng));
  r.mutable_sampling()->set_temperature(0);
  r.mutable_sampling()->set_max_tokens(static_cast<uint32_t>(max_tokens));
  r.mutable_sampling()->set_ignore_eos(true);
  r.mutable_stream()->set_include_token_ids(true);
  return r;
}

// Per arm and length: TTFTs and exposed hand-offs (seconds).
struct Samples {
  std::map<int, std::vector<double>> ttft, exposed;
};

// `rounds` requests per arm and length, the arms' order alternating.
absl::Status Measure(const std::vector<Arm*>& arms, const std::vector<int>& lengths,
                     const Stopwatch& clock, std::map<std::string, Samples>& out, uint64_t& seed) {
  for (int round = 0; round < absl::GetFlag(FLAGS_rounds); ++round) {
    for (int n : lengths) {
      std::vector<Arm*> order = arms;
      if (round % 2 == 1) std::reverse(order.begin(), order.end());
      for (Arm* arm : order) {
        // The same prompt length, different ids per arm (no cache hits).
        v1::GenerateRequest r = Request(n, 2, ++seed);
        double exposed = -1;
        Timed t = arm->Ask(r, clock, &exposed);
        if (!t.status.ok()) {
          return absl::Status(t.status.code(), absl::StrCat(arm->name(), " at ", n,
                                                            " tokens: ", t.status.message()));
        }
        out[arm->name()].ttft[n].push_back(t.ttft_s);
        if (exposed >= 0) out[arm->name()].exposed[n].push_back(exposed);
      }
    }
  }
  return absl::OkStatus();
}

// The goodput run on `arm`: the same requests, `concurrency` at a time.
std::vector<loadgen::Record> RunConcurrent(Arm& arm, const std::vector<v1::GenerateRequest>& reqs,
                                           int concurrency, const Stopwatch& clock) {
  std::vector<loadgen::Record> records(reqs.size());
  std::atomic<size_t> next{0};
  std::vector<std::thread> threads;
  for (int c = 0; c < concurrency; ++c) {
    threads.emplace_back([&] {
      for (size_t i = next++; i < reqs.size(); i = next++) {
        Timed t = arm.Call(reqs[i], clock);
        loadgen::Record& rec = records[i];
        rec.item = static_cast<int>(i);
        rec.sent_s = t.sent_s;
        rec.first_token_s = t.ttft_s >= 0 ? t.sent_s + t.ttft_s : -1;
        rec.end_s = t.end_s;
        rec.token_s = t.token_s;
        rec.output_tokens = t.tokens;
        rec.prompt_tokens = reqs[i].raw().token_ids_size();
        rec.status = t.status;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  return records;
}

// "all" -> one group of every layer (the role caps a group at the layers).
constexpr int kAllLayers = 1000;

absl::StatusOr<std::vector<int>> Groups() {
  std::vector<int> out;
  for (const std::string& g : absl::GetFlag(FLAGS_layer_groups)) {
    int n = 0;
    if (g == "all") {
      n = kAllLayers;
    } else if (!absl::SimpleAtoi(g, &n) || n < 1) {
      return absl::InvalidArgumentError(absl::StrCat("--layer_groups: bad group '", g, "'"));
    }
    out.push_back(n);
  }
  return out;
}

std::string GroupName(int g) { return g == kAllLayers ? "all" : absl::StrCat(g); }

absl::Status CheckFlags() {
  if (absl::GetFlag(FLAGS_rounds) < 1 || absl::GetFlag(FLAGS_threads) < 1 ||
      absl::GetFlag(FLAGS_prefill_tp) < 1 || absl::GetFlag(FLAGS_goodput_requests) < 0 ||
      absl::GetFlag(FLAGS_goodput_concurrency) < 1 || absl::GetFlag(FLAGS_goodput_prompt) < 1 ||
      absl::GetFlag(FLAGS_goodput_output) < 2 || absl::GetFlag(FLAGS_slo_x) <= 0) {
    return absl::InvalidArgumentError(
        "--rounds, --threads, --prefill_tp, --goodput_concurrency and --goodput_prompt must be "
        ">= 1, --goodput_output >= 2, --goodput_requests >= 0, --slo_x > 0");
  }
  if (absl::GetFlag(FLAGS_lengths).empty()) return absl::InvalidArgumentError("--lengths is empty");
  return absl::OkStatus();
}

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "pd_bench: %s\n", s.ToString().c_str());
  return 1;
}

// What the JSON line collects, in order.
class JsonLine {
 public:
  // A value that is not finite (a ratio over nothing) is null.
  void Add(const std::string& key, double v) {
    fields_.push_back(std::isfinite(v) ? absl::StrFormat("\"%s\":%.4g", key, v)
                                       : absl::StrFormat("\"%s\":null", key));
  }
  void AddRaw(const std::string& key, const std::string& v) {
    fields_.push_back(absl::StrFormat("\"%s\":%s", key, v));
  }
  std::string str() const { return absl::StrCat("{", absl::StrJoin(fields_, ","), "}"); }

 private:
  std::vector<std::string> fields_;
};

// The goodput run: pd against both_x2, the same requests.
absl::Status Goodput(Arm& both, Arm& pd, const Stopwatch& clock, uint64_t& seed, JsonLine& json) {
  const int n = absl::GetFlag(FLAGS_goodput_requests);
  if (n == 0) return absl::OkStatus();
  const int prompt = absl::GetFlag(FLAGS_goodput_prompt);
  const int out = absl::GetFlag(FLAGS_goodput_output);
  // The SLO: both's own TTFT and TPOT, alone, times --slo_x.
  Timed alone = both.Call(Request(prompt, out, ++seed), clock);
  if (!alone.status.ok()) return alone.status;
  loadgen::Slo slo;
  slo.ttft_ms = absl::GetFlag(FLAGS_slo_x) * alone.ttft_s * 1e3;
  slo.tpot_ms = absl::GetFlag(FLAGS_slo_x) * (alone.end_s - alone.sent_s - alone.ttft_s) * 1e3 /
                std::max(1, alone.tokens - 1);
  std::vector<v1::GenerateRequest> reqs;
  for (int i = 0; i < n; ++i) reqs.push_back(Request(prompt, out, ++seed));
  const int threads = 2 * absl::GetFlag(FLAGS_threads);
  auto x2 = Arm::Start({.name = "both_x2", .threads = threads});
  if (!x2.ok()) return x2.status();
  (*x2)->Call(Request(64, 2, ++seed), clock);  // warm-up
  std::map<std::string, loadgen::Summary> sums;
  for (Arm* arm : {&pd, x2->get()}) {
    std::vector<loadgen::Record> records =
        RunConcurrent(*arm, reqs, absl::GetFlag(FLAGS_goodput_concurrency), clock);
    for (const loadgen::Record& r : records) {
      if (!r.status.ok()) {
        return absl::Status(r.status.code(), absl::StrCat(arm->name(), ": ", r.status.message()));
      }
    }
    sums[arm->name()] = loadgen::Summarize(records, slo);
  }
  const loadgen::Summary& p = sums[pd.name()];
  const loadgen::Summary& b = sums["both_x2"];
  absl::PrintF(
      "\ngoodput: %d requests of %d tokens, %d out, %d at a time; SLO TTFT %.0f ms, TPOT %.1f ms "
      "(%.1fx both alone)\n",
      n, prompt, out, absl::GetFlag(FLAGS_goodput_concurrency), slo.ttft_ms, slo.tpot_ms,
      absl::GetFlag(FLAGS_slo_x));
  absl::PrintF("%-22s %10s %10s %10s %10s %10s\n", "arm", "good/s", "attain", "tok/s", "ttft_p50",
               "tpot_p50");
  for (const auto& [name, s] : {std::pair{std::string("pd (1+1 instances)"), p},
                                std::pair{absl::StrCat("both x", threads, " threads"), b}}) {
    absl::PrintF("%-22s %10.3f %10.2f %10.1f %8.0fms %8.1fms\n", name, s.goodput, s.slo_attainment,
                 s.output_token_rate, s.ttft_ms.p50, s.tpot_ms.p50);
  }
  json.Add("goodput_pd_vs_both", Ratio(p.goodput, b.goodput));
  json.Add("throughput_pd_vs_both", Ratio(p.output_token_rate, b.output_token_rate));
  json.Add("goodput_pd_per_s", p.goodput);
  json.Add("goodput_both_per_s", b.goodput);
  return absl::OkStatus();
}

// --prefill_tp: TTFT at the longest length of a TP prefill against pd, and
// of role both on as many threads against both (the ceiling). Both keys are
// always in the JSON line with --prefill_tp > 1: null when a part did not
// run (its arm failed to start or to answer; the reason is printed).
absl::Status PrefillTp(Arm& both, Arm& pd, int longest, const Stopwatch& clock, uint64_t& seed,
                       JsonLine& json) {
  const int tp = absl::GetFlag(FLAGS_prefill_tp);
  if (tp == 1) return absl::OkStatus();
  const int th = absl::GetFlag(FLAGS_threads);
  std::map<std::string, Samples> s;
  // Each arm alone beside its baseline, so one that fails leaves the other.
  auto measure = [&](const Arm::Spec& spec, Arm& baseline) -> absl::Status {
    auto arm = Arm::Start(spec);
    if (!arm.ok()) return arm.status();
    if (Timed t = (*arm)->Call(Request(64, 2, ++seed), clock); !t.status.ok()) {
      return t.status;  // warm-up
    }
    return Measure({&baseline, arm->get()}, {longest}, clock, s, seed);
  };
  const std::string pd_tp = absl::StrCat("pd_tp", tp), both_n = absl::StrCat("both_t", tp * th);
  if (absl::Status st = measure(
          {.name = pd_tp, .pd = true, .threads = th, .prefill_args = {absl::StrCat("--tp=", tp)}},
          pd);
      !st.ok()) {
    absl::PrintF("\nprefill --tp=%d not measured: %s\n", tp, st.ToString());
  }
  if (absl::Status st = measure({.name = both_n, .threads = tp * th}, both); !st.ok()) {
    absl::PrintF("\nrole both on %d threads not measured: %s\n", tp * th, st.ToString());
  }
  // Mean of nothing is 0: a ratio over it is null, one of it 0 (made null).
  auto mean = [&s](const std::string& arm, int n) {
    const double m = Mean(s[arm].ttft[n]);
    return m > 0 ? m : std::nan("");
  };
  const double ceiling = Ratio(mean(both.name(), longest), mean(both_n, longest));
  const double speedup = Ratio(mean(pd.name(), longest), mean(pd_tp, longest));
  absl::PrintF("\nprefill --tp=%d at %d tokens: %.2fx pd's TTFT; role both on %dx threads %.2fx\n",
               tp, longest, speedup, tp, ceiling);
  json.Add(absl::StrCat("tp", tp, "_prefill_vs_ceiling"), Ratio(speedup, ceiling));
  json.Add("parallel_ceiling", ceiling);
  return absl::OkStatus();
}

// The layer-group sweep beside pd_whole.
absl::Status Sweep(Arm& whole, const Stopwatch& clock, uint64_t& seed, JsonLine& json) {
  auto lengths = Ints(absl::GetFlag(FLAGS_sweep_lengths), "sweep_lengths");
  if (!lengths.ok()) return lengths.status();
  auto groups = Groups();
  if (!groups.ok()) return groups.status();
  if (lengths->empty() || groups->empty()) return absl::OkStatus();
  absl::PrintF("\nlayer-group sweep (--handoff_layerwise_min_tokens=0), against pd_whole\n");
  absl::PrintF("%-6s %7s %11s %11s %8s %12s %12s\n", "group", "tokens", "ttft", "whole_ttft",
               "ratio", "exposed", "whole_exp");
  std::vector<std::string> objs;
  for (int g : *groups) {
    const std::string name = absl::StrCat("pd_g", GroupName(g));
    auto arm = Arm::Start({.name = name,
                           .pd = true,
                           .threads = absl::GetFlag(FLAGS_threads),
                           .prefill_args = {absl::StrCat("--handoff_layer_group=", g),
                                            "--handoff_layerwise_min_tokens=0"}});
    if (!arm.ok()) return arm.status();
    (*arm)->Call(Request(64, 2, ++seed), clock);  // warm-up
    std::map<std::string, Samples> s;
    RETURN_IF_ERROR(Measure({arm->get(), &whole}, *lengths, clock, s, seed));
    JsonLine o;
    for (int n : *lengths) {
      const double t = Mean(s[name].ttft[n]), tw = Mean(s[whole.name()].ttft[n]);
      const double e = Mean(s[name].exposed[n]), ew = Mean(s[whole.name()].exposed[n]);
      absl::PrintF("%-6s %7d %9.1fms %9.1fms %8.3f %10.3fms %10.3fms\n", GroupName(g), n, t * 1e3,
                   tw * 1e3, Ratio(t, tw), e * 1e3, ew * 1e3);
      o.Add(absl::StrCat("ttft_vs_whole_", LengthKey(n)), Ratio(t, tw));
      o.Add(absl::StrCat("exposed_ms_", LengthKey(n)), e * 1e3);
      o.Add(absl::StrCat("whole_exposed_ms_", LengthKey(n)), ew * 1e3);
    }
    objs.push_back(absl::StrCat("\"", GroupName(g), "\":", o.str()));
  }
  json.AddRaw("sweep", absl::StrCat("{", absl::StrJoin(objs, ","), "}"));
  return absl::OkStatus();
}

int Main() {
  if (absl::Status s = CheckFlags(); !s.ok()) return Fail(s);
  auto lengths = Ints(absl::GetFlag(FLAGS_lengths), "lengths");
  if (!lengths.ok()) return Fail(lengths.status());
  const int th = absl::GetFlag(FLAGS_threads);
  auto both = Arm::Start({.name = "both", .threads = th});
  if (!both.ok()) return Fail(both.status());
  auto pd = Arm::Start({.name = "pd", .pd = true, .threads = th});
  if (!pd.ok()) return Fail(pd.status());
  auto whole = Arm::Start(
      {.name = "pd_whole", .pd = true, .threads = th, .prefill_args = {"--handoff_layer_group=0"}});
  if (!whole.ok()) return Fail(whole.status());
  Stopwatch clock;
  uint64_t seed = 1;
  for (Arm* arm : {both->get(), pd->get(), whole->get()}) {
    if (Timed t = arm->Call(Request(64, 2, ++seed), clock); !t.status.ok()) {
      return Fail(t.status);
    }
  }
  const std::string load_before = LoadAverage();
  std::map<std::string, Samples> s;
  if (absl::Status st = Measure({both->get(), pd->get(), whole->get()}, *lengths, clock, s, seed);
      !st.ok()) {
    return Fail(st);
  }
  JsonLine json;
  json.AddRaw("bench", "\"pd_bench\"");
  json.Add("threads", th);
  json.Add("rounds", absl::GetFlag(FLAGS_rounds));
  absl::PrintF(
      "P/D (prefill + decode instance, UCX shm) against role both, %d thread(s) each, "
      "%d round(s), means; load average %s\n",
      th, absl::GetFlag(FLAGS_rounds), load_before);
  absl::PrintF("%7s %11s %11s %8s %11s %14s %12s %8s\n", "tokens", "ttft_both", "ttft_pd",
               "pd/both", "ttft_whole", "handoff_alone", "pd_exposed", "hidden");
  double hidden_longest = 0;
  for (int n : *lengths) {
    const double tb = Mean(s["both"].ttft[n]), tp = Mean(s["pd"].ttft[n]);
    const double tw = Mean(s["pd_whole"].ttft[n]);
    const double alone = Mean(s["pd_whole"].exposed[n]), exposed = Mean(s["pd"].exposed[n]);
    const double hidden = alone > 0 ? 1 - exposed / alone : 0;
    absl::PrintF("%7d %9.1fms %9.1fms %8.3f %9.1fms %12.3fms %10.3fms %8.3f\n", n, tb * 1e3,
                 tp * 1e3, Ratio(tp, tb), tw * 1e3, alone * 1e3, exposed * 1e3, hidden);
    const std::string k = LengthKey(n);
    json.Add(absl::StrCat("ttft_pd_vs_both_", k), Ratio(tp, tb));
    json.Add(absl::StrCat("ttft_both_ms_", k), tb * 1e3);
    json.Add(absl::StrCat("ttft_whole_vs_both_", k), Ratio(tw, tb));
    json.Add(absl::StrCat("handoff_alone_ms_", k), alone * 1e3);
    json.Add(absl::StrCat("handoff_exposed_ms_", k), exposed * 1e3);
    json.Add(absl::StrCat("handoff_hidden_fraction_", k), hidden);
    if (n == *std::max_element(lengths->begin(), lengths->end())) hidden_longest = hidden;
  }
  json.Add("handoff_hidden_fraction", hidden_longest);
  const int longest = *std::max_element(lengths->begin(), lengths->end());
  if (absl::Status st = PrefillTp(**both, **pd, longest, clock, seed, json); !st.ok()) {
    return Fail(st);
  }
  if (absl::Status st = Goodput(**both, **pd, clock, seed, json); !st.ok()) return Fail(st);
  both->reset();
  pd->reset();
  if (absl::Status st = Sweep(**whole, clock, seed, json); !st.ok()) return Fail(st);
  json.AddRaw("load_before", load_before);
  json.AddRaw("load_avg", LoadAverage());
  absl::PrintF("load average %s -> %s\n", load_before, LoadAverage());
  absl::PrintF("%s\n", json.str());
  return 0;
}

}  // namespace
}  // namespace mmserve::bench

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return mmserve::bench::Main();
}
