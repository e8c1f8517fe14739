#include "bench/loadgen/runner.h"

#include <algorithm>
#include <memory>
#include <random>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"

namespace mmserve::loadgen {
namespace {

struct Gate {
  const int* in_flight;
  int cap;
  bool Open() const { return *in_flight < cap; }
  bool Empty() const { return *in_flight == 0; }
};

// When each request (or conversation) starts: at options.request_rate, in a
// Poisson process or evenly spaced, at once when the rate is 0; none after
// options.max_duration.
class Arrivals {
 public:
  Arrivals(const RunOptions& options, const Stopwatch& clock)
      : options_(options),
        clock_(clock),
        rng_(options.seed),
        gap_(options.request_rate > 0 ? options.request_rate : 1),
        start_s_(clock.ElapsedSeconds()),
        next_s_(start_s_) {}

  // Sleeps until arrival `n` is due (the first is due at once).
  void Await(size_t n) {
    if (options_.request_rate <= 0) return;
    if (n > 0) next_s_ += options_.poisson ? gap_(rng_) : 1.0 / options_.request_rate;
    const double wait = next_s_ - clock_.ElapsedSeconds();
    if (wait > 0) absl::SleepFor(absl::Seconds(wait));
  }

  // Whether max_duration has passed since the first arrival.
  bool Over() const {
    return options_.max_duration != absl::InfiniteDuration() &&
           clock_.ElapsedSeconds() - start_s_ >= absl::ToDoubleSeconds(options_.max_duration);
  }

 private:
  const RunOptions& options_;
  const Stopwatch& clock_;
  std::mt19937_64 rng_;
  std::exponential_distribution<double> gap_;
  const double start_s_;
  double next_s_;
};

}  // namespace

std::vector<Record> RunLoad(Target& target, const Workload& workload, const RunOptions& options,
                            const Stopwatch& clock) {
  // Records never move once sending starts: callbacks hold pointers.
  std::vector<Record> records(workload.items.size());
  absl::Mutex mu;
  int in_flight = 0;  // guarded by mu
  const Gate gate{&in_flight, options.max_concurrency};
  Arrivals arrivals(options, clock);
  size_t sent = 0;
  for (; sent < workload.items.size(); ++sent) {
    arrivals.Await(sent);
    if (options.max_concurrency > 0) {
      absl::MutexLock lock(&mu);
      mu.Await(absl::Condition(&gate, &Gate::Open));
    }
    if (arrivals.Over()) break;
    Record& r = records[sent];
    r.item = static_cast<int>(sent);
    r.sent_s = clock.ElapsedSeconds();
    {
      absl::MutexLock lock(&mu);
      ++in_flight;
    }
    target.Send(workload.items[sent], &r, [&mu, &in_flight] {
      absl::MutexLock lock(&mu);
      --in_flight;
    });
  }
  {
    absl::MutexLock lock(&mu);
    mu.Await(absl::Condition(&gate, &Gate::Empty));
  }
  records.resize(sent);
  return records;
}

std::vector<Record> RunConversations(Target& target, const Workload& workload,
                                     const RunOptions& options, const Stopwatch& clock) {
  std::vector<Record> records(workload.items.size());
  const size_t turns = static_cast<size_t>(std::max(1, workload.turns));
  Arrivals arrivals(options, clock);
  // One thread per conversation: it sends a turn, waits for its end, thinks.
  std::vector<std::thread> conversations;
  std::vector<bool> sent(records.size(), false);
  for (size_t first = 0; first < workload.items.size(); first += turns) {
    arrivals.Await(first / turns);
    if (arrivals.Over()) break;
    const size_t last = std::min(first + turns, workload.items.size());
    for (size_t i = first; i < last; ++i) sent[i] = true;
    conversations.emplace_back([&, first, last] {
      for (size_t i = first; i < last; ++i) {
        if (i > first) absl::SleepFor(absl::Seconds(workload.think_time_s));
        Record& r = records[i];
        r.item = static_cast<int>(i);
        r.sent_s = clock.ElapsedSeconds();
        absl::Notification done;
        target.Send(workload.items[i], &r, [&done] { done.Notify(); });
        done.WaitForNotification();
      }
    });
  }
  for (std::thread& t : conversations) t.join();
  std::vector<Record> out;
  for (size_t i = 0; i < records.size(); ++i) {
    if (sent[i]) out.push_back(std::move(records[i]));
  }
  return out;
}

}  // namespace mmserve::loadgen
