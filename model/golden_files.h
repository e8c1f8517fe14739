// Test helpers for golden files under model/testdata (Catch2 tests only):
// a file's bytes (the test fails when it cannot be read), a golden JSON's
// "cases", and the XXH3-64 hashes the goldens record.
#ifndef MMSERVE_MODEL_GOLDEN_FILES_H_
#define MMSERVE_MODEL_GOLDEN_FILES_H_

#include <catch2/catch.hpp>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/file.h"
#include "common/hash.h"

namespace mmserve::model {

inline std::string ReadGoldenFile(const std::string& path) {
  auto bytes = ReadFileToString(path);
  INFO(path);
  REQUIRE(bytes.ok());
  return *bytes;
}

inline nlohmann::json GoldenCases(const std::string& path) {
  return nlohmann::json::parse(ReadGoldenFile(path))["cases"];
}

inline uint64_t HashOf(const std::vector<uint8_t>& v) { return Hash64(v.data(), v.size()); }
inline uint64_t HashOf(const std::vector<float>& v) {
  return Hash64(v.data(), v.size() * sizeof(float));
}

}  // namespace mmserve::model

#endif  // MMSERVE_MODEL_GOLDEN_FILES_H_
