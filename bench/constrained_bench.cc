// Decode throughput of the engine with structured output against free
// text, in the same run: batches of 1 and 32 requests, each decoding
// --tokens tokens, constrained by a JSON schema whose output cannot end
// within them (so every step is masked) or free (ignore_eos), the two
// alternating run by run (their order swapped every round) so both see
// the same machine load; the median run of each is reported. Requests
// sample at temperature 1 with top-k 50 (--top_k).
//
// A realistic vocabulary matters here (the mask's cost grows with it), so
// the model is Qwen2-0.5B's width with Qwen2's real 151,643 tokens (and its
// special tokens at their ids; random weights):
//
//   python3 tools/make_random_qwen2.py --out /tmp/qwen2-4l --layers 4 \
//       --qwen_vocab grammar/testdata/qwen2_vocab.bin
//   bazel run -c opt //bench:constrained_bench -- --model_dir=/tmp/qwen2-4l
//
// Fewer layers than the real 24 keep it quick and make the forward shorter,
// so the mask has less time to hide in: a harder case. The model
// directory's QWEN_VOCAB note is printed (without it: the tokenizer as
// found). Decode throughput counts the tokens after every request of the
// run has its first one, over the time since.
//
// mask_hidden_fraction = 1 - (time sampling waited for masks after the
// forward) / (time computing masks, on the helper thread), over the
// constrained runs. Prints a human table, then one JSON line last.
#include <algorithm>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/clock.h"
#include "common/logging.h"
#include "worker/engine.h"

ABSL_FLAG(std::string, model_dir, "", "model directory (tools/make_random_qwen2.py)");
ABSL_FLAG(int, tokens, 32, "tokens each request decodes after its first");
ABSL_FLAG(int, rounds, 3, "alternations of constrained and free runs per batch size");
ABSL_FLAG(int, num_threads, 0, "forward threads (0: one per core)");
ABSL_FLAG(int, top_k, 50,
          "sampling's top-k (temperature 1); 0 sorts the whole row per token, which then "
          "dominates the step and is cheaper on a masked row than on a free one");

namespace mmserve {
namespace {

// Arrays of short strings, at least 500 of them: no output of a few dozen
// tokens completes it, so every step is masked (and the end is never
// allowed).
constexpr char kSchema[] =
    R"({"type": "object", "properties": {"notes": {"type": "array", "minItems": 500,
    "items": {"type": "string", "maxLength": 16}}, "done": {"type": "boolean"}},
    "required": ["notes", "done"], "additionalProperties": false})";

struct Run {
  double tok_s = 0;
  double mask_s = 0, wait_s = 0;
};

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

