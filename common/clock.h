// Monotonic time helpers: a stopwatch for measurements and a Deadline that
// every transfer and RPC-facing wait carries.
//
//   Deadline d = Deadline::After(absl::Seconds(5));
//   while (!done) {
//     if (d.Expired()) return absl::DeadlineExceededError("transfer");
//     cv.WaitWithTimeout(&mu, d.Remaining());
//   }
//
// All functions are thread-safe; the classes are values (copyable, no locks).
#ifndef MMSERVE_COMMON_CLOCK_H_
#define MMSERVE_COMMON_CLOCK_H_

#include <chrono>
#include <cstdint>

#include "absl/time/time.h"

namespace mmserve {

// Nanoseconds on the monotonic clock (steady across wall-clock changes).
inline int64_t MonotonicNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

class Stopwatch {
 public:
  Stopwatch() : start_(MonotonicNanos()) {}
  void Reset() { start_ = MonotonicNanos(); }
  int64_t ElapsedNanos() const { return MonotonicNanos() - start_; }
  double ElapsedMicros() const { return ElapsedNanos() * 1e-3; }
  double ElapsedSeconds() const { return ElapsedNanos() * 1e-9; }

 private:
  int64_t start_;
};

// A point on the monotonic clock after which an operation gives up.
class Deadline {
 public:
  static Deadline After(absl::Duration d) {
    return Deadline(d == absl::InfiniteDuration() ? kNever
                                                  : MonotonicNanos() + absl::ToInt64Nanoseconds(d));
  }
  static Deadline Never() { return Deadline(kNever); }

  bool Expired() const { return at_ != kNever && MonotonicNanos() >= at_; }
  bool IsNever() const { return at_ == kNever; }
  // Time left, zero once expired, InfiniteDuration() for Never().
  absl::Duration Remaining() const {
    if (at_ == kNever) return absl::InfiniteDuration();
    int64_t left = at_ - MonotonicNanos();
    return left > 0 ? absl::Nanoseconds(left) : absl::ZeroDuration();
  }
  bool operator<(const Deadline& o) const { return at_ < o.at_; }

 private:
  static constexpr int64_t kNever = INT64_MAX;
  explicit Deadline(int64_t at) : at_(at) {}
  int64_t at_;
};

}  // namespace mmserve

#endif  // MMSERVE_COMMON_CLOCK_H_
