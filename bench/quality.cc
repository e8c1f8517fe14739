// Quality of the precision modes a user can serve: each mode's next-token
// distributions over a text corpus against the fp32 reference of the same
// weights (teacher forcing: every position of every chunk).
//
//   bazel run -c opt //bench:quality                        # the demo model
//   bazel run -c opt //bench:quality -- --dims=qwen2-0.5b --layers=8
//
// Per mode: the mean KL divergence KL(reference || mode) over positions, the
// top-1 agreement with the reference, the perplexity of the corpus's next
// tokens, and the largest logit difference. The reference is fp32 weights
// with fp32 activations: the checkpoint's weights widened (an fp32
// checkpoint), or, with --dims, random fp32 weights whose bf16 rounding is
// the bf16 modes' weights (Qwen2Weights::Random draws the same values).
// Modes: bf16 weights with fp32 or bf16 activations (bf16 weights only),
// int8 weights (one scale per row, or per 32 columns) with int16 (one scale
// per row) or int8 activations (one scale per 32 columns): int8_g32 weights
// with int8 activations is llama.cpp's Q8_0 scheme, with fp32 scales where
// Q8_0 stores fp16 ones; and 4-bit weights (--quantize=int4_*: groups of 32
// or 128 columns, symmetric or with zero points), whose layers always take
// int8 activations. Quality does not depend on machine load, so the figures stand
// on a busy machine too. The corpus defaults to a license text every Debian
// machine has; the tokens are the demo model's tokenizer's (their ids are
// below every supported vocabulary size). Random weights' perplexity is
// meaningless (their answers are noise); their KL and agreement are not.
// Last line: JSON, "modes" a list of {mode, kld (mean KL divergence), top1,
// ppl, max_dlogit}.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "bench/qwen2_dims.h"
#include "common/file.h"
#include "common/logging.h"
#include "model/cpu/linear.h"
#include "model/cpu/thread_pool.h"
#include "model/model_config.h"
#include "model/qwen2_model.h"
#include "model/qwen2_test_runner.h"
#include "model/qwen2_weights.h"
#include "model/safetensors.h"
#include "model/tokenizer.h"

ABSL_FLAG(std::string, model_dir, "models/shapes-demo",
          "Hugging Face model directory (fp32 weights: the reference is exact)");
ABSL_FLAG(std::string, dims, "",
          "random weights at these text dimensions instead: qwen2-0.5b, qwen2-vl-2b, qwen3-0.6b");
ABSL_FLAG(int, layers, 0, "with --dims: this many decoder layers (0: the model's)");
ABSL_FLAG(std::string, corpus, "/usr/share/common-licenses/GPL-3", "text file");
ABSL_FLAG(std::string, tokenizer, "models/shapes-demo/tokenizer.json", "with --dims");
ABSL_FLAG(int, tokens, 1024, "corpus tokens to score");
ABSL_FLAG(int, chunk, 256, "tokens per sequence");
ABSL_FLAG(int, threads, 0, "compute threads (0: every core)");
ABSL_FLAG(int, score_from, 0,
          "score positions from this one of each chunk on (the ones before are context only); "
          "llama-perplexity --kl-divergence scores from chunk/2");
ABSL_FLAG(std::string, bf16_model_dir, "",
          "with --model_dir: the same checkpoint with bf16 weight matrices, for the bf16 modes "
          "(tools/llamacpp_gguf.py --bf16_dir writes one)");
ABSL_FLAG(std::string, tokens_out, "", "write the scored corpus's token ids here, one a line");

