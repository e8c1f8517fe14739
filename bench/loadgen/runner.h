// Drives a Target with a Workload: arrivals Poisson at `request_rate` (or
// evenly spaced, 1 / request_rate apart, when `poisson` is false; all at
// once when it is 0), at most `max_concurrency` in flight (0: no
// cap), stopping new sends after `max_duration`; waits for every sent
// request to finish.
//
//   Stopwatch clock;
//   std::vector<Record> records = RunLoad(*target, workload, {.request_rate = 20}, clock);
//
// Not thread-safe; one run at a time per target.
#ifndef MMSERVE_BENCH_LOADGEN_RUNNER_H_
#define MMSERVE_BENCH_LOADGEN_RUNNER_H_

#include <cstdint>
#include <vector>

#include "absl/time/time.h"
#include "bench/loadgen/stats.h"
#include "bench/loadgen/target.h"
#include "bench/loadgen/workload.h"
#include "common/clock.h"

namespace mmserve::loadgen {

struct RunOptions {
  double request_rate = 0;  // requests per second; 0: no pacing
  bool poisson = true;      // false: a fixed interval of 1 / request_rate
  int max_concurrency = 0;  // 0: no cap
  absl::Duration max_duration = absl::InfiniteDuration();
  uint64_t seed = 1;
};

// One Record per request sent, in send order.
std::vector<Record> RunLoad(Target& target, const Workload& workload, const RunOptions& options,
                            const Stopwatch& clock);

// A workload of conversations (workload.turns > 1): conversations start as
// RunLoad sends requests (request_rate is conversations per second), each
// sends its turns one after another, a turn workload.think_time_s after the
// turn before it ended (also when that one failed), and max_duration stops
// new conversations only. One Record per turn sent, in workload order.
std::vector<Record> RunConversations(Target& target, const Workload& workload,
                                     const RunOptions& options, const Stopwatch& clock);

}  // namespace mmserve::loadgen

#endif  // MMSERVE_BENCH_LOADGEN_RUNNER_H_
