#include "model/dtype.h"

#include <catch2/catch.hpp>
#include <cmath>

namespace mmserve::model {
namespace {

TEST_CASE("dtype names and sizes round-trip for every dtype", "[dtype]") {
  for (DType d : {DType::kF32, DType::kBF16, DType::kF16, DType::kF64, DType::kI64, DType::kI32,
                  DType::kI16, DType::kI8, DType::kU8, DType::kBool}) {
    DType back;
    REQUIRE(ParseDType(DTypeName(d), &back));
    CHECK(back == d);
  }
  CHECK(DTypeSize(DType::kBF16) == 2);
  CHECK(DTypeSize(DType::kF64) == 8);
  DType unused;
  CHECK_FALSE(ParseDType("F8_E4M3", &unused));
  CHECK_FALSE(ParseDType("f32", &unused));
}

TEST_CASE("the load-time int4 dtype has a name but is never read from a checkpoint", "[dtype]") {
  CHECK(DTypeName(DType::kI4) == "I4");
  CHECK(DTypeSize(DType::kI4) == 0);  // two a byte: WeightMatrix::bytes counts them
  DType unused = DType::kF32;
  CHECK_FALSE(ParseDType("I4", &unused));
  CHECK(unused == DType::kF32);
}

TEST_CASE("bf16 conversion is exact one way and rounds to nearest even the other", "[dtype]") {
  CHECK(Bf16ToF32(0x3f80) == 1.0f);
  CHECK(Bf16ToF32(0xc000) == -2.0f);
  CHECK(F32ToBf16(1.0f) == 0x3f80);
  // 1 + 2^-8 is exactly halfway between two bf16 values: ties go to even.
  CHECK(F32ToBf16(1.00390625f) == 0x3f80);
  CHECK(F32ToBf16(1.01171875f) == 0x3f82);  // 1 + 3*2^-8: ties to even (up)
  CHECK(std::isnan(Bf16ToF32(F32ToBf16(NAN))));
  for (uint32_t h = 0; h < 0x10000; h += 7) {
    float f = Bf16ToF32(static_cast<uint16_t>(h));
    if (!std::isnan(f)) REQUIRE(F32ToBf16(f) == h);
  }
}

TEST_CASE("fp16 conversion handles normals, subnormals and specials", "[dtype]") {
  CHECK(F16ToF32(0x3c00) == 1.0f);
  CHECK(F16ToF32(0xc000) == -2.0f);
  CHECK(F16ToF32(0x0001) == std::ldexp(1.0f, -24));
  CHECK(F16ToF32(0x7bff) == 65504.0f);
  CHECK(std::isinf(F16ToF32(0x7c00)));
  CHECK(std::isnan(F16ToF32(0x7e00)));
}

}  // namespace
}  // namespace mmserve::model
