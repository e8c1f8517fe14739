#include "model/dtype.h"

#include <cmath>

namespace mmserve::model {
namespace {

struct DTypeInfo {
  DType dtype;
  absl::string_view name;
  size_t size;
};

constexpr DTypeInfo kInfos[] = {
    {DType::kF32, "F32", 4},   {DType::kBF16, "BF16", 2}, {DType::kF16, "F16", 2},
    {DType::kF64, "F64", 8},   {DType::kI64, "I64", 8},   {DType::kI32, "I32", 4},
    {DType::kI16, "I16", 2},   {DType::kI8, "I8", 1},     {DType::kU8, "U8", 1},
    {DType::kBool, "BOOL", 1}, {DType::kI4, "I4", 0},
};

}  // namespace

size_t DTypeSize(DType dtype) { return kInfos[static_cast<int>(dtype)].size; }

absl::string_view DTypeName(DType dtype) { return kInfos[static_cast<int>(dtype)].name; }

bool ParseDType(absl::string_view name, DType* out) {
  for (const DTypeInfo& info : kInfos) {
    if (info.name == name && info.dtype != DType::kI4) {
      *out = info.dtype;
      return true;
    }
  }
  return false;
}

float F16ToF32(uint16_t h) {
  const uint32_t sign = (h >> 15) & 1u;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  float value;
  if (exp == 0) {
    value = std::ldexp(static_cast<float>(mant), -24);  // zero or subnormal
  } else if (exp == 31) {
    value = mant == 0 ? INFINITY : NAN;
  } else {
    value = std::ldexp(static_cast<float>(mant | 0x400u), static_cast<int>(exp) - 25);
  }
  return sign ? -value : value;
}

}  // namespace mmserve::model
