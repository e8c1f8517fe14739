// CRC32C (Castagnoli), the checksum every transfer chunk carries.
//
//   uint32_t crc = Crc32c(buf, len);
//   crc = Crc32cExtend(crc, more, more_len);  // same as Crc32c over both
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

// True when the hardware path is in use (for logs and benchmarks).
bool Crc32cIsHardwareAccelerated();

}  // namespace mmserve

#endif  // MMSERVE_COMMON_CRC32C_H_
