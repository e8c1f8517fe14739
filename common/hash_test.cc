#include "common/hash.h"

#include <catch2/catch.hpp>
#include <set>
#include <string>

#include "absl/container/flat_hash_set.h"

namespace mmserve {
namespace {

TEST_CASE("HashBytes is deterministic and content-sensitive", "[hash]") {
  std::string a = "an image's bytes";
  std::string b = a;
  b[3] ^= 1;
  CHECK(HashBytes(a) == HashBytes(std::string(a)));
  CHECK(HashBytes(a) != HashBytes(b));
  CHECK(HashBytes("") != HashBytes(std::string(1, '\0')));
}

TEST_CASE("ContentHash prints 32 lowercase hex digits", "[hash]") {
  ContentHash h{0x0123456789abcdefULL, 0xfedcba9876543210ULL};
  CHECK(h.ToHex() == "0123456789abcdeffedcba9876543210");
}

TEST_CASE("XXH3 known-answer: empty input", "[hash]") {
  // Published XXH3_64bits("") with seed 0.
  CHECK(Hash64("", 0, 0) == 0x2D06800538D394C2ULL);
}

TEST_CASE("Hash64 depends on the seed and HashCombine on the order", "[hash]") {
  uint32_t tokens[4] = {1, 2, 3, 4};
  CHECK(Hash64(tokens, sizeof(tokens), 1) != Hash64(tokens, sizeof(tokens), 2));
  CHECK(HashCombine(1, 2) != HashCombine(2, 1));
}

TEST_CASE("ContentHash works as an absl hash-set key", "[hash]") {
  absl::flat_hash_set<ContentHash> set;
  for (int i = 0; i < 1000; ++i) set.insert(HashBytes(std::to_string(i)));
  CHECK(set.size() == 1000);
  CHECK(set.contains(HashBytes("999")));
  CHECK_FALSE(set.contains(HashBytes("1000")));
}

}  // namespace
}  // namespace mmserve
