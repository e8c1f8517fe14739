// CRC32C (Castagnoli), the checksum every transfer chunk carries.
//
//   uint32_t crc = Crc32c(buf, len);
//   crc = Crc32cExtend(crc, more, more_len);  // same as Crc32c over both
//   crc = Crc32cCombine(Crc32c(a, na), Crc32c(b, nb), nb);  // same as over a + b
//
// Uses the SSE4.2 crc32 instruction when the CPU has it (checked once at run
// time), else a table. Thread-safe.
#ifndef MMSERVE_COMMON_CRC32C_H_
#define MMSERVE_COMMON_CRC32C_H_

#include <cstddef>
#include <cstdint>

namespace mmserve {

// Continues a CRC32C computed over earlier bytes (start with crc = 0).
uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t size);

inline uint32_t Crc32c(const void* data, size_t size) { return Crc32cExtend(0, data, size); }

// The CRC32C of A followed by B, from crc1 = Crc32c(A), crc2 = Crc32c(B) and
// len2 = |B|, without reading the bytes (a few GF(2) multiplications).
uint32_t Crc32cCombine(uint32_t crc1, uint32_t crc2, size_t len2);

// True when the hardware path is in use (for logs and benchmarks).
bool Crc32cIsHardwareAccelerated();

}  // namespace mmserve

#endif  // MMSERVE_COMMON_CRC32C_H_
