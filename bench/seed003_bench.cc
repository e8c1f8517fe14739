// seed003_bench: the prefill-budget experiment (a prefill token budget, so that a
// long prompt cannot stall the decodes running beside it) on language
// service processes, through bench/loadgen's `language` target.
//
// Two language instances (role both, the same model and flags) are started
// side by side, one with --max_prefill_tokens=<budget> and one without; each
// round sends the same workload to both, one after the other, the order
// alternating between rounds (budget first in even rounds), so that both arms
// see the same machine load. The workload: --num_requests text requests, one
// every --interval_ms (fixed, not Poisson), prompts of the base prompt
// repeated --repeats times in turn (1,1,1,64: three short, one long),
// --output_tokens each (EOS ignored, greedy), at most --max_num_seqs running.
//
// The router and encoder are left out on purpose: the budget is a scheduler
// knob of the language instance, the workload is text only (no image goes
// through the encoder), and each extra process would share the same two
// cores and add its own noise to ITL. loadgen's language target calls the
// same Prefill stream the router calls.
//
// Reported per arm (records pooled over the rounds): TTFT, ITL, TPOT and E2E
// percentiles, output token throughput (output tokens over the summed
// first-send-to-last-end time of the arm's rounds); then the ratios, each no-budget /
// budget: itl_p99_ratio (> 1: the budget helps; target >= 1.3),
// ttft_p50_ratio, ttft_p99_ratio and throughput_ratio (target within 10% of
// 1), and how many answers were token-identical between the arms.
//
//   bazel build --config=opt //bench:seed003_bench
//   bazel-bin/bench/seed003_bench                       # the demo model
//   bazel-bin/bench/seed003_bench --model_dir=/models/Qwen2-0.5B-random
//
// Prints a human table, then one JSON line last.
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
#include "absl/strings/str_split.h"
#include "bench/loadgen/runner.h"
#include "bench/loadgen/stats.h"
#include "bench/loadgen/target.h"
#include "bench/loadgen/workload.h"
#include "common/clock.h"
#include "deploy/launcher/child_process.h"
#include "tests/stack_harness.h"

ABSL_FLAG(std::string, model_dir, "", "model directory (default: the bundled demo model)");
ABSL_FLAG(std::string, base_prompt,
          "Describe the picture and count every red shape you can see in it.",
          "the prompt that --repeats repeats");
ABSL_FLAG(std::vector<std::string>, repeats, std::vector<std::string>({"1", "1", "1", "64"}),
          "repeat counts of the base prompt, cycled per request");
ABSL_FLAG(int, num_requests, 32, "requests per arm and round");
ABSL_FLAG(double, interval_ms, 20, "fixed gap between two requests");
ABSL_FLAG(int, output_tokens, 32, "tokens generated per request (EOS ignored)");
ABSL_FLAG(int, max_num_seqs, 8, "the instances' --max_num_seqs (the seed's batch size)");
ABSL_FLAG(int, budget, 224, "--max_prefill_tokens of the budget arm");
ABSL_FLAG(int, max_num_batched_tokens, 2048, "both instances' step token budget");
ABSL_FLAG(bool, chunked_prefill, true,
          "both instances' --enable_chunked_prefill (off: the seed's whole-prompt admission)");
ABSL_FLAG(int, rounds, 6, "rounds; each runs both arms, the order alternating");
ABSL_FLAG(int, threads, 0, "the instances' --threads (0: one per core)");
ABSL_FLAG(int, kv_cache_mb, 256, "the instances' --kv_cache_mb");
ABSL_FLAG(double, timeout_s, 600, "per-request deadline");
ABSL_FLAG(std::string, label, "demo", "a label copied into the JSON line");
ABSL_FLAG(std::string, log_dir, "/tmp", "where the instances' stderr goes");

