#include "common/crc32c.h"

#include <cstring>
#include <initializer_list>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#include <nmmintrin.h>
#include <wmmintrin.h>
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

// x^(2^k) mod P for k = 0..63: XPow multiplies the few it needs.
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

// x^bits mod P, by the set bits of `bits`.
uint32_t XPow(uint64_t bits) {
  static const PowerTable table;
  uint32_t p = 1u << 31;  // x^0
  for (int k = 0; bits != 0; ++k, bits >>= 1) {
    if (bits & 1) p = MultModP(table.x2k[k], p);
  }
  return p;
}

// x^(8 * n) mod P: multiplying a CRC register by it appends n zero bytes.
uint32_t ShiftBytes(size_t n) { return XPow(uint64_t{n} * 8); }

#if defined(__x86_64__)
// The crc32 instruction has a 3-cycle latency and a 1-cycle throughput, so
// three independent streams over adjacent stripes run ~3x faster than one;
// the stripes' CRCs are then shifted into place and combined (CRC is linear).
constexpr size_t kStripe = 4096;

__attribute__((target("sse4.2"))) uint32_t ExtendHardware(uint32_t crc, const uint8_t* p,
                                                          size_t n) {
  static const uint32_t kShift1 = ShiftBytes(kStripe);
  static const uint32_t kShift2 = ShiftBytes(2 * kStripe);
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

// Carry-less multiplication folding (Intel, "Fast CRC Computation for
// Generic Polynomials Using PCLMULQDQ"), on 256-bit vpclmulqdq: eight
// 16-byte accumulators (two per ymm register) walk the data 128 bytes at a
// time; each step multiplies an accumulator by x^1024 modulo P (two carry-less
// products against 32-bit constants) and adds the next block, which keeps the
// accumulator congruent to everything it has absorbed. The accumulators are
// then folded into one, whose 16 bytes the crc32 instruction reduces. (The
// same on 128-bit pclmulqdq measured slower than the crc32 loop here, 12 vs
// 15-21 GB/s, so CPUs without vpclmulqdq use that loop.) In the reflected bit order a 64 x 32-bit
// carry-less product comes out multiplied by x^33, hence the "- 33" in the constants.
constexpr size_t kFoldBlock = 128;
// Below this the setup (and the final folds) cost more than they save.
constexpr size_t kFoldMin = 512;

// Constants that move a 16-byte accumulator `distance` bits further on: its
// first 8 bytes (the higher powers) by x^(distance + 64), the last 8 by
// x^distance.
__attribute__((target("sse4.2,pclmul"))) __m128i FoldKeys(uint64_t distance) {
  return _mm_set_epi64x(static_cast<int64_t>(XPow(distance - 33)),
                        static_cast<int64_t>(XPow(distance + 64 - 33)));
}

__attribute__((target("sse4.2,pclmul"))) inline __m128i Fold(__m128i x, __m128i keys) {
  return _mm_xor_si128(_mm_clmulepi64_si128(x, keys, 0x00), _mm_clmulepi64_si128(x, keys, 0x11));
}

__attribute__((target("sse4.2,pclmul,avx2,vpclmulqdq"))) inline __m256i Fold256(__m256i x,
                                                                                __m256i keys) {
  return _mm256_xor_si256(_mm256_clmulepi64_epi128(x, keys, 0x00),
                          _mm256_clmulepi64_epi128(x, keys, 0x11));
}

// Requires n >= kFoldBlock. With kCopy it also stores every block it folds at
// `dst`: the copy and the checksum share one read of the source.
template <bool kCopy>
__attribute__((target("sse4.2,pclmul,avx2,vpclmulqdq"))) uint32_t Folding256(uint32_t crc,
                                                                             uint8_t* dst,
                                                                             const uint8_t* p,
                                                                             size_t n) {
  static const __m128i kKeys1024 = FoldKeys(1024);
  static const __m128i kKeys128 = FoldKeys(128);
  const __m256i keys = _mm256_broadcastsi128_si256(kKeys1024);
  __m256i x[4];
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {
    x[i] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p) + i);
    if (kCopy) _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst) + i, x[i]);
  }
  x[0] = _mm256_xor_si256(x[0], _mm256_zextsi128_si256(_mm_cvtsi32_si128(static_cast<int>(crc))));
  p += kFoldBlock;
  if (kCopy) dst += kFoldBlock;
  n -= kFoldBlock;
  while (n >= kFoldBlock) {
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p) + i);
      if (kCopy) _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst) + i, v);
      x[i] = _mm256_xor_si256(Fold256(x[i], keys), v);
    }
    p += kFoldBlock;
    if (kCopy) dst += kFoldBlock;
    n -= kFoldBlock;
  }
  __m128i a = _mm256_castsi256_si128(x[0]);
  a = _mm_xor_si128(Fold(a, kKeys128), _mm256_extracti128_si256(x[0], 1));
