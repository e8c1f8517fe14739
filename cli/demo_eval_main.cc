// demo_eval: exact-match accuracy of the demo model on its held-out set,
// through the C++ runtime (engine, tokenizer, image decode and preprocessing,
// vision tower), per question type; and, when transformers' answers are
// available (tools/demo/eval_hf.py --write-outputs), how often both runtimes
// give the same answer.
//
//   bazel run --config=opt //model:demo_eval
//   bazel run --config=opt //model:demo_eval -- --model_dir=... --eval_dir=...
//   bazel run --config=opt //model:demo_eval -- --quantize=int8
//   bazel run --config=opt //model:demo_eval -- --quantize=int8 --activation_dtype=int8
//
// With --quantize, the same questions run first on the weights as stored and
// the report adds the accuracy difference in points and how many answers are
// the same. --activation_dtype=int8 (with --quantize) runs the quantized
// layers on int8 activations (EngineOptions::activation_dtype,
// LinearKernel::kInt8Act).
// Every question is one request, all in flight together (continuous
// batching), greedy, at most 8 new tokens, ending at <|im_end|>. The answer is
// the decoded text without special tokens, surrounding whitespace stripped,
// as eval_hf.py does. Prints a table, then one JSON line.
#include <cstdio>
#include <cstdlib>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/clock.h"
#include "common/file.h"
#include "model/image_decode.h"
#include "worker/engine.h"

ABSL_FLAG(std::string, model_dir, "", "model directory (default: models/shapes-demo)");
ABSL_FLAG(std::string, eval_dir, "", "held-out set (default: tools/demo/eval_set)");
ABSL_FLAG(std::string, hf_outputs, "",
          "transformers' answers (default: <eval_dir>/hf_outputs.json when present)");
ABSL_FLAG(int, limit, 0, "evaluate only the first N questions (0: all)");
ABSL_FLAG(std::string, quantize, "",
          "quantize the language model and the vision tower at load: int8 or int8_g32 (then the "
          "weights as stored "
          "are evaluated too, as the baseline)");
ABSL_FLAG(std::string, activation_dtype, "",
          "activations of the quantized language model's layers: \"\" or f32 (int16 steps), "
          "int8 (needs --quantize)");

namespace mmserve {
namespace {

using nlohmann::json;

std::string InWorkspace(const std::string& flag, const char* fallback) {
  if (!flag.empty()) return flag;
  const char* ws = std::getenv("BUILD_WORKSPACE_DIRECTORY");
  return std::string(ws != nullptr ? ws : ".") + "/" + fallback;
}

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "demo_eval: %s\n", s.ToString().c_str());
  return 1;
}

struct Tally {
  int total = 0;
  int correct = 0;
  int agree = 0;     // same answer as transformers
  int compared = 0;  // questions transformers answered
};

struct Answers {
  std::map<int, std::string> text;
  std::map<int, std::vector<int32_t>> ids;
  double seconds = 0;
};

// Every question as one request, all in flight together; greedy.
absl::StatusOr<Answers> Evaluate(const worker::EngineOptions& options,
                                 const std::map<int, const json*>& items,
                                 const std::map<std::string, model::RgbImage>& images) {
  auto engine = worker::LlmEngine::Create(options);
  if (!engine.ok()) return engine.status();
  Answers out;
  for (const auto& [id, item] : items) {
    worker::EngineRequest req;
    req.id = absl::StrFormat("q%d", id);
    req.prompt = (*item)["prompt"];
    req.images.push_back(images.at((*item)["image"].get<std::string>()));
    req.sampling.temperature = 0;
    req.sampling.max_tokens = 8;
    auto on_event = [&out, id = id](const worker::StreamEvent& e) {
      out.text[id] += e.text;
      out.ids[id].insert(out.ids[id].end(), e.token_ids.begin(), e.token_ids.end());
    };
    if (absl::Status s = (*engine)->AddRequest(std::move(req), on_event); !s.ok()) return s;
  }
  Stopwatch clock;
  while ((*engine)->has_unfinished()) {
    if (absl::Status s = (*engine)->Step(); !s.ok()) return s;
  }
  out.seconds = clock.ElapsedSeconds();
  return out;
}

