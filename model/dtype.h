// Element types of weights and activations, with bf16/fp16 <-> fp32
// conversions. bf16 -> fp32 is exact; fp32 -> bf16 rounds to nearest even,
// as PyTorch does.
#ifndef MMSERVE_MODEL_DTYPE_H_
#define MMSERVE_MODEL_DTYPE_H_

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "absl/strings/string_view.h"

namespace mmserve::model {

// kI4 is mmserve's own: 4-bit weights quantized at load (two a byte, so
// DTypeSize is 0: cpu::WeightMatrix::bytes counts them). Checkpoints never
// hold it: ParseDType does not read "I4".
enum class DType : uint8_t { kF32, kBF16, kF16, kF64, kI64, kI32, kI16, kI8, kU8, kBool, kI4 };

// Bytes per element.
size_t DTypeSize(DType dtype);

// The safetensors spelling ("F32", "BF16", ...).
absl::string_view DTypeName(DType dtype);

// Parses a safetensors dtype string; false for anything unknown (e.g. the
// fp8 types, which mmserve does not load).
bool ParseDType(absl::string_view name, DType* out);

inline float Bf16ToF32(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

inline uint16_t F32ToBf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);  // NaN
  bits += 0x7fffu + ((bits >> 16) & 1u);  // round to nearest even
  return static_cast<uint16_t>(bits >> 16);
}

// IEEE half -> float, exact (subnormals, infinities and NaN included).
float F16ToF32(uint16_t h);

}  // namespace mmserve::model

#endif  // MMSERVE_MODEL_DTYPE_H_
