// loadgen: a load generator for one mmserve service at a time, in the style
// of `vllm bench serve`. Arrivals are Poisson at --request_rate (or as fast
// as --max_concurrency allows), bounded by --num_requests and --duration_s.
// Reports TTFT, TPOT, ITL and E2E mean/p50/p90/p99, throughput, errors by
// gRPC code and goodput under --slo_ttft_ms / --slo_tpot_ms (the encoder
// target: Encode latency and the sink's bytes/s instead of the token
// metrics): a human table, then one JSON line (last).
//
//   bazel build --config=opt //bench/loadgen:loadgen
//   # end to end through the router, the demo questions, 20 req/s:
//   bazel-bin/bench/loadgen/loadgen --target=router --address=127.0.0.1:50051
//       --num_requests=200 --request_rate=20
//   # synthetic multimodal: 2 images of 448x448, half of them repeats:
//   ... --dataset=synthetic --images=2 --image_width=448 --image_height=448
//       --prompt_tokens=64 --output_tokens=32 --repeat_share=0.5
//   # multi-turn chats: 8 conversations of 4 turns over the same image, 1 s
//   # of think time; the JSON adds the later turns' TTFT and goodput:
//   ... --dataset=synthetic --turns=4 --think_time_s=1 --num_requests=32
//   # the OpenAI HTTP API (streamed), or a language instance directly (text):
//   ... --target=http --address=127.0.0.1:8000
//   ... --target=language --address=127.0.0.1:50071 --dataset=synthetic --images=0
//   # one encoder: Encode, the embeddings over UCX into loadgen's own sink
//   # (--model_dir names the model, for its hidden size; --profile the
//   # encoder's transport profile):
//   ... --target=encoder --address=127.0.0.1:50061 --model_dir=models/shapes-demo
//
// Checks (exit status 1 when one fails and --fail_on_error):
//   --check=answers    demo answers against eval.json's expected answers
//                      (accuracy reported);
//   --check=inprocess  every demo answer (text, and token ids over gRPC)
//                      identical to the in-process engine's;
//   --leak_ports=P,... after the run, every block and live-request gauge on
//                      those 127.0.0.1 /metrics ports must settle at 0 (and,
//                      with the encoder target, the sink's blocks and
//                      transfers).
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "bench/loadgen/runner.h"
#include "bench/loadgen/stats.h"
#include "bench/loadgen/target.h"
#include "bench/loadgen/workload.h"
#include "common/clock.h"
#include "model/model_config.h"
#include "tests/stack_harness.h"

ABSL_FLAG(std::string, target, "router", "router | language | http | encoder");
ABSL_FLAG(std::string, address, "127.0.0.1:50051", "the target's host:port");
ABSL_FLAG(std::string, dataset, "demo", "demo | synthetic");
ABSL_FLAG(std::string, eval_dir, "", "demo evaluation set (default: the bundled one)");
ABSL_FLAG(int, num_requests, 200, "requests to send (at most)");
ABSL_FLAG(double, request_rate, 0, "Poisson arrivals per second (0: no pacing)");
ABSL_FLAG(int, max_concurrency, 0, "requests in flight at most (0: no cap)");
ABSL_FLAG(double, duration_s, 0, "stop sending after this many seconds (0: no limit)");
ABSL_FLAG(int, warmup, 0, "requests sent one at a time before the run, not counted");
ABSL_FLAG(int, images, 1, "synthetic: images per request");
ABSL_FLAG(int, image_width, 224, "synthetic: image width");
ABSL_FLAG(int, image_height, 224, "synthetic: image height");
ABSL_FLAG(int, prompt_tokens, 32, "synthetic: prompt words (about one token each)");
ABSL_FLAG(std::vector<std::string>, prompt_tokens_mix, {},
          "synthetic: prompt words drawn uniformly per request from these (e.g. 32,512,1900; "
          "replaces --prompt_tokens)");
ABSL_FLAG(int, output_tokens, 16, "synthetic: tokens generated (EOS ignored)");
ABSL_FLAG(double, repeat_share, 0, "synthetic: share of images repeating an earlier one");
ABSL_FLAG(int, turns, 1,
          "synthetic: > 1 sends conversations of this many turns over the same images "
          "(--request_rate: conversations per second)");
ABSL_FLAG(double, think_time_s, 0, "synthetic, --turns > 1: from a turn's end to the next turn");
ABSL_FLAG(uint64_t, seed, 1, "arrivals and synthetic data");
ABSL_FLAG(double, slo_ttft_ms, 1000, "goodput SLO on TTFT");
ABSL_FLAG(double, slo_tpot_ms, 100, "goodput SLO on TPOT");
ABSL_FLAG(double, slo_ttft_ms_per_prompt_token, 0,
          "> 0: a request's TTFT SLO is max(slo_ttft_ms, this x its prompt tokens)");