// transformers' answers (text and generated token ids) by item id, from
// --hf_outputs or <eval_dir>/hf_outputs.json; empty when absent.
struct HfAnswers {
  std::map<int, std::string> text;
  std::map<int, std::vector<int32_t>> ids;
};

HfAnswers ReadHfAnswers(const std::string& eval_dir) {
  HfAnswers hf;
  std::string hf_path = absl::GetFlag(FLAGS_hf_outputs);
  if (hf_path.empty()) hf_path = eval_dir + "/hf_outputs.json";
  if (auto hf_text = ReadFileToString(hf_path); hf_text.ok()) {
    const json h = json::parse(*hf_text, nullptr, false);
    const char* key = h.contains("outputs") ? "outputs" : "items";
    if (!h.is_discarded() && h.contains(key)) {
      for (const json& it : h[key]) {
        hf.text[it["id"].get<int>()] = it.value("text", "");
        if (it.contains("token_ids"))
          hf.ids[it["id"].get<int>()] = it["token_ids"].get<std::vector<int32_t>>();
      }
    }
  }
  return hf;
}

// The questions (the first --limit) and their decoded images.
absl::Status LoadQuestions(const json& eval, const std::string& eval_dir,
                           std::map<std::string, model::RgbImage>* images,
                           std::map<int, const json*>* items) {
  const int limit = absl::GetFlag(FLAGS_limit);
  for (const json& item : eval["items"]) {
    if (limit > 0 && static_cast<int>(items->size()) >= limit) break;
    const std::string file = item["image"];
    if (images->count(file) == 0) {
      auto bytes = ReadFileToString(eval_dir + "/" + file);
      if (!bytes.ok()) return bytes.status();
      auto rgb = model::DecodeImage(*bytes, model::DecodeLimits());
      if (!rgb.ok()) return rgb.status();
      (*images)[file] = std::move(*rgb);
    }
    (*items)[item["id"].get<int>()] = &item;
  }
  return absl::OkStatus();
}

struct Scores {
  std::map<std::string, Tally> by_type;
  Tally all;
  int baseline_correct = 0;  // with --quantize: the weights as stored
  int same_as_baseline = 0;
};

// `baseline`: null unless --quantize.
Scores Score(const std::map<int, const json*>& items, Answers& answers, Answers* baseline,
             const HfAnswers& hf) {
  Scores scores;
  for (const auto& [id, item] : items) {
    const std::string got(absl::StripAsciiWhitespace(answers.text.at(id)));
    const bool ok = got == (*item)["answer"].get<std::string>();
    if (baseline != nullptr) {
      const std::string plain(absl::StripAsciiWhitespace(baseline->text[id]));
      scores.baseline_correct += plain == (*item)["answer"].get<std::string>();
      scores.same_as_baseline += plain == got;
    }
    for (Tally* t : {&scores.by_type[(*item)["qtype"]], &scores.all}) {
      ++t->total;
      t->correct += ok;
      if (auto h = hf.text.find(id); h != hf.text.end()) {
        // Same answer text, and the same generated ids when transformers
        // recorded them.
        ++t->compared;
        auto ids = hf.ids.find(id);
        t->agree += std::string(absl::StripAsciiWhitespace(h->second)) == got &&
                    (ids == hf.ids.end() || ids->second == answers.ids[id]);
      }
    }
  }
  return scores;
}

