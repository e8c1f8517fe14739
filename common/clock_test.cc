#include "common/clock.h"

#include <catch2/catch.hpp>

namespace mmserve {
namespace {

TEST_CASE("a zero deadline is already expired and has no time left", "[clock]") {
  Deadline d = Deadline::After(absl::ZeroDuration());
  CHECK(d.Expired());
  CHECK(d.Remaining() == absl::ZeroDuration());
}

TEST_CASE("Never() never expires and sorts after finite deadlines", "[clock]") {
  Deadline never = Deadline::Never();
  Deadline soon = Deadline::After(absl::Hours(1));
  CHECK_FALSE(never.Expired());
  CHECK(never.Remaining() == absl::InfiniteDuration());
  CHECK(soon < never);
  CHECK(Deadline::After(absl::InfiniteDuration()).IsNever());
  CHECK(soon.Remaining() > absl::Minutes(59));
}

TEST_CASE("the monotonic clock does not go backwards", "[clock]") {
  int64_t prev = MonotonicNanos();
  for (int i = 0; i < 10000; ++i) {
    int64_t now = MonotonicNanos();
    REQUIRE(now >= prev);
    prev = now;
  }
  Stopwatch sw;
  CHECK(sw.ElapsedNanos() >= 0);
}

}  // namespace
}  // namespace mmserve
