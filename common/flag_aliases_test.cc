#include "common/flag_aliases.h"

#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "catch2/catch.hpp"

ABSL_FLAG(int, alias_test_new, 1, "the new name");
ABSL_FLAG(int, alias_test_old, 1, "deprecated: use --alias_test_new");

namespace mmserve {
namespace {

// Sets a flag as the command line would (ParseFrom marks it specified).
void Give(absl::string_view name, absl::string_view value) {
  std::string error;
  REQUIRE(absl::FindCommandLineFlag(name)->ParseFrom(value, &error));
}

TEST_CASE("an old flag name not given leaves the new flag alone", "[flag_aliases]") {
  absl::FlagSaver saver;
  REQUIRE(ApplyFlagAliases({{"alias_test_old", "alias_test_new"}}).ok());
  CHECK(absl::GetFlag(FLAGS_alias_test_new) == 1);
}

TEST_CASE("an old flag name sets the new flag", "[flag_aliases]") {
  absl::FlagSaver saver;
  Give("alias_test_old", "7");
  REQUIRE(ApplyFlagAliases({{"alias_test_old", "alias_test_new"}}).ok());
  CHECK(absl::GetFlag(FLAGS_alias_test_new) == 7);
}

TEST_CASE("both names with different values is an error naming both", "[flag_aliases]") {
  absl::FlagSaver saver;
  Give("alias_test_old", "7");
  Give("alias_test_new", "8");
  absl::Status s = ApplyFlagAliases({{"alias_test_old", "alias_test_new"}});
  REQUIRE(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(s.message().find("--alias_test_old=7") != absl::string_view::npos);
  CHECK(s.message().find("--alias_test_new=8") != absl::string_view::npos);
}

TEST_CASE("an alias to an undefined flag is refused", "[flag_aliases]") {
  CHECK(ApplyFlagAliases({{"alias_test_old", "no_such_flag"}}).code() ==
        absl::StatusCode::kInternal);
}

}  // namespace
}  // namespace mmserve
