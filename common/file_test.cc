#include "common/file.h"

#include <catch2/catch.hpp>
#include <cstdlib>
#include <fstream>
#include <string>

namespace mmserve {
namespace {

TEST_CASE("ReadFileToString returns every byte, NUL included", "[file]") {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string path = std::string(tmp != nullptr ? tmp : "/tmp") + "/file_test.bin";
  const std::string bytes("a\0b\xff\n", 5);
  std::ofstream(path, std::ios::binary) << bytes;
  auto got = ReadFileToString(path);
  REQUIRE(got.ok());
  CHECK(*got == bytes);
}

TEST_CASE("a missing file is NOT_FOUND naming the path", "[file]") {
  auto got = ReadFileToString("/nonexistent/dir/x.json");
  CHECK(got.status().code() == absl::StatusCode::kNotFound);
  CHECK(got.status().message().find("/nonexistent/dir/x.json") != absl::string_view::npos);
}

TEST_CASE("ModelIdFromDir takes the directory's last component") {
  CHECK(ModelIdFromDir("/models/Qwen2-VL-2B") == "Qwen2-VL-2B");
  CHECK(ModelIdFromDir("/models/Qwen2-VL-2B//") == "Qwen2-VL-2B");
  CHECK(ModelIdFromDir("shapes-demo") == "shapes-demo");
  CHECK(ModelIdFromDir("/") == "/");
}

}  // namespace
}  // namespace mmserve