// The table, then one JSON line. `baseline`: null unless --quantize.
void PrintReport(const Scores& s, size_t num_images, double seconds, const std::string& quantize,
                 bool int8_activations, const Answers* baseline) {
  const Tally& all = s.all;
  std::printf("%-12s %8s %9s %10s\n", "question", "items", "accuracy", "same_as_hf");
  std::vector<std::string> json_types;
  for (const auto& [type, t] : s.by_type) {
    std::printf("%-12s %8d %9.3f %10s\n", type.c_str(), t.total, double(t.correct) / t.total,
                t.compared ? absl::StrFormat("%.3f", double(t.agree) / t.compared).c_str() : "-");
    json_types.push_back(absl::StrFormat("\"%s\":%.4f", type, double(t.correct) / t.total));
  }
  std::printf(
      "%-12s %8d %9.3f %10s\n\n", "all", all.total, double(all.correct) / all.total,
      all.compared ? absl::StrFormat("%.3f", double(all.agree) / all.compared).c_str() : "-");
  std::string quant_json;
  if (baseline != nullptr) {
    const double base_acc = double(s.baseline_correct) / all.total;
    const double acc = double(all.correct) / all.total;
    std::printf(
        "--quantize=%s%s: accuracy %.3f vs %.3f with the weights as stored (%+.1f points), same "
        "answer on %d of %d\n\n",
        quantize.c_str(), int8_activations ? " --activation_dtype=int8" : "", acc, base_acc,
        100 * (acc - base_acc), s.same_as_baseline, all.total);
    quant_json = absl::StrFormat(
        ",\"quantize\":\"%s\",\"activation_dtype\":\"%s\",\"accuracy_unquantized\":%.4f,"
        "\"accuracy_delta_points\":%.2f,"
        "\"same_as_unquantized\":%.4f,\"seconds_unquantized\":%.1f",
        quantize, int8_activations ? "int8" : "f32", base_acc, 100 * (acc - base_acc),
        double(s.same_as_baseline) / all.total, baseline->seconds);
  }
  std::printf(
      "{\"eval\":\"shapes-demo\",\"images\":%zu,\"questions\":%d,\"accuracy\":%.4f,"
      "\"per_type\":{%s},\"hf_compared\":%d,\"hf_agreement\":%s,\"seconds\":%.1f%s}\n",
      num_images, all.total, double(all.correct) / all.total,
      absl::StrJoin(json_types, ",").c_str(), all.compared,
      all.compared ? absl::StrFormat("%.4f", double(all.agree) / all.compared).c_str() : "null",
      seconds, quant_json.c_str());
}

int Main() {
  const std::string model_dir = InWorkspace(absl::GetFlag(FLAGS_model_dir), "models/shapes-demo");
  const std::string eval_dir = InWorkspace(absl::GetFlag(FLAGS_eval_dir), "tools/demo/eval_set");
  auto eval_text = ReadFileToString(eval_dir + "/eval.json");
  if (!eval_text.ok()) return Fail(eval_text.status());
  const json eval = json::parse(*eval_text, nullptr, false);
  if (eval.is_discarded() || !eval.contains("items")) {
    return Fail(absl::InvalidArgumentError(eval_dir + "/eval.json: no \"items\""));
  }
  const HfAnswers hf = ReadHfAnswers(eval_dir);
  std::map<std::string, model::RgbImage> images;
  std::map<int, const json*> items;
  if (absl::Status s = LoadQuestions(eval, eval_dir, &images, &items); !s.ok()) return Fail(s);

  worker::EngineOptions options;
  options.model_dir = model_dir;
  options.max_num_seqs = 64;
  options.max_num_batched_tokens = 2048;
  options.kv_cache_bytes = 256ll << 20;
  options.quantize = absl::GetFlag(FLAGS_quantize);
  const bool quantized = !options.quantize.empty() && options.quantize != "none";
  const std::string activations = absl::GetFlag(FLAGS_activation_dtype);
  if (activations != "" && activations != "f32" && activations != "int8") {
    return Fail(absl::InvalidArgumentError("--activation_dtype takes f32 or int8"));
  }
  options.activation_dtype = activations;
  // With --quantize, the weights as stored are evaluated first, as the
  // baseline of the same run.
  Answers baseline;
  if (quantized) {
    worker::EngineOptions plain = options;
    plain.quantize = "";
    plain.activation_dtype = "";
    auto b = Evaluate(plain, items, images);
    if (!b.ok()) return Fail(b.status());
    baseline = std::move(*b);
  }
  auto evaluated = Evaluate(options, items, images);
  if (!evaluated.ok()) return Fail(evaluated.status());
  const Scores scores = Score(items, *evaluated, quantized ? &baseline : nullptr, hf);
  PrintReport(scores, images.size(), evaluated->seconds, options.quantize,
              options.activation_dtype == "int8", quantized ? &baseline : nullptr);
  return 0;
}

}  // namespace
}  // namespace mmserve

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return mmserve::Main();
}
