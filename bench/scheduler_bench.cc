// Step time of the scheduler (AddRequest for the step's arrivals + Schedule +
// UpdateFromOutput, i.e. schedule and bookkeeping, no model) with 64, 256 and
// 1024 running decode requests and a steady stream of arrivals: requests
// finish after 64..192 tokens and as many new ones (16..64-token prompts)
// arrive each step, so the running count stays near the target while new
// prompts are prefilled beside the decodes.
//
// Baseline, measured in the same run: a plain walk over the same number of
// heap-allocated requests doing the minimum a step must do per request (read
// its counters, append a token, write an output entry). The ratio
// step / baseline is what to compare across machines.
//
//   bazel run --config=opt //bench:scheduler_bench [-- steps]
//
// Prints a human table, then one JSON line last.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/clock.h"
#include "common/logging.h"
#include "scheduler/scheduler.h"

namespace mmserve {
namespace scheduler {
namespace {

constexpr int kBlockSize = 16;
constexpr int kMinPrompt = 16, kMaxPrompt = 64;
constexpr int kMinOutput = 64, kMaxOutput = 192;

struct Result {
  int target = 0;
  double p50_us = 0, p99_us = 0, baseline_p50_us = 0;
  double avg_running = 0, avg_tokens = 0, avg_prefill_tokens = 0;
  int64_t preemptions = 0;
};

double Percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(q * (v.size() - 1) + 0.5));
  return v[i];
}

class Workload {
 public:
  explicit Workload(uint64_t seed) : rng_(seed) {}

  RequestParams Next() {
    RequestParams p;
    p.id = RequestId{next_id_++};
    const int len = Int(kMinPrompt, kMaxPrompt);
    p.prompt_token_ids.resize(len);
    for (TokenId& t : p.prompt_token_ids) t = Int(0, 150000);
    p.max_tokens = Int(kMinOutput, kMaxOutput);
    p.ignore_eos = true;
    return p;
  }