#pragma GCC unroll 4
  for (int i = 1; i < 4; ++i) {
    a = _mm_xor_si128(Fold(a, kKeys128), _mm256_castsi256_si128(x[i]));
    a = _mm_xor_si128(Fold(a, kKeys128), _mm256_extracti128_si256(x[i], 1));
  }
  uint64_t c = _mm_crc32_u64(0, static_cast<uint64_t>(_mm_cvtsi128_si64(a)));
  c = _mm_crc32_u64(c, static_cast<uint64_t>(_mm_extract_epi64(a, 1)));
  if (kCopy) {
    std::memcpy(dst, p, n);
    p = dst;
  }
  return ExtendHardware(static_cast<uint32_t>(c), p, n);
}

bool HasSse42() {
  unsigned eax, ebx, ecx, edx;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return false;
  return (ecx & bit_SSE4_2) != 0;
}

bool HasPclmul() {
  unsigned eax, ebx, ecx, edx;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return false;
  return (ecx & bit_SSE4_2) != 0 && (ecx & bit_PCLMUL) != 0;
}

bool HasVpclmul() {
  unsigned eax, ebx, ecx, edx;
  if (!HasPclmul() || !__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
  if ((ebx & bit_AVX2) == 0 || (ecx & (1u << 10)) == 0) return false;  // AVX2, VPCLMULQDQ
  // The OS must save ymm state: OSXSAVE, then XCR0's SSE and AVX bits.
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx) || (ecx & bit_OSXSAVE) == 0) return false;
  uint32_t xcr0_lo, xcr0_hi;
  __asm__("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  return (xcr0_lo & 6) == 6;
}

#endif

}  // namespace

bool Crc32cHasPath(Crc32cPath path) {
#if defined(__x86_64__)
  static const bool sse42 = HasSse42(), vpclmul = HasVpclmul();
  switch (path) {
    case Crc32cPath::kPortable:
      return true;
    case Crc32cPath::kCrc32:
      return sse42;
    case Crc32cPath::kFold256:
      return vpclmul;
  }
  return false;
#else
  return path == Crc32cPath::kPortable;
#endif
}

Crc32cPath Crc32cBestPath() {
  static const Crc32cPath best = [] {
    for (Crc32cPath p : {Crc32cPath::kFold256, Crc32cPath::kCrc32}) {
      if (Crc32cHasPath(p)) return p;
    }
    return Crc32cPath::kPortable;
  }();
  return best;
}

bool Crc32cIsHardwareAccelerated() { return Crc32cBestPath() != Crc32cPath::kPortable; }

uint32_t Crc32cCombine(uint32_t crc1, uint32_t crc2, size_t len2) {
  // Pre- and post-conditioning cancel out (as in zlib's crc32_combine).
  return MultModP(ShiftBytes(len2), crc1) ^ crc2;
}

uint32_t Crc32cExtendWith(Crc32cPath path, uint32_t crc, const void* data, size_t size) {
  const auto* p = static_cast<const uint8_t*>(data);
  crc = ~crc;
#if defined(__x86_64__)
  switch (path) {
    case Crc32cPath::kPortable:
      break;
    case Crc32cPath::kFold256:
      if (size >= kFoldMin) return ~Folding256<false>(crc, nullptr, p, size);
      return ~ExtendHardware(crc, p, size);
    case Crc32cPath::kCrc32:
      return ~ExtendHardware(crc, p, size);
  }
#endif
  return ~ExtendPortable(crc, p, size);
}

uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t size) {
  return Crc32cExtendWith(Crc32cBestPath(), crc, data, size);
}

uint32_t Crc32cCopyWith(Crc32cPath path, void* dst, const void* src, size_t size, uint32_t crc) {
#if defined(__x86_64__)
  if (path == Crc32cPath::kFold256 && size >= kFoldMin) {
    return ~Folding256<true>(~crc, static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(src),
                             size);
  }
#endif
  std::memcpy(dst, src, size);
  return Crc32cExtendWith(path, crc, dst, size);
}

uint32_t Crc32cCopy(void* dst, const void* src, size_t size, uint32_t crc) {
  return Crc32cCopyWith(Crc32cBestPath(), dst, src, size, crc);
}

}  // namespace mmserve
