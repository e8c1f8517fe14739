// generate: streams a completion from a model directory on the CPU.
//
//   bazel run --config=opt //cli:generate -- --model_dir=models/shapes-demo
//       --image=circle.png --prompt="What shape is this?"
//
// The prompt is wrapped in the model's chat format (one user turn, images
// first) unless --raw. Text streams to stdout as it is generated; a summary
// (token counts, time to first token, decode speed, finish reason) goes to
// stderr. Exit status 2 for bad input (with the reason), 1 for other errors.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/file.h"
#include "model/chat_template.h"
#include "model/cpu/cpu_isa_flag.h"
#include "model/image_decode.h"
#include "model/image_tokens.h"
#include "scheduler/request.h"
#include "worker/cli_args.h"
#include "worker/engine.h"

ABSL_FLAG(std::string, model_dir, "", "Hugging Face model directory (required)");
ABSL_FLAG(std::string, prompt, "", "the user's message (or the whole prompt with --raw)");
// Taken out of argv before absl parses it (cli_args.h): absl keeps only the
// last value of a repeated flag. Declared for --help.
ABSL_FLAG(std::string, image, "",
          "an image file; repeat the flag for more images (each value is one path, commas "
          "included)");
ABSL_FLAG(std::string, system, "", "system prompt (default: the model's)");
ABSL_FLAG(bool, raw, false, "use --prompt as is, without the chat format");
ABSL_FLAG(int, max_tokens, 128, "most tokens to generate");
ABSL_FLAG(double, temperature, 0.0, "0 = greedy");
ABSL_FLAG(double, top_p, 1.0, "nucleus sampling");
ABSL_FLAG(int, top_k, 0, "0 = off");
ABSL_FLAG(double, min_p, 0.0, "0 = off");
ABSL_FLAG(uint64_t, seed, 0, "sampling seed");
ABSL_FLAG(std::vector<std::string>, stop, {}, "stop strings");
ABSL_FLAG(bool, ignore_eos, false, "keep going past end-of-sequence");
ABSL_FLAG(int, kv_cache_mb, 0,
          "KV cache size in MiB (0: what max_num_seqs x max_model_len needs, capped by free "
          "memory)");
ABSL_FLAG(int, threads, 0, "compute threads (0: one per core)");
ABSL_FLAG(std::string, quantize, "",
          "quantize the language model's weights at load: int8 (one scale per output row), "
          "int8_g32 (one per 32 columns), or 4-bit int4_g32, int4_g128, int4_g32_zp, int4_g128_zp "
          "(groups of 32 or 128 columns, _zp with zero points; int8 activations)");
ABSL_FLAG(std::string, activation_dtype, "",
          "linear layers' activations: f32 (empty) or bf16 (rounded to bf16 at each bf16 "
          "layer, fp32 accumulation); not with --quantize");

namespace mmserve {
namespace {

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "generate: %s\n", s.ToString().c_str());
  return s.code() == absl::StatusCode::kInvalidArgument || s.code() == absl::StatusCode::kNotFound
             ? 2
             : 1;
}

absl::Status BadFlag(absl::string_view what) { return absl::InvalidArgumentError(what); }

// Flag values the engine would otherwise take silently or misread.
absl::Status CheckFlags() {
  if (absl::GetFlag(FLAGS_model_dir).empty()) return BadFlag("--model_dir is required");
  if (absl::GetFlag(FLAGS_threads) < 0) {
    return BadFlag(absl::StrCat("--threads=", absl::GetFlag(FLAGS_threads),
                                ": must be 0 (one per core) or a positive count"));
  }
  if (absl::GetFlag(FLAGS_kv_cache_mb) < 0) {
    return BadFlag(absl::StrCat("--kv_cache_mb=", absl::GetFlag(FLAGS_kv_cache_mb),
                                ": must be 0 (automatic) or a positive size"));
  }
  if (absl::GetFlag(FLAGS_max_tokens) <= 0) {
    return BadFlag(
        absl::StrCat("--max_tokens=", absl::GetFlag(FLAGS_max_tokens), ": must be positive"));
  }
  return absl::OkStatus();
}

// Reads, decodes and sizes one image; every error names the file.
absl::StatusOr<model::RgbImage> LoadImage(const std::string& path,
                                          const model::ModelConfig& config) {
  auto named = [&](const absl::Status& s) {
    return absl::Status(s.code(), absl::StrCat(path, ": ", s.message()));
  };
  auto bytes = ReadFileToString(path);
  if (!bytes.ok()) {
    std::string hint = path.find(',') != std::string::npos
                           ? " (each --image takes one path; repeat --image for more images)"
                           : "";
    return absl::Status(bytes.status().code(), absl::StrCat(bytes.status().message(), hint));
  }
  auto rgb = model::DecodeImage(*bytes, model::DecodeLimits());
  if (!rgb.ok()) return named(rgb.status());
  if (config.preprocessor) {
    model::ImageGridParams p;
    p.patch_size = config.preprocessor->patch_size;
    p.merge_size = config.preprocessor->merge_size;
    p.temporal_patch_size = config.preprocessor->temporal_patch_size;
    p.min_pixels = config.preprocessor->min_pixels;
    p.max_pixels = config.preprocessor->max_pixels;
    if (auto g = model::SmartResize(rgb->width, rgb->height, p); !g.ok()) return named(g.status());
  }
  return rgb;
}