 private:
  int Int(int lo, int hi) { return lo + static_cast<int>(rng_() % uint64_t(hi - lo + 1)); }
  std::mt19937_64 rng_;
  uint64_t next_id_ = 1;
};

std::unique_ptr<Scheduler> MakeScheduler(int target) {
  SchedulerConfig c;
  c.max_num_seqs = target;
  c.max_num_batched_tokens = target + 512;  // every decode + room for prefill chunks
  c.enable_chunked_prefill = true;
  c.kv.block_size = kBlockSize;
  // Enough KV for every running request at its longest, plus slack.
  c.kv.num_blocks = target * ((kMaxPrompt + kMaxOutput) / kBlockSize + 1) + 256;
  auto s = Scheduler::Create(c);
  CHECK(s.ok()) << s.status();
  return std::move(*s);
}

struct StepStats {
  double us = 0;  // scheduler calls only
  int num_tokens = 0;
  int num_prefill_tokens = 0;
};

// One engine step: the step's arrivals, Schedule, a fake model answering one
// token per entry (not timed), UpdateFromOutput.
StepStats Step(Scheduler& s, std::vector<RequestParams>& arrivals, std::vector<TokenId>& sampled,
               std::vector<std::unique_ptr<Request>>& finished) {
  StepStats st;
  Stopwatch timer;
  for (RequestParams& p : arrivals) CHECK_OK(s.AddRequest(std::move(p)));
  const SchedulerOutput& out = s.Schedule();
  st.us = timer.ElapsedMicros();
  st.num_tokens = out.num_batched_tokens;
  st.num_prefill_tokens = out.num_prefill_tokens;
  sampled.assign(out.scheduled.size(), /*token=*/1);
  timer.Reset();
  CHECK_OK(s.UpdateFromOutput(sampled, &finished));
  st.us += timer.ElapsedMicros();
  return st;
}

Result RunScheduler(int target, int steps) {
  Result r;
  r.target = target;
  std::unique_ptr<Scheduler> s = MakeScheduler(target);
  Workload w(/*seed=*/target);
  std::vector<RequestParams> arrivals;
  std::vector<TokenId> sampled;
  std::vector<std::unique_ptr<Request>> finished;
  // A small backlog keeps the running set full; afterwards one request
  // arrives for every one that finishes.
  for (int i = 0; i < target + 8; ++i) arrivals.push_back(w.Next());
  auto refill = [&] {
    arrivals.clear();
    for (size_t k = 0; k < finished.size(); ++k) arrivals.push_back(w.Next());
  };
  // Warm up past the initial prefill burst into a steady mix of lengths.
  for (int i = 0; i < 2 * kMaxOutput; ++i) {
    Step(*s, arrivals, sampled, finished);
    refill();
  }
  const int64_t preemptions_before = s->num_preemptions();
  std::vector<double> times;
  times.reserve(steps);
  for (int i = 0; i < steps; ++i) {
    const StepStats st = Step(*s, arrivals, sampled, finished);
    refill();
    times.push_back(st.us);
    r.avg_running += s->num_running();
    r.avg_tokens += st.num_tokens;
    r.avg_prefill_tokens += st.num_prefill_tokens;
  }
  r.avg_running /= steps;
  r.avg_tokens /= steps;
  r.avg_prefill_tokens /= steps;
  r.preemptions = s->num_preemptions() - preemptions_before;
  r.p50_us = Percentile(times, 0.5);
  r.p99_us = Percentile(times, 0.99);
  return r;
}

// The baseline's stand-in for a request: counters and a token vector on the
// heap, like a Request.
struct Touched {
  int num_computed = 0;
  std::vector<TokenId> tokens;
};
struct Entry {
  Touched* request;
  int num_tokens;
};

// Per-step time of the minimal walk over `n` requests.
double RunBaseline(int n, int steps) {
  std::vector<std::unique_ptr<Touched>> owned;
  std::vector<Touched*> walk;
  std::mt19937_64 rng(n);
  for (int i = 0; i < n; ++i) {
    owned.push_back(std::make_unique<Touched>());
    owned.back()->tokens.reserve(kMaxPrompt + kMaxOutput);
    owned.back()->tokens.resize(kMinPrompt);
    walk.push_back(owned.back().get());
  }
  std::shuffle(walk.begin(), walk.end(), rng);  // heap order, not walk order
  std::vector<Entry> out;
  out.reserve(n);
  std::vector<double> times;
  times.reserve(steps);
  for (int i = 0; i < steps; ++i) {
    Stopwatch timer;
    out.clear();
    for (Touched* t : walk) {
      const int n_tokens = static_cast<int>(t->tokens.size()) - t->num_computed;
      out.push_back({t, n_tokens});
    }
    for (const Entry& e : out) {
      e.request->num_computed += e.num_tokens;
      if (e.request->tokens.size() >= size_t(kMaxPrompt + kMaxOutput)) e.request->tokens.clear();
      e.request->tokens.push_back(1);
    }
    times.push_back(timer.ElapsedMicros());
    for (Touched* t : walk) t->num_computed = std::min<int>(t->num_computed, t->tokens.size() - 1);
  }
  return Percentile(times, 0.5);
}

std::string Join(const std::vector<double>& v) {
  return absl::StrJoin(
      v, ",", [](std::string* out, double x) { absl::StrAppend(out, absl::StrFormat("%.2f", x)); });
}

int Main(int argc, char** argv) {
  const int steps = argc > 1 ? std::max(100, std::atoi(argv[1])) : 3000;
  const std::vector<int> targets = {64, 256, 1024};
  std::vector<Result> results;
  for (int target : targets) {
    Result r = RunScheduler(target, steps);
    r.baseline_p50_us = RunBaseline(target, steps);
    results.push_back(r);
  }
  std::printf("scheduler step = AddRequest(arrivals) + Schedule + UpdateFromOutput, %d steps\n",
              steps);
  std::printf("%8s %10s %10s %12s %8s %10s %12s %10s %12s %8s\n", "running", "p50_us", "p99_us",
              "baseline_us", "ratio", "ns/req", "avg_running", "avg_tokens", "avg_prefill",
              "preempt");
  std::vector<double> p50, p99, base, ratio;
  for (const Result& r : results) {
    std::printf("%8d %10.2f %10.2f %12.2f %8.1f %10.1f %12.1f %10.1f %12.1f %8lld\n", r.target,
                r.p50_us, r.p99_us, r.baseline_p50_us, r.p50_us / r.baseline_p50_us,
                r.p50_us * 1e3 / r.target, r.avg_running, r.avg_tokens, r.avg_prefill_tokens,
                static_cast<long long>(r.preemptions));
    p50.push_back(r.p50_us);
    p99.push_back(r.p99_us);
    base.push_back(r.baseline_p50_us);
    ratio.push_back(r.p50_us / r.baseline_p50_us);
  }
  std::printf(
      "{\"bench\":\"scheduler\",\"running\":[64,256,1024],\"step_us_p50\":[%s],"
      "\"step_us_p99\":[%s],\"baseline_us\":[%s],\"ratio_p50\":[%s]}\n",
      Join(p50).c_str(), Join(p99).c_str(), Join(base).c_str(), Join(ratio).c_str());
  return 0;
}

}  // namespace
}  // namespace scheduler
}  // namespace mmserve

int main(int argc, char** argv) { return mmserve::scheduler::Main(argc, argv); }