ABSL_FLAG(double, timeout_s, 60, "per-request deadline");
ABSL_FLAG(std::string, check, "none", "none | answers | inprocess (demo dataset only)");
ABSL_FLAG(std::vector<std::string>, leak_ports, {},
          "127.0.0.1 /metrics ports whose block and live gauges must settle at 0");
ABSL_FLAG(bool, fail_on_error, false, "exit 1 on any error, wrong answer or leak");
ABSL_FLAG(std::string, label, "", "a label copied into the JSON line");
ABSL_FLAG(std::string, model_dir, "",
          "encoder target: the model (its hidden size sizes the sink; default the demo model)");
ABSL_FLAG(std::string, profile, "shm", "encoder target: the encoder's UCX profile (shm or tcp)");
ABSL_FLAG(int, sink_blocks, 256, "encoder target: the sink's embedding blocks (128 tokens each)");

namespace mmserve::loadgen {
namespace {

constexpr const char* kLeakGauges[] = {
    "mmserve_language_embedding_blocks_used", "mmserve_language_kv_blocks_used",
    "mmserve_language_requests_live", "mmserve_encoder_embedding_blocks_used",
    "mmserve_router_calls_live"};

// Sum of the leak gauges over `ports`, once zero or after 10 s.
double SettledLeaks(const std::vector<int>& ports, std::string* detail) {
  const Deadline deadline = Deadline::After(absl::Seconds(10));
  double total = 0;
  do {
    total = 0;
    detail->clear();
    for (int port : ports) {
      for (const char* gauge : kLeakGauges) {
        const double v = testing::ScrapeMetric(port, gauge);
        if (v > 0) {
          total += v;
          absl::StrAppend(detail, " :", port, " ", gauge, "=", v);
        }
      }
    }
    if (total == 0) return 0;
    absl::SleepFor(absl::Milliseconds(200));
  } while (!deadline.Expired());
  return total;
}

// The workload from the flags; false (after a message) on a bad entry.
bool SpecFromFlags(WorkloadSpec& spec) {
  spec.dataset = absl::GetFlag(FLAGS_dataset);
  spec.num_requests = absl::GetFlag(FLAGS_num_requests) + absl::GetFlag(FLAGS_warmup);
  spec.eval_dir =
      absl::GetFlag(FLAGS_eval_dir).empty() ? testing::EvalDir() : absl::GetFlag(FLAGS_eval_dir);
  spec.images = absl::GetFlag(FLAGS_images);
  spec.image_width = absl::GetFlag(FLAGS_image_width);
  spec.image_height = absl::GetFlag(FLAGS_image_height);
  spec.prompt_tokens = absl::GetFlag(FLAGS_prompt_tokens);
  for (const std::string& n : absl::GetFlag(FLAGS_prompt_tokens_mix)) {
    if (!absl::SimpleAtoi(n, &spec.prompt_tokens_mix.emplace_back())) {
      std::fprintf(stderr, "loadgen: bad --prompt_tokens_mix entry '%s'\n", n.c_str());
      return false;
    }
  }
  spec.output_tokens = absl::GetFlag(FLAGS_output_tokens);
  spec.repeat_share = absl::GetFlag(FLAGS_repeat_share);
  spec.turns = absl::GetFlag(FLAGS_turns);
  spec.think_time_s = absl::GetFlag(FLAGS_think_time_s);
  // A conversation's warm-up is its every turn.
  spec.num_requests += absl::GetFlag(FLAGS_warmup) * (std::max(1, spec.turns) - 1);
  spec.seed = absl::GetFlag(FLAGS_seed);
  return true;
}

int Main() {
  WorkloadSpec spec;
  if (!SpecFromFlags(spec)) return 2;
  const std::string check = absl::GetFlag(FLAGS_check);
  if (check != "none" && check != "answers" && check != "inprocess") {
    std::fprintf(stderr, "loadgen: --check must be none, answers or inprocess\n");
    return 2;
  }
  if (check != "none" && absl::GetFlag(FLAGS_target) == "encoder") {
    std::fprintf(stderr, "loadgen: the encoder target generates no answers to --check\n");
    return 2;
  }
  if (check != "none" && spec.dataset != "demo") {
    std::fprintf(stderr, "loadgen: --check needs --dataset=demo\n");
    return 2;
  }
  std::vector<int> leak_ports;
  for (const std::string& p : absl::GetFlag(FLAGS_leak_ports)) {
    int port = 0;
    if (!absl::SimpleAtoi(p, &port) || port <= 0 || port > 65535) {
      std::fprintf(stderr, "loadgen: bad --leak_ports entry '%s'\n", p.c_str());
      return 2;
    }
    leak_ports.push_back(port);
  }
  auto workload = BuildWorkload(spec);
  if (!workload.ok()) {
    std::fprintf(stderr, "loadgen: %s\n", workload.status().ToString().c_str());
    return 2;
  }
  Stopwatch clock;
  TargetOptions to;
  to.kind = absl::GetFlag(FLAGS_target);
  to.address = absl::GetFlag(FLAGS_address);
  to.timeout = absl::Seconds(absl::GetFlag(FLAGS_timeout_s));
  if (to.kind == "encoder") {
    const std::string model_dir = absl::GetFlag(FLAGS_model_dir).empty()
                                      ? testing::DemoModelDir()
                                      : absl::GetFlag(FLAGS_model_dir);
    auto config = model::LoadModelConfig(model_dir);
    if (!config.ok()) {
      std::fprintf(stderr, "loadgen: %s\n", config.status().ToString().c_str());
      return 2;
    }
    if (absl::GetFlag(FLAGS_sink_blocks) < 1) {
      std::fprintf(stderr, "loadgen: --sink_blocks must be >= 1\n");
      return 2;
    }
    to.hidden_size = static_cast<uint32_t>(config->text.hidden_size);
    to.profile = absl::GetFlag(FLAGS_profile);
    to.sink_blocks = static_cast<uint32_t>(absl::GetFlag(FLAGS_sink_blocks));
  }
  auto target = MakeTarget(to, &clock);
  if (!target.ok()) {
    std::fprintf(stderr, "loadgen: %s\n", target.status().ToString().c_str());
    return 2;
  }

  if (absl::Status c = (*target)->Connect(absl::Seconds(10)); !c.ok()) {
    std::fprintf(stderr, "loadgen: %s (running anyway: the errors are counted)\n",
                 c.ToString().c_str());
  }
  // Warm-up: the first items (conversations), one at a time, not counted.
  const int warmup = std::min<int>(absl::GetFlag(FLAGS_warmup) * workload->turns,
                                   static_cast<int>(workload->items.size()));
  Workload warm;
  warm.items.assign(workload->items.begin(), workload->items.begin() + warmup);
  workload->items.erase(workload->items.begin(), workload->items.begin() + warmup);
  RunLoad(**target, warm, {.max_concurrency = 1}, clock);

  RunOptions ro;
  ro.request_rate = absl::GetFlag(FLAGS_request_rate);
  ro.max_concurrency = absl::GetFlag(FLAGS_max_concurrency);
  if (absl::GetFlag(FLAGS_duration_s) > 0) {
    ro.max_duration = absl::Seconds(absl::GetFlag(FLAGS_duration_s));
  }
  ro.seed = spec.seed;
  // Scripts that act during the load (fault tests) wait for this line.
  std::printf("loadgen: sending %zu requests\n", workload->items.size());
  std::fflush(stdout);
  std::vector<Record> records = workload->turns > 1
                                    ? RunConversations(**target, *workload, ro, clock)
                                    : RunLoad(**target, *workload, ro, clock);
  for (Record& r : records) r.prompt_tokens = workload->items[r.item].prompt_tokens;
  const Slo slo{absl::GetFlag(FLAGS_slo_ttft_ms), absl::GetFlag(FLAGS_slo_tpot_ms),
                absl::GetFlag(FLAGS_slo_ttft_ms_per_prompt_token)};
  const Summary summary = Summarize(records, slo);

  std::vector<std::pair<std::string, std::string>> extra = {
      {"label", absl::StrCat("\"", absl::GetFlag(FLAGS_label), "\"")},
      {"target", absl::StrCat("\"", to.kind, "\"")},
      {"dataset", absl::StrCat("\"", spec.dataset, "\"")},
      {"request_rate", absl::StrCat(ro.request_rate)},
      {"max_concurrency", absl::StrCat(ro.max_concurrency)}};
  if (spec.dataset == "synthetic") {
    extra.push_back({"images", absl::StrCat(spec.images)});
    extra.push_back(
        {"image_size", absl::StrCat("\"", spec.image_width, "x", spec.image_height, "\"")});
    extra.push_back({"prompt_tokens", absl::StrCat(spec.prompt_tokens)});
    if (!spec.prompt_tokens_mix.empty()) {
      extra.push_back({"prompt_tokens_mix",
                       absl::StrCat("[", absl::StrJoin(spec.prompt_tokens_mix, ","), "]")});
    }
    extra.push_back({"output_tokens", absl::StrCat(spec.output_tokens)});
    extra.push_back({"repeat_share", absl::StrCat(spec.repeat_share)});
  }
  if (workload->turns > 1) {
    // The turns after a conversation's first: what a cache of its prefix helps.
    std::vector<Record> later;
    for (const Record& r : records) {
      if (workload->items[r.item].turn > 0) later.push_back(r);
    }
    const Summary l = Summarize(later, slo);
    extra.push_back({"turns", absl::StrCat(workload->turns)});
    extra.push_back({"think_time_s", absl::StrCat(workload->think_time_s)});
    extra.push_back({"later_turns", absl::StrCat(l.requests)});
    extra.push_back({"later_ttft_p50_ms", absl::StrFormat("%.3f", l.ttft_ms.p50)});
    extra.push_back({"later_ttft_p99_ms", absl::StrFormat("%.3f", l.ttft_ms.p99)});
    extra.push_back({"later_slo_attainment", absl::StrFormat("%.4f", l.slo_attainment)});
    extra.push_back({"later_goodput", absl::StrFormat("%.4f", l.goodput)});
  }
  // Prompt tokens computed (not found in a KV cache), from the usage.
  int64_t prompt_tokens = 0, cached_prompt_tokens = 0;
  for (const Record& r : records) {
    if (r.usage_prompt_tokens < 0) continue;
    prompt_tokens += r.usage_prompt_tokens;
    cached_prompt_tokens += r.usage_cached_prompt_tokens;
  }
  extra.push_back({"usage_prompt_tokens", absl::StrCat(prompt_tokens)});
  extra.push_back({"usage_cached_prompt_tokens", absl::StrCat(cached_prompt_tokens)});
  bool failed = summary.ok != summary.requests;
  std::string first_error;
  for (const Record& r : records) {
    if (!r.status.ok()) {
      first_error = r.status.ToString();
      break;
    }
  }

  if (check != "none") {
    // demo_index of the first item: the warm-up took `warmup` items.
    int correct = 0, same = 0, checked = 0;
    const testing::Reference* ref = nullptr;
    if (check == "inprocess") {
      testing::DemoSet set = testing::LoadDemoSet(spec.eval_dir);
      int max_index = 0;
      for (const Record& r : records) {
        max_index = std::max(max_index, workload->items[r.item].demo_index);
      }
      ref = &testing::InProcess(set, max_index + 1);
    }
    std::string first_mismatch;
    for (const Record& r : records) {
      if (!r.status.ok()) continue;
      const int d = workload->items[r.item].demo_index;
      ++checked;
      if (absl::StripAsciiWhitespace(r.text) == workload->demo_answers[d]) ++correct;
      if (ref != nullptr) {
        const bool ids_ok = to.kind == "http" || r.token_ids == ref->ids[d];
        if (r.text == ref->text[d] && ids_ok) {
          ++same;
        } else if (first_mismatch.empty()) {
          first_mismatch =
              absl::StrFormat("question %d: got '%s', in-process '%s'", d, r.text, ref->text[d]);
        }
      }
    }
    const double accuracy = checked > 0 ? static_cast<double>(correct) / checked : 0;
    std::printf("answers: %d/%d correct (accuracy %.4f)\n", correct, checked, accuracy);
    extra.push_back({"accuracy", absl::StrFormat("%.4f", accuracy)});
    if (ref != nullptr) {
      std::printf("identical to the in-process engine: %d/%d%s%s\n", same, checked,
                  first_mismatch.empty() ? "" : "; first mismatch: ", first_mismatch.c_str());
      extra.push_back({"inprocess_identical", absl::StrCat(same)});
      extra.push_back({"checked", absl::StrCat(checked)});
      failed |= same != checked;
    }
  }
  if (!leak_ports.empty()) {
    std::string detail;
    const double leaked = SettledLeaks(leak_ports, &detail);
    std::printf("leaks after the run: %s\n", leaked == 0 ? "none" : detail.c_str());
    extra.push_back({"leaked", absl::StrCat(leaked)});
    failed |= leaked != 0;
  }
  if (to.kind == "encoder") {
    const absl::Status drained = (*target)->Drained(absl::Seconds(10));
    std::printf("sink after the run: %s\n",
                drained.ok() ? "every block free" : drained.ToString().c_str());
    extra.push_back({"sink_drained", drained.ok() ? "true" : "false"});
    failed |= !drained.ok();
  }
  if (!first_error.empty()) std::printf("first error: %s\n", first_error.c_str());
  std::printf("%s", FormatTable(summary, slo).c_str());
  std::printf("%s\n", FormatJson(summary, slo, extra).c_str());
  return failed && absl::GetFlag(FLAGS_fail_on_error) ? 1 : 0;
}

}  // namespace
}  // namespace mmserve::loadgen

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return mmserve::loadgen::Main();
}