int Main(const std::vector<std::string>& image_paths) {
  if (absl::Status s = CheckFlags(); !s.ok()) return Fail(s);
  worker::EngineOptions options;
  options.model_dir = absl::GetFlag(FLAGS_model_dir);
  options.kv_cache_bytes = static_cast<int64_t>(absl::GetFlag(FLAGS_kv_cache_mb)) << 20;
  options.num_threads = absl::GetFlag(FLAGS_threads);
  options.quantize = absl::GetFlag(FLAGS_quantize);
  options.activation_dtype = absl::GetFlag(FLAGS_activation_dtype);
  auto engine = worker::LlmEngine::Create(options);
  if (!engine.ok()) return Fail(engine.status());

  worker::EngineRequest req;
  req.id = "generate";
  std::vector<model::ChatPart> parts;
  for (const std::string& path : image_paths) {
    auto rgb = LoadImage(path, (*engine)->config());
    if (!rgb.ok()) return Fail(rgb.status());
    req.images.push_back(std::move(*rgb));
    parts.push_back({model::ChatPart::Kind::kImage, ""});
  }
  if (absl::GetFlag(FLAGS_raw)) {
    req.prompt = absl::GetFlag(FLAGS_prompt);
  } else {
    parts.push_back({model::ChatPart::Kind::kText, absl::GetFlag(FLAGS_prompt)});
    std::vector<model::ChatMessage> chat;
    if (!absl::GetFlag(FLAGS_system).empty()) {
      chat.push_back({"system", {{model::ChatPart::Kind::kText, absl::GetFlag(FLAGS_system)}}});
    }
    chat.push_back({"user", parts});
    auto family = model::ChatFamilyFor((*engine)->config().model_type);
    if (!family.ok()) return Fail(family.status());
    auto text = model::RenderChat(*family, chat, model::ChatOptions());
    if (!text.ok()) return Fail(text.status());
    req.prompt = *text;
  }
  req.sampling.max_tokens = absl::GetFlag(FLAGS_max_tokens);
  req.sampling.temperature = static_cast<float>(absl::GetFlag(FLAGS_temperature));
  req.sampling.top_p = static_cast<float>(absl::GetFlag(FLAGS_top_p));
  req.sampling.top_k = absl::GetFlag(FLAGS_top_k);
  req.sampling.min_p = static_cast<float>(absl::GetFlag(FLAGS_min_p));
  req.sampling.seed = absl::GetFlag(FLAGS_seed);
  req.sampling.stop = absl::GetFlag(FLAGS_stop);
  req.sampling.ignore_eos = absl::GetFlag(FLAGS_ignore_eos);

  Stopwatch clock;
  double ttft = -1;
  worker::StreamEvent last;
  auto on_event = [&](const worker::StreamEvent& e) {
    if (ttft < 0 && !e.token_ids.empty()) ttft = clock.ElapsedSeconds();
    std::fwrite(e.text.data(), 1, e.text.size(), stdout);
    std::fflush(stdout);
    if (e.finish_reason != worker::FinishReason::kNone) last = e;
  };
  if (absl::Status s = (*engine)->AddRequest(std::move(req), on_event); !s.ok()) return Fail(s);
  while ((*engine)->has_unfinished()) {
    if (absl::Status s = (*engine)->Step(); !s.ok()) return Fail(s);
  }
  const double total = clock.ElapsedSeconds();
  const int n = last.completion_tokens;
  std::fprintf(stderr,
               "\n[generate] prompt %d tokens, completion %d tokens, ttft %.1f ms, "
               "decode %.1f tok/s, finish %s\n",
               last.prompt_tokens, n, ttft * 1e3, n > 1 ? (n - 1) / (total - ttft) : 0.0,
               scheduler::FinishReasonName(last.finish_reason));
  return 0;
}

}  // namespace
}  // namespace mmserve

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("Streams a completion from a Hugging Face Qwen2-VL directory.");
  auto images = mmserve::worker::TakeRepeatedFlag(&argc, argv, "image");
  if (!images.ok()) return mmserve::Fail(images.status());
  absl::ParseCommandLine(argc, argv);
  if (absl::Status s = mmserve::model::cpu::ApplyCpuIsaFlag(); !s.ok()) return mmserve::Fail(s);
  return mmserve::Main(*images);
}