namespace mmserve {
namespace {

using model::DType;
using model::TextConfig;
using model::cpu::LinearKernel;

struct Mode {
  std::string name;
  DType dtype;           // of the weights before quantization (--dims)
  std::string quantize;  // "", "int8", "int8_g32", "int4_g32", ...
  LinearKernel kernel;
  bool bf16_weights;  // needs bf16 weights
};

// The logits of every scored position (chunk by chunk: positions score_from
// to the chunk's last but one), under `kernel`.
std::vector<std::vector<float>> Logits(const TextConfig& cfg, const model::Qwen2Weights& weights,
                                       const std::vector<int32_t>& tokens, int chunk,
                                       int score_from, LinearKernel kernel,
                                       model::cpu::ThreadPool& pool) {
  model::Qwen2Model m(cfg, weights, pool, {kernel});
  std::vector<std::vector<float>> out;
  for (size_t begin = 0; begin + 1 < tokens.size(); begin += chunk) {
    const size_t end = std::min(tokens.size(), begin + chunk);
    model::TestRunner runner(m, (chunk + 15) / 16 + 1, 16);
    const int s = runner.AddSequence({tokens.begin() + begin, tokens.begin() + end});
    auto step = runner.Step({{s, static_cast<int64_t>(end - begin)}}, /*all_rows=*/true);
    CHECK_OK(step.status());
    // Row i predicts token begin + i + 1; the chunk's last row has no target.
    for (size_t i = score_from; i + 1 < end - begin; ++i) {
      out.push_back(std::move((*step)[0][i]));
    }
  }
  return out;
}

void LogSoftmax(const std::vector<float>& x, std::vector<double>* out) {
  const double mx = *std::max_element(x.begin(), x.end());
  double sum = 0;
  for (float v : x) sum += std::exp(v - mx);
  const double lse = mx + std::log(sum);
  out->resize(x.size());
  for (size_t i = 0; i < x.size(); ++i) (*out)[i] = x[i] - lse;
}

struct Quality {
  double kl = 0, top1 = 0, ppl = 0, max_dlogit = 0;
};

Quality Compare(const std::vector<std::vector<float>>& ref,
                const std::vector<std::vector<float>>& got, const std::vector<int32_t>& tokens,
                int chunk, int score_from) {
  Quality q;
  std::vector<double> lp, lq;
  double nll = 0;
  size_t n = 0;
  for (size_t r = 0; r < ref.size(); ++r) {
    LogSoftmax(ref[r], &lp);
    LogSoftmax(got[r], &lq);
    double kl = 0;
    for (size_t i = 0; i < lp.size(); ++i) kl += std::exp(lp[i]) * (lp[i] - lq[i]);
    q.kl += kl;
    const auto argmax = [](const std::vector<float>& v) {
      return std::max_element(v.begin(), v.end()) - v.begin();
    };
    q.top1 += argmax(ref[r]) == argmax(got[r]);
    for (size_t i = 0; i < lp.size(); ++i) {
      q.max_dlogit = std::max(q.max_dlogit, static_cast<double>(std::fabs(ref[r][i] - got[r][i])));
    }
    // Row r is position i of chunk c: it predicts token c * chunk + i + 1.
    const size_t per_chunk = chunk - 1 - score_from;
    const size_t c = r / per_chunk, i = score_from + r % per_chunk;
    nll -= lq[tokens[c * chunk + i + 1]];
    ++n;
  }
  q.kl /= n;
  q.top1 /= n;
  q.ppl = std::exp(nll / n);
  return q;
}

void WriteTokens(const std::string& path, const std::vector<int32_t>& tokens) {
  std::FILE* f = std::fopen(path.c_str(), "w");
  CHECK(f != nullptr) << "--tokens_out: cannot write " << path;
  for (int32_t t : tokens) std::fprintf(f, "%d\n", t);
  CHECK(std::fclose(f) == 0) << "--tokens_out: cannot write " << path;
}

double LoadAverage() {
  double load = -1;
  if (std::FILE* f = std::fopen("/proc/loadavg", "r")) {
    if (std::fscanf(f, "%lf", &load) != 1) load = -1;
    std::fclose(f);
  }
  return load;
}

int Main() {
  const std::string dims = absl::GetFlag(FLAGS_dims);
  const std::string model_dir = absl::GetFlag(FLAGS_model_dir);
  const int chunk = absl::GetFlag(FLAGS_chunk);
  model::cpu::ThreadPool pool(absl::GetFlag(FLAGS_threads) > 0
                                  ? absl::GetFlag(FLAGS_threads)
                                  : model::cpu::ThreadPool::DefaultThreads());
  TextConfig cfg;
  std::unique_ptr<model::SafetensorsCheckpoint> ckpt;
  std::string tokenizer_path = absl::GetFlag(FLAGS_tokenizer);
  if (!dims.empty()) {
    CHECK(NamedTextDims(dims, &cfg)) << "unknown --dims " << dims;
    if (absl::GetFlag(FLAGS_layers) > 0) cfg.num_hidden_layers = absl::GetFlag(FLAGS_layers);
  } else {
    auto c = model::LoadModelConfig(model_dir);
    CHECK_OK(c.status());
    cfg = c->text;
    auto opened = model::SafetensorsCheckpoint::Open(model_dir);
    CHECK_OK(opened.status());
    ckpt = std::move(opened).value();
    tokenizer_path = model_dir + "/tokenizer.json";
  }
  auto tok = model::Tokenizer::FromFile(tokenizer_path);
  CHECK_OK(tok.status());
  auto text = ReadFileToString(absl::GetFlag(FLAGS_corpus));
  CHECK_OK(text.status());
  auto ids = (*tok)->Encode(*text);
  CHECK_OK(ids.status());
  std::vector<int32_t> tokens(
      ids->begin(), ids->begin() + std::min<size_t>(ids->size(), absl::GetFlag(FLAGS_tokens)));
  CHECK(tokens.size() >= 2) << "corpus too short";
  const int score_from = absl::GetFlag(FLAGS_score_from);
  CHECK(score_from >= 0 && score_from < chunk - 1)
      << "--score_from=" << score_from << ": must be in [0, --chunk - 1)";
  if (!absl::GetFlag(FLAGS_tokens_out).empty())
    WriteTokens(absl::GetFlag(FLAGS_tokens_out), tokens);
  std::unique_ptr<model::SafetensorsCheckpoint> bf16_ckpt;
  if (!absl::GetFlag(FLAGS_bf16_model_dir).empty()) {
    CHECK(ckpt != nullptr) << "--bf16_model_dir needs a checkpoint (not --dims)";
    auto opened = model::SafetensorsCheckpoint::Open(absl::GetFlag(FLAGS_bf16_model_dir));
    CHECK_OK(opened.status());
    bf16_ckpt = std::move(opened).value();
  }

  // The checkpoint's weights when given (its bf16 twin's for bf16 weights);
  // else random ones of `dtype`.
  auto load = [&](DType dtype, const std::string& quantize, bool bf16 = false) {
    auto options = model::ParseQuantize(quantize);
    CHECK_OK(options.status());
    if (ckpt == nullptr) return model::Qwen2Weights::Random(cfg, dtype, /*seed=*/7, *options);
    auto w = model::Qwen2Weights::Load(bf16 ? *bf16_ckpt : *ckpt, cfg, *options);
    CHECK_OK(w.status());
    return std::move(w).value();
  };
  const DType stored = ckpt == nullptr ? DType::kBF16 : load(DType::kF32, "")->layers()[0].q.dtype;
  CHECK(ckpt == nullptr || stored == DType::kF32)
      << "the reference needs fp32 weights; this checkpoint's are " << DTypeName(stored);
  const std::vector<Mode> modes = {
      {"bf16 weights, f32 act", DType::kBF16, "", LinearKernel::kDot, true},
      {"bf16 weights, bf16 act", DType::kBF16, "", LinearKernel::kBf16Dot, true},
      {"int8 weights, int16 act", DType::kBF16, "int8", LinearKernel::kDot, false},
      {"int8 weights, int8 act", DType::kBF16, "int8", LinearKernel::kInt8Act, false},
      {"int8_g32 weights, int16 act", DType::kBF16, "int8_g32", LinearKernel::kDot, false},
      {"int8_g32 weights, int8 act", DType::kBF16, "int8_g32", LinearKernel::kInt8Act, false},
      {"int4_g32 weights, int8 act", DType::kBF16, "int4_g32", LinearKernel::kInt8Act, false},
      {"int4_g32_zp weights, int8 act", DType::kBF16, "int4_g32_zp", LinearKernel::kInt8Act, false},
      {"int4_g128 weights, int8 act", DType::kBF16, "int4_g128", LinearKernel::kInt8Act, false},
      {"int4_g128_zp weights, int8 act", DType::kBF16, "int4_g128_zp", LinearKernel::kInt8Act,
       false},
  };

  std::vector<std::vector<float>> ref;
  {
    auto w = load(DType::kF32, "");
    ref = Logits(cfg, *w, tokens, chunk, score_from, LinearKernel::kDot, pool);
  }
  const Quality self = Compare(ref, ref, tokens, chunk, score_from);
  std::printf("quality of the precision modes: %s, %zu positions of %s, chunks of %d\n\n",
              dims.empty() ? model_dir.c_str() : dims.c_str(), ref.size(),
              absl::GetFlag(FLAGS_corpus).c_str(), chunk);
  std::printf("%-28s %12s %8s %12s %12s\n", "mode", "KL(ref||m)", "top-1", "perplexity",
              "max|dlogit|");
  std::printf("%-28s %12.3g %7.2f%% %12.3f %12.3g\n", "fp32 (reference)", 0.0, 100.0, self.ppl,
              0.0);
  std::string json = absl::StrFormat(
      "{\"bench\":\"quality\",\"model\":\"%s\",\"tokens\":%zu,\"chunk\":%d,\"score_from\":%d,"
      "\"positions\":%zu,\"reference_perplexity\":%.4f,\"modes\":[",
      dims.empty() ? model_dir : dims, tokens.size(), chunk, score_from, ref.size(), self.ppl);
  bool first = true;
  for (const Mode& mode : modes) {
    // An fp32 checkpoint has no bf16 weights (unless --bf16_model_dir); its
    // quantized modes quantize from fp32.
    if (mode.bf16_weights && ckpt != nullptr && bf16_ckpt == nullptr) continue;
    auto w = load(mode.dtype, mode.quantize, mode.bf16_weights);
    const Quality q = Compare(ref, Logits(cfg, *w, tokens, chunk, score_from, mode.kernel, pool),
                              tokens, chunk, score_from);
    std::printf("%-28s %12.3g %7.2f%% %12.3f %12.3g\n", mode.name.c_str(), q.kl, 100 * q.top1,
                q.ppl, q.max_dlogit);
    absl::StrAppendFormat(&json,
                          "%s{\"mode\":\"%s\",\"kld\":%.6g,\"top1\":%.5f,\"ppl\":%.4f,"
                          "\"max_dlogit\":%.4g}",
                          first ? "" : ",", mode.name, q.kl, q.top1, q.ppl, q.max_dlogit);
    first = false;
  }
  absl::StrAppendFormat(&json, "],\"loadavg\":%.2f}", LoadAverage());
  std::printf("\n%s\n", json.c_str());
  return 0;
}

}  // namespace
}  // namespace mmserve

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return mmserve::Main();
}
