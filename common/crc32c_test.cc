#include "common/crc32c.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <random>
#include <string>
#include <vector>

namespace mmserve {
namespace {

TEST_CASE("CRC32C matches the RFC 3720 check values", "[crc32c]") {
  CHECK(Crc32c("123456789", 9) == 0xE3069283u);
  std::vector<uint8_t> zeros(32, 0), ones(32, 0xff), inc(32);
  for (int i = 0; i < 32; ++i) inc[i] = static_cast<uint8_t>(i);
  CHECK(Crc32c(zeros.data(), 32) == 0x8A9136AAu);
  CHECK(Crc32c(ones.data(), 32) == 0x62A8AB43u);
  CHECK(Crc32c(inc.data(), 32) == 0x46DD794Eu);
  CHECK(Crc32c("", 0) == 0u);
}

TEST_CASE("Crc32cExtend over pieces equals one pass over the whole", "[crc32c]") {
  std::mt19937 rng(7);
  std::vector<uint8_t> buf(10007);
  for (auto& b : buf) b = static_cast<uint8_t>(rng());
  uint32_t whole = Crc32c(buf.data(), buf.size());
  for (size_t cut : {size_t{0}, size_t{1}, size_t{7}, size_t{8}, size_t{4096}, buf.size()}) {
    uint32_t crc = Crc32cExtend(0, buf.data(), cut);
    crc = Crc32cExtend(crc, buf.data() + cut, buf.size() - cut);
    CHECK(crc == whole);
  }
}

TEST_CASE("Crc32cCombine of two pieces' CRCs equals the CRC of both", "[crc32c]") {
  std::mt19937 rng(3);
  std::vector<uint8_t> buf(300000);
  for (auto& b : buf) b = static_cast<uint8_t>(rng());
  for (size_t cut : {size_t{0}, size_t{1}, size_t{4096}, size_t{123457}, buf.size()}) {
    INFO("cut " << cut);
    CHECK(Crc32cCombine(Crc32c(buf.data(), cut), Crc32c(buf.data() + cut, buf.size() - cut),
                        buf.size() - cut) == Crc32c(buf.data(), buf.size()));
  }
}

TEST_CASE("CRC32C detects a single flipped bit", "[crc32c]") {
  std::vector<uint8_t> buf(1 << 16, 0x5a);
  uint32_t before = Crc32c(buf.data(), buf.size());
  buf[12345] ^= 0x10;
  CHECK(Crc32c(buf.data(), buf.size()) != before);
}

// Bit at a time, straight from the definition.
uint32_t Reference(const uint8_t* p, size_t n, uint32_t crc = 0) {
  crc = ~crc;
  for (size_t i = 0; i < n; ++i) {
    crc ^= p[i];
    for (int k = 0; k < 8; ++k) crc = (crc & 1) ? (crc >> 1) ^ 0x82F63B78u : crc >> 1;
  }
  return ~crc;
}

TEST_CASE("CRC32C agrees with a bitwise reference at lengths around the stripe sizes", "[crc32c]") {
  auto reference = [](const uint8_t* p, size_t n) { return Reference(p, n); };
  std::mt19937 rng(11);
  std::vector<uint8_t> buf(3 * 4096 * 3 + 100);
  for (auto& b : buf) b = static_cast<uint8_t>(rng());
  for (size_t n : {size_t{12287}, size_t{12288}, size_t{12289}, size_t{24576 + 13}, buf.size()}) {
    CHECK(Crc32c(buf.data(), n) == reference(buf.data(), n));
    CHECK(Crc32cExtend(Crc32c(buf.data(), 5), buf.data() + 5, n - 5) == reference(buf.data(), n));
  }
}

TEST_CASE("Every CRC32C implementation this CPU has agrees with the reference", "[crc32c]") {
  // Lengths around the folding threshold (512) and block (128), the crc32
  // stripes (3 x 4096), unaligned starts, and a running CRC carried in.
  std::mt19937 rng(5);
  std::vector<uint8_t> buf(40000);
  for (auto& b : buf) b = static_cast<uint8_t>(rng());
  std::vector<size_t> lengths = {0,   1,   7,   8,   127, 128,  129,  511,  512,   513,  639,
                                 640, 641, 767, 768, 769, 1023, 1024, 1025, 12288, 12289};
  for (int i = 0; i < 40; ++i) lengths.push_back(rng() % 39000);
  int paths = 0;
  for (Crc32cPath path : {Crc32cPath::kPortable, Crc32cPath::kCrc32, Crc32cPath::kFold256}) {
    if (!Crc32cHasPath(path)) continue;
    ++paths;
    for (size_t n : lengths) {
      for (size_t offset : {size_t{0}, size_t{1}, size_t{13}}) {
        const uint8_t* p = buf.data() + offset;
        INFO("path " << static_cast<int>(path) << " length " << n << " offset " << offset);
        CHECK(Crc32cExtendWith(path, 0, p, n) == Reference(p, n));
        CHECK(Crc32cExtendWith(path, 0x12345678u, p, n) == Reference(p, n, 0x12345678u));
      }
    }
  }
  CHECK(paths >= 1);
  CHECK(Crc32cHasPath(Crc32cBestPath()));
}

TEST_CASE("Crc32cCopy copies exactly and returns the source's CRC on every path", "[crc32c]") {
  std::mt19937 rng(9);
  std::vector<uint8_t> src(20000);
  for (auto& b : src) b = static_cast<uint8_t>(rng());
  for (Crc32cPath path : {Crc32cPath::kPortable, Crc32cPath::kCrc32, Crc32cPath::kFold256}) {
    if (!Crc32cHasPath(path)) continue;
    for (size_t n : {size_t{0}, size_t{5}, size_t{511}, size_t{512}, size_t{640}, size_t{641},
                     size_t{4096 + 77}, size_t{19000}}) {
      for (size_t offset : {size_t{0}, size_t{3}}) {
        INFO("path " << static_cast<int>(path) << " length " << n << " offset " << offset);
        std::vector<uint8_t> dst(n + 2, 0xee);  // one guard byte each side
        const uint8_t* p = src.data() + offset;
        CHECK(Crc32cCopyWith(path, dst.data() + 1, p, n, 0x0badf00du) ==
              Reference(p, n, 0x0badf00du));
        CHECK(std::equal(p, p + n, dst.begin() + 1));
        CHECK(dst.front() == 0xee);
        CHECK(dst.back() == 0xee);
      }
    }
  }
  std::vector<uint8_t> dst(src.size());
  CHECK(Crc32cCopy(dst.data(), src.data(), src.size()) == Crc32c(src.data(), src.size()));
  CHECK(dst == src);
}

TEST_CASE("The folding path catches a flipped bit anywhere in a block", "[crc32c]") {
  std::vector<uint8_t> buf(4096 + 77, 0);
  const Crc32cPath path = Crc32cPath::kFold256;
  if (Crc32cHasPath(path)) {
    const uint32_t clean = Crc32cExtendWith(path, 0, buf.data(), buf.size());
    for (size_t bit :
         {size_t{0}, size_t{63}, size_t{64}, size_t{127}, size_t{1000}, size_t{8 * 4096 + 5}}) {
      buf[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
      CHECK(Crc32cExtendWith(path, 0, buf.data(), buf.size()) != clean);
      CHECK(Crc32cExtendWith(path, 0, buf.data(), buf.size()) == Reference(buf.data(), buf.size()));
      buf[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
    }
  }
}

}  // namespace
}  // namespace mmserve