Run RunBatch(worker::LlmEngine& e, int batch, bool constrained, int tokens, int* serial) {
  std::map<std::string, int> generated;
  int with_first = 0;
  for (int i = 0; i < batch; ++i) {
    worker::EngineRequest r;
    r.id = absl::StrCat("r", (*serial)++);
    r.prompt = absl::StrCat("Question ", *serial, ": list what you see.\nAnswer:");
    r.sampling.temperature = 1.0f;
    r.sampling.top_k = absl::GetFlag(FLAGS_top_k);
    r.sampling.seed = static_cast<uint64_t>(*serial);
    r.sampling.max_tokens = tokens + 1;
    if (constrained) {
      r.sampling.constraint =
          grammar::ConstraintSpec{grammar::ConstraintSpec::Kind::kJsonSchema, kSchema};
    } else {
      r.sampling.ignore_eos = true;
      // Ids past the tokenizer (the embedding's padding rows) are never
      // sampled (a grammar never allows them either).
      for (int32_t t = e.tokenizer().vocab_size(); t < e.config().text.vocab_size; ++t) {
        r.sampling.logit_bias.push_back({t, -100.0f});
      }
    }
    const std::string id = r.id;
    absl::Status s = e.AddRequest(std::move(r), [&, id](const worker::StreamEvent& ev) {
      CHECK(ev.error.ok()) << ev.error;
      int& n = generated[id];
      if (n == 0 && !ev.token_ids.empty()) ++with_first;
      n += static_cast<int>(ev.token_ids.size());
    });
    CHECK(s.ok()) << s;
  }
  const double mask0 = e.grammar_mask_seconds(), wait0 = e.grammar_mask_wait_seconds();
  while (with_first < batch) {
    const absl::Status st = e.Step();
    CHECK(st.ok()) << st;
  }
  int first_tokens = 0;
  for (const auto& [id, n] : generated) first_tokens += n;
  Stopwatch clock;
  while (e.has_unfinished()) {
    const absl::Status st = e.Step();
    CHECK(st.ok()) << st;
  }
  const double seconds = clock.ElapsedSeconds();
  int total = 0;
  for (const auto& [id, n] : generated) total += n;
  CHECK(total == batch * (tokens + 1)) << "a request ended early: " << total;
  return {.tok_s = (total - first_tokens) / seconds,
          .mask_s = e.grammar_mask_seconds() - mask0,
          .wait_s = e.grammar_mask_wait_seconds() - wait0};
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int Main() {
  const std::string dir = absl::GetFlag(FLAGS_model_dir);
  CHECK(!dir.empty()) << "--model_dir is required (see the header comment)";
  worker::EngineOptions o;
  o.model_dir = dir;
  o.block_size = 16;
  o.max_num_seqs = 32;
  o.max_num_batched_tokens = 1024;
  o.kv_cache_bytes = int64_t{64} << 20;
  o.num_threads = absl::GetFlag(FLAGS_num_threads);
  o.load_vision = false;  // text only (the random model has no vision weights)
  auto created = worker::LlmEngine::Create(o);
  CHECK(created.ok()) << created.status();
  worker::LlmEngine& e = **created;
  const int vocab = e.config().text.vocab_size;
  const std::string note = ReadFile(dir + "/QWEN_VOCAB");
  absl::PrintF("model %s: %d layers, vocabulary %d (tokenizer %d ids)\n", dir,
               e.config().text.num_hidden_layers, vocab, e.tokenizer().vocab_size());
  absl::PrintF("vocabulary: %s\n", note.empty() ? "the model's tokenizer" : note);
  const int tokens = absl::GetFlag(FLAGS_tokens);
  int serial = 0;
  Stopwatch warm_up;
  RunBatch(e, 2, true, 4, &serial);  // warm-up: compiles the schema once
  absl::PrintF("warm-up (schema compiled, first masks): %.2f s\n", warm_up.ElapsedSeconds());
  std::map<std::pair<int, bool>, std::vector<double>> tok_s;
  double mask_s = 0, wait_s = 0;
  for (int round = 0; round < absl::GetFlag(FLAGS_rounds); ++round) {
    for (const int batch : {1, 32}) {
      for (const bool first : {true, false}) {
        const bool constrained = (round % 2 == 0) == first;
        const Run r = RunBatch(e, batch, constrained, tokens, &serial);
        tok_s[{batch, constrained}].push_back(r.tok_s);
        mask_s += r.mask_s;
        wait_s += r.wait_s;
        absl::PrintF("round %d batch %2d %-11s %8.1f tok/s  masks %7.1f ms, waited %6.1f ms\n",
                     round, batch, constrained ? "constrained" : "free", r.tok_s, r.mask_s * 1e3,
                     r.wait_s * 1e3);
      }
    }
  }
  const double b1c = Median(tok_s[{1, true}]), b1f = Median(tok_s[{1, false}]);
  const double b32c = Median(tok_s[{32, true}]), b32f = Median(tok_s[{32, false}]);
  const double hidden = mask_s > 0 ? 1 - wait_s / mask_s : 0;
  std::string load = ReadFile("/proc/loadavg");
  load = load.substr(0, load.find(' ', load.find(' ', load.find(' ') + 1) + 1));
  absl::PrintF("\n%-8s %14s %14s %8s\n", "batch", "constrained", "free", "ratio");
  absl::PrintF("%-8d %14.1f %14.1f %8.3f\n", 1, b1c, b1f, b1c / b1f);
  absl::PrintF("%-8d %14.1f %14.1f %8.3f\n", 32, b32c, b32f, b32c / b32f);
  absl::PrintF("masks: %.1f ms computed, %.1f ms waited for (%.1f%% hidden); load %s\n",
               mask_s * 1e3, wait_s * 1e3, hidden * 100, load);
  absl::PrintF(
      "{\"bench\":\"constrained\",\"layers\":%d,\"vocab\":%d,\"qwen_vocab\":%s,"
      "\"tokens\":%d,\"top_k\":%d,\"b1_constrained_tok_s\":%.1f,\"b1_free_tok_s\":%.1f,"
      "\"b32_constrained_tok_s\":%.1f,\"b32_free_tok_s\":%.1f,\"b1_constrained_vs_free\":%.3f,"
      "\"b32_constrained_vs_free\":%.3f,\"mask_seconds\":%.4f,\"mask_wait_seconds\":%.4f,"
      "\"mask_hidden_fraction\":%.3f,\"loadavg\":\"%s\"}\n",
      e.config().text.num_hidden_layers, vocab, note.empty() ? "false" : "true", tokens,
      absl::GetFlag(FLAGS_top_k), b1c, b1f, b32c, b32f, b1c / b1f, b32c / b32f, mask_s, wait_s,
      hidden, load);
  return 0;
}

}  // namespace
}  // namespace mmserve

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return mmserve::Main();
}
