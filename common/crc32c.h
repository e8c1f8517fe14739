// CRC32C (Castagnoli), the checksum every transfer chunk carries.
//
//   uint32_t crc = Crc32c(buf, len);
//   crc = Crc32cExtend(crc, more, more_len);  // same as Crc32c over both
//   crc = Crc32cCombine(Crc32c(a, na), Crc32c(b, nb), nb);  // same as over a + b
//
// Picks the fastest implementation the CPU has, once at run time: carry-less
// multiplication folding (vpclmulqdq on ymm) for buffers of 512 bytes and
// more, the SSE4.2 crc32 instruction below that or without vpclmulqdq, else a
// table.
// Thread-safe.
#ifndef MMSERVE_COMMON_CRC32C_H_
#define MMSERVE_COMMON_CRC32C_H_

#include <cstddef>
#include <cstdint>

namespace mmserve {

// Continues a CRC32C computed over earlier bytes (start with crc = 0).
uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t size);

inline uint32_t Crc32c(const void* data, size_t size) { return Crc32cExtend(0, data, size); }

// Copies `size` bytes from `src` to `dst` (not overlapping) and returns
// Crc32cExtend(crc, src, size), reading the source once where the CPU allows
// (vpclmulqdq), else copying and then checksumming the copy.
uint32_t Crc32cCopy(void* dst, const void* src, size_t size, uint32_t crc = 0);

// The CRC32C of A followed by B, from crc1 = Crc32c(A), crc2 = Crc32c(B) and
// len2 = |B|, without reading the bytes (a few GF(2) multiplications).
uint32_t Crc32cCombine(uint32_t crc1, uint32_t crc2, size_t len2);

// True when a hardware path is in use (for logs and benchmarks).
bool Crc32cIsHardwareAccelerated();

// The implementations, for tests and benchmarks; Crc32cExtend uses the best.
enum class Crc32cPath { kPortable, kCrc32, kFold256 };
bool Crc32cHasPath(Crc32cPath path);
Crc32cPath Crc32cBestPath();
// Crc32cExtend through `path`, which must be one the CPU has.
uint32_t Crc32cExtendWith(Crc32cPath path, uint32_t crc, const void* data, size_t size);
uint32_t Crc32cCopyWith(Crc32cPath path, void* dst, const void* src, size_t size, uint32_t crc);

}  // namespace mmserve

#endif  // MMSERVE_COMMON_CRC32C_H_
