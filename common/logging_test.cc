#include "common/logging.h"

#include <catch2/catch.hpp>

namespace mmserve {
namespace {

TEST_CASE("LOG below the minimum level does not evaluate its stream", "[logging]") {
  SetMinLogLevel(LogSeverity::kError);
  int evaluated = 0;
  auto touch = [&] { return ++evaluated; };
  LOG(INFO) << touch();
  LOG(WARNING) << touch();
  CHECK(evaluated == 0);
  LOG(ERROR) << "logging_test: an expected error line " << touch();
  CHECK(evaluated == 1);
  SetMinLogLevel(LogSeverity::kInfo);
}

TEST_CASE("passing CHECKs do not evaluate their message", "[logging]") {
  int evaluated = 0;
  auto touch = [&] { return ++evaluated; };
  CHECK_EQ(2, 2) << touch();
  CHECK_LE(1, 2) << touch();
  REQUIRE(evaluated == 0);
}

}  // namespace
}  // namespace mmserve
