#include "common/crc32c.h"

#include <cstring>

#if defined(__x86_64__)
#include <cpuid.h>
#include <nmmintrin.h>
#endif

namespace mmserve {
namespace {

constexpr uint32_t kPoly = 0x82F63B78u;  // reflected Castagnoli polynomial

struct Table {
  uint32_t t[256];
  constexpr Table() : t() {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kPoly : c >> 1;
      t[i] = c;
    }
  }
};
constexpr Table kTable;

uint32_t ExtendPortable(uint32_t crc, const uint8_t* p, size_t n) {
  for (size_t i = 0; i < n; ++i) crc = kTable.t[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
  return crc;
}

// Multiplies two polynomials modulo the CRC polynomial (reflected bit order,
// x^0 in bit 31): the GF(2) arithmetic that shifts a CRC over zero bytes.
uint32_t MultModP(uint32_t a, uint32_t b) {
  uint32_t m = 1u << 31, p = 0;
  for (;;) {
    if (a & m) {
      p ^= b;
      if ((a & (m - 1)) == 0) break;
    }
    m >>= 1;
    b = (b & 1) ? (b >> 1) ^ kPoly : b >> 1;
  }
  return p;
}

// x^(8 * n) mod P: multiplying a CRC register by it appends n zero bytes.
uint32_t ShiftConstant(size_t n) {
  uint32_t x2k = 1u << 30;  // x^1, squared into x^(2^k)
  uint32_t p = 1u << 31;    // x^0
  for (size_t bits = n * 8; bits != 0; bits >>= 1) {
    if (bits & 1) p = MultModP(x2k, p);
    x2k = MultModP(x2k, x2k);
  }
  return p;
}

// x^(2^k) mod P for k = 0..63: ShiftBytes multiplies the few it needs.
struct PowerTable {
  uint32_t x2k[64];
  PowerTable() {
    uint32_t p = 1u << 30;  // x^1
    for (int k = 0; k < 64; ++k) {
      x2k[k] = p;
      p = MultModP(p, p);
    }
  }
};

// x^(8 * n) mod P, by the set bits of 8n.
uint32_t ShiftBytes(size_t n) {
  static const PowerTable table;
  uint32_t p = 1u << 31;  // x^0
  uint64_t bits = uint64_t{n} * 8;
  for (int k = 0; bits != 0; ++k, bits >>= 1) {
    if (bits & 1) p = MultModP(table.x2k[k], p);
  }
  return p;
}

#if defined(__x86_64__)
// The crc32 instruction has a 3-cycle latency and a 1-cycle throughput, so
// three independent streams over adjacent stripes run ~3x faster than one;
// the stripes' CRCs are then shifted into place and combined (CRC is linear).
constexpr size_t kStripe = 4096;

__attribute__((target("sse4.2"))) uint32_t ExtendHardware(uint32_t crc, const uint8_t* p,
                                                          size_t n) {
  static const uint32_t kShift1 = ShiftConstant(kStripe);
  static const uint32_t kShift2 = ShiftConstant(2 * kStripe);
  uint64_t c = crc;
  while (n >= 3 * kStripe) {
    uint64_t c1 = 0, c2 = 0;
    for (size_t i = 0; i < kStripe; i += 8) {
      uint64_t v0, v1, v2;
      std::memcpy(&v0, p + i, 8);
      std::memcpy(&v1, p + kStripe + i, 8);
      std::memcpy(&v2, p + 2 * kStripe + i, 8);
      c = _mm_crc32_u64(c, v0);
      c1 = _mm_crc32_u64(c1, v1);
      c2 = _mm_crc32_u64(c2, v2);
    }
    c = MultModP(kShift2, static_cast<uint32_t>(c)) ^ MultModP(kShift1, static_cast<uint32_t>(c1)) ^
        static_cast<uint32_t>(c2);
    p += 3 * kStripe;
    n -= 3 * kStripe;
  }
  while (n >= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    c = _mm_crc32_u64(c, v);
    p += 8;
    n -= 8;
  }
  uint32_t c32 = static_cast<uint32_t>(c);
  while (n > 0) {
    c32 = _mm_crc32_u8(c32, *p++);
    --n;
  }
  return c32;
}

bool HasSse42() {
  unsigned eax, ebx, ecx, edx;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return false;
  return (ecx & bit_SSE4_2) != 0;
}
#endif

}  // namespace

bool Crc32cIsHardwareAccelerated() {
#if defined(__x86_64__)
  static const bool has = HasSse42();
  return has;
#else
  return false;
#endif
}

uint32_t Crc32cCombine(uint32_t crc1, uint32_t crc2, size_t len2) {
  // Pre- and post-conditioning cancel out (as in zlib's crc32_combine).
  return MultModP(ShiftBytes(len2), crc1) ^ crc2;
}

uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t size) {
  const auto* p = static_cast<const uint8_t*>(data);
  crc = ~crc;
#if defined(__x86_64__)
  if (Crc32cIsHardwareAccelerated()) return ~ExtendHardware(crc, p, size);
#endif
  return ~ExtendPortable(crc, p, size);
}

}  // namespace mmserve
