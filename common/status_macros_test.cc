#include "common/status_macros.h"

#include <catch2/catch.hpp>
#include <memory>
#include <string>

namespace mmserve {
namespace {

absl::Status FailIfNegative(int x) {
  if (x < 0) return absl::InvalidArgumentError("negative");
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<int>> MakeBoxed(int x) {
  if (x < 0) return absl::OutOfRangeError("negative box");
  return std::make_unique<int>(x);
}

int calls = 0;
absl::Status CountedCall() {
  ++calls;
  return absl::OkStatus();
}

absl::Status Chain(int x, int* out) {
  RETURN_IF_ERROR(FailIfNegative(x));
  ASSIGN_OR_RETURN(auto boxed, MakeBoxed(x * 2));
  *out = *boxed;
  return absl::OkStatus();
}

absl::StatusOr<int> AssignExisting(int x) {
  std::unique_ptr<int> boxed;
  ASSIGN_OR_RETURN(boxed, MakeBoxed(x));
  ASSIGN_OR_RETURN(boxed, MakeBoxed(*boxed - 10));
  return *boxed;
}

TEST_CASE("RETURN_IF_ERROR returns the first error and passes OK through", "[status]") {
  int out = 0;
  REQUIRE(Chain(3, &out).ok());
  CHECK(out == 6);
  absl::Status s = Chain(-1, &out);
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(s.message() == "negative");
}

TEST_CASE("RETURN_IF_ERROR evaluates its argument exactly once", "[status]") {
  calls = 0;
  auto f = []() -> absl::Status {
    RETURN_IF_ERROR(CountedCall());
    return absl::OkStatus();
  };
  REQUIRE(f().ok());
  CHECK(calls == 1);
}

TEST_CASE("ASSIGN_OR_RETURN moves move-only values and propagates errors", "[status]") {
  auto ok = AssignExisting(15);
  REQUIRE(ok.ok());
  CHECK(*ok == 5);
  auto bad = AssignExisting(5);
  CHECK(bad.status().code() == absl::StatusCode::kOutOfRange);
  CHECK(bad.status().message() == "negative box");
}

}  // namespace
}  // namespace mmserve