namespace mmserve::bench {
namespace {

using loadgen::Record;
using loadgen::Summary;

std::string LoadAverage() {
  std::ifstream f("/proc/loadavg");
  std::string one;
  f >> one;
  return one.empty() ? "0" : one;
}

struct Arm {
  std::string name;
  std::unique_ptr<launcher::ChildProcess> process;
  std::string address;
  std::vector<Record> records;            // pooled over rounds
  std::vector<std::vector<int32_t>> ids;  // first round's answers, by item
  // Summed over rounds: throughput is their ratio (the pooled records' span
  // would include the other arm's runs in between).
  int64_t output_tokens = 0;
  double busy_s = 0;
};

absl::Status StartArm(Arm& arm, int max_prefill_tokens) {
  const std::string model_dir = absl::GetFlag(FLAGS_model_dir).empty()
                                    ? testing::DemoModelDir()
                                    : absl::GetFlag(FLAGS_model_dir);
  launcher::ChildSpec spec;
  spec.name = arm.name;
  spec.binary = testing::RunfilesRoot() + "/language_service/language";
  spec.log = absl::StrCat(absl::GetFlag(FLAGS_log_dir), "/seed003_", arm.name, ".log");
  spec.args = {
      "--model_dir=" + model_dir,
      "--port=0",
      "--metrics_port=-1",
      "--instance_id=seed003-" + arm.name,
      absl::StrCat("--max_num_seqs=", absl::GetFlag(FLAGS_max_num_seqs)),
      absl::StrCat("--max_num_batched_tokens=", absl::GetFlag(FLAGS_max_num_batched_tokens)),
      absl::StrCat("--max_prefill_tokens=", max_prefill_tokens),
      absl::StrCat("--enable_chunked_prefill=",
                   absl::GetFlag(FLAGS_chunked_prefill) ? "true" : "false"),
      absl::StrCat("--kv_cache_mb=", absl::GetFlag(FLAGS_kv_cache_mb)),
      absl::StrCat("--threads=", absl::GetFlag(FLAGS_threads))};
  auto p = launcher::ChildProcess::Start(spec);
  if (!p.ok()) return p.status();
  arm.process = std::move(*p);
  auto ready = arm.process->WaitReady(absl::Seconds(300));
  if (!ready.ok()) return ready.status();
  arm.address = ready->fields["grpc"];
  return absl::OkStatus();
}

absl::StatusOr<loadgen::Workload> SeedWorkload() {
  std::vector<int> repeats;
  for (const std::string& r : absl::GetFlag(FLAGS_repeats)) {
    int n = 0;
    if (!absl::SimpleAtoi(r, &n) || n < 1) {
      return absl::InvalidArgumentError(absl::StrCat("bad --repeats entry '", r, "'"));
    }
    repeats.push_back(n);
  }
  if (repeats.empty()) return absl::InvalidArgumentError("--repeats is empty");
  if (absl::GetFlag(FLAGS_num_requests) < 1 || absl::GetFlag(FLAGS_output_tokens) < 1) {
    return absl::InvalidArgumentError("--num_requests and --output_tokens must be >= 1");
  }
  loadgen::Workload w;
  for (int i = 0; i < absl::GetFlag(FLAGS_num_requests); ++i) {
    loadgen::WorkItem item;
    std::vector<std::string> parts(repeats[i % repeats.size()], absl::GetFlag(FLAGS_base_prompt));
    // A number in front makes every prompt differ (no prefix-cache hits
    // between requests beyond the chat template's).
    item.text = absl::StrCat(i, " ", absl::StrJoin(parts, " "));
    item.max_tokens = absl::GetFlag(FLAGS_output_tokens);
    item.ignore_eos = true;
    w.items.push_back(std::move(item));
  }
  return w;
}

absl::Status RunArm(Arm& arm, const loadgen::Workload& w, const Stopwatch& clock, bool first) {
  auto target = loadgen::MakeTarget({.kind = "language",
                                     .address = arm.address,
                                     .timeout = absl::Seconds(absl::GetFlag(FLAGS_timeout_s))},
                                    &clock);
  if (!target.ok()) return target.status();
  if (absl::Status s = (*target)->Connect(absl::Seconds(10)); !s.ok()) return s;
  loadgen::RunOptions ro;
  ro.request_rate = 1000.0 / absl::GetFlag(FLAGS_interval_ms);
  ro.poisson = false;
  std::vector<Record> records = loadgen::RunLoad(**target, w, ro, clock);
  for (const Record& r : records) {
    if (!r.status.ok()) {
      return absl::Status(r.status.code(), absl::StrCat(arm.name, ": ", r.status.message()));
    }
  }
  if (first) {
    for (const Record& r : records) arm.ids.push_back(r.token_ids);
  }
  const Summary round = loadgen::Summarize(records, loadgen::Slo{});
  arm.output_tokens += round.output_tokens;
  arm.busy_s += round.duration_s;
  arm.records.insert(arm.records.end(), records.begin(), records.end());
  return absl::OkStatus();
}

double Ratio(double a, double b) { return b > 0 ? a / b : 0; }

int Main() {
  auto workload = SeedWorkload();
  if (!workload.ok()) {
    std::fprintf(stderr, "seed003_bench: %s\n", workload.status().ToString().c_str());
    return 2;
  }
  if (absl::GetFlag(FLAGS_budget) < 1 || absl::GetFlag(FLAGS_rounds) < 1 ||
      absl::GetFlag(FLAGS_interval_ms) <= 0) {
    std::fprintf(stderr, "seed003_bench: --budget, --rounds and --interval_ms must be > 0\n");
    return 2;
  }
  Arm budget{.name = "budget"}, none{.name = "none"};
  for (auto [arm, cap] : {std::pair{&budget, absl::GetFlag(FLAGS_budget)}, std::pair{&none, 0}}) {
    if (absl::Status s = StartArm(*arm, cap); !s.ok()) {
      std::fprintf(stderr, "seed003_bench: starting the %s instance: %s\n", arm->name.c_str(),
                   s.ToString().c_str());
      return 1;
    }
  }
  Stopwatch clock;
  // Warm-up: one long and one short request through each, not counted.
  {
    loadgen::Workload warm;
    for (size_t i = 0; i < std::min<size_t>(4, workload->items.size()); ++i) {
      warm.items.push_back(workload->items[i]);
    }
    for (Arm* arm : {&budget, &none}) {
      auto t = loadgen::MakeTarget({.kind = "language",
                                    .address = arm->address,
                                    .timeout = absl::Seconds(absl::GetFlag(FLAGS_timeout_s))},
                                   &clock);
      if (t.ok() && (*t)->Connect(absl::Seconds(10)).ok()) {
        loadgen::RunLoad(**t, warm, {.max_concurrency = 1}, clock);
      }
    }
  }
  const std::string load_before = LoadAverage();
  for (int round = 0; round < absl::GetFlag(FLAGS_rounds); ++round) {
    Arm* order[2] = {&budget, &none};
    if (round % 2 == 1) std::swap(order[0], order[1]);
    for (Arm* arm : order) {
      if (absl::Status s = RunArm(*arm, *workload, clock, round == 0); !s.ok()) {
        std::fprintf(stderr, "seed003_bench: round %d: %s\n", round, s.ToString().c_str());
        return 1;
      }
    }
  }
  const std::string load_after = LoadAverage();
  budget.process->Stop(absl::Seconds(10));
  none.process->Stop(absl::Seconds(10));

  const loadgen::Slo slo;
  Summary b = loadgen::Summarize(budget.records, slo);
  Summary n = loadgen::Summarize(none.records, slo);
  b.output_token_rate = budget.busy_s > 0 ? budget.output_tokens / budget.busy_s : 0;
  n.output_token_rate = none.busy_s > 0 ? none.output_tokens / none.busy_s : 0;
  int identical = 0;
  for (size_t i = 0; i < budget.ids.size() && i < none.ids.size(); ++i) {
    identical += budget.ids[i] == none.ids[i];
  }

  absl::PrintF(
      "prefill budget: %d requests every %.0f ms, prompts x{%s}, %d output tokens, max_num_seqs "
      "%d, "
      "chunked prefill %s, %d rounds (arms alternating); load average %s -> %s\n",
      absl::GetFlag(FLAGS_num_requests), absl::GetFlag(FLAGS_interval_ms),
      absl::StrJoin(absl::GetFlag(FLAGS_repeats), ","), absl::GetFlag(FLAGS_output_tokens),
      absl::GetFlag(FLAGS_max_num_seqs), absl::GetFlag(FLAGS_chunked_prefill) ? "on" : "off",
      absl::GetFlag(FLAGS_rounds), load_before, load_after);
  absl::PrintF("%-10s %10s %10s %10s %10s %10s %10s %12s\n", "arm", "ttft_p50", "ttft_p99",
               "itl_p50", "itl_p99", "tpot_p50", "e2e_p99", "tok/s");
  for (const auto& [name, s] :
       {std::pair{std::string("none"), n},
        std::pair{absl::StrCat("budget ", absl::GetFlag(FLAGS_budget)), b}}) {
    absl::PrintF("%-10s %8.1fms %8.1fms %8.1fms %8.1fms %8.1fms %8.1fms %12.1f\n", name,
                 s.ttft_ms.p50, s.ttft_ms.p99, s.itl_ms.p50, s.itl_ms.p99, s.tpot_ms.p50,
                 s.e2e_ms.p99, s.output_token_rate);
  }
  const double itl_p99_ratio = Ratio(n.itl_ms.p99, b.itl_ms.p99);
  const double ttft_p50_ratio = Ratio(n.ttft_ms.p50, b.ttft_ms.p50);
  const double ttft_p99_ratio = Ratio(n.ttft_ms.p99, b.ttft_ms.p99);
  const double throughput_ratio = Ratio(n.output_token_rate, b.output_token_rate);
  absl::PrintF(
      "no-budget / budget: ITL p99 %.2fx (target >= 1.3), TTFT p50 %.2fx, TTFT p99 %.2fx, "
      "throughput %.2fx (targets 0.9-1.1); token-identical answers %d/%zu\n",
      itl_p99_ratio, ttft_p50_ratio, ttft_p99_ratio, throughput_ratio, identical,
      budget.ids.size());
  absl::PrintF(
      "{\"bench\":\"seed003_bench\",\"label\":\"%s\",\"requests\":%d,\"interval_ms\":%g,"
      "\"repeats\":\"%s\",\"output_tokens\":%d,\"max_num_seqs\":%d,\"budget\":%d,"
      "\"chunked_prefill\":%s,\"rounds\":%d,\"load_before\":%s,\"load_after\":%s,"
      "\"none\":{\"ttft_p50_ms\":%.2f,\"ttft_p99_ms\":%.2f,\"itl_p50_ms\":%.2f,\"itl_p99_ms\":%.2f,"
      "\"tok_s\":%.2f},"
      "\"budget_arm\":{\"ttft_p50_ms\":%.2f,\"ttft_p99_ms\":%.2f,\"itl_p50_ms\":%.2f,"
      "\"itl_p99_ms\":%.2f,\"tok_s\":%.2f},"
      "\"identical\":%d,\"itl_p99_ratio\":%.3f,\"ttft_p50_ratio\":%.3f,\"ttft_p99_ratio\":%.3f,"
      "\"throughput_ratio\":%.3f}\n",
      absl::GetFlag(FLAGS_label), absl::GetFlag(FLAGS_num_requests),
      absl::GetFlag(FLAGS_interval_ms), absl::StrJoin(absl::GetFlag(FLAGS_repeats), ","),
      absl::GetFlag(FLAGS_output_tokens), absl::GetFlag(FLAGS_max_num_seqs),
      absl::GetFlag(FLAGS_budget), absl::GetFlag(FLAGS_chunked_prefill) ? "true" : "false",
      absl::GetFlag(FLAGS_rounds), load_before, load_after, n.ttft_ms.p50, n.ttft_ms.p99,
      n.itl_ms.p50, n.itl_ms.p99, n.output_token_rate, b.ttft_ms.p50, b.ttft_ms.p99, b.itl_ms.p50,
      b.itl_ms.p99, b.output_token_rate, identical, itl_p99_ratio, ttft_p50_ratio, ttft_p99_ratio,
      throughput_ratio);
  return 0;
}

}  // namespace
}  // namespace mmserve::bench

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return mmserve::bench::Main();
}
