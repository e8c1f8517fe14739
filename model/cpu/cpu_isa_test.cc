#include "model/cpu/cpu_isa.h"

#include <catch2/catch.hpp>
#include <cstdlib>
#include <string>

namespace mmserve::model::cpu {
namespace {

// Runs first (Catch2 keeps declaration order), before anything sets a level.
TEST_CASE("the default level is MMSERVE_CPU_ISA when set, else the widest the CPU has",
          "[cpu_isa]") {
  const char* env = std::getenv("MMSERVE_CPU_ISA");
  if (env != nullptr && std::string(env) == "avx2") {
    CHECK(ActiveCpuIsa() == CpuIsa::kAvx2);
  } else if (env != nullptr && std::string(env) == "avx512" && DetectedCpuFeatures().avx512) {
    CHECK(ActiveCpuIsa() == CpuIsa::kAvx512);
  } else {
    CHECK(ActiveCpuIsa() == WidestCpuIsa());
  }
  CHECK(std::string(IsaName()) == IsaName(ActiveCpuIsa()));
}

TEST_CASE("detected features are consistent: AVX-512 extensions only with AVX-512", "[cpu_isa]") {
  const CpuFeatures& f = DetectedCpuFeatures();
  CHECK(f.avx2);  // the kernels' build floor: this test could not run otherwise
  if (!f.avx512) {
    CHECK_FALSE(f.avx512_vnni);
    CHECK_FALSE(f.avx512_bf16);
  }
  CHECK(WidestCpuIsa() == (f.avx512 ? CpuIsa::kAvx512 : CpuIsa::kAvx2));
}

TEST_CASE("names parse to levels and unknown names are rejected", "[cpu_isa]") {
  REQUIRE(ParseCpuIsa("avx2").ok());
  CHECK(*ParseCpuIsa("avx2") == CpuIsa::kAvx2);
  CHECK(*ParseCpuIsa("avx512") == CpuIsa::kAvx512);
  CHECK(ParseCpuIsa("sse4").status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(ParseCpuIsa("AVX2").status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(IsaName(CpuIsa::kAvx2)) == "avx2");
  CHECK(std::string(IsaName(CpuIsa::kAvx512)) == "avx512");
}

TEST_CASE("setting a level by name forces it; empty and auto keep the level in force",
          "[cpu_isa]") {
  const CpuIsa before = ActiveCpuIsa();
  REQUIRE(SetCpuIsaByName("").ok());
  REQUIRE(SetCpuIsaByName("auto").ok());
  CHECK(ActiveCpuIsa() == before);
  REQUIRE(SetCpuIsaByName("avx2").ok());
  CHECK(ActiveCpuIsa() == CpuIsa::kAvx2);
  CHECK(SetCpuIsaByName("avx1024").code() == absl::StatusCode::kInvalidArgument);
  CHECK(ActiveCpuIsa() == CpuIsa::kAvx2);
  REQUIRE(SetCpuIsa(before).ok());
}

TEST_CASE("requesting AVX-512 on a CPU without it is an error and keeps the level", "[cpu_isa]") {
  const CpuIsa before = ActiveCpuIsa();
  const absl::Status status = SetCpuIsa(CpuIsa::kAvx512);
  if (DetectedCpuFeatures().avx512) {
    CHECK(status.ok());
    CHECK(ActiveCpuIsa() == CpuIsa::kAvx512);
    REQUIRE(SetCpuIsa(before).ok());
  } else {
    CHECK(status.code() == absl::StatusCode::kInvalidArgument);
    CHECK(ActiveCpuIsa() == before);
  }
}

TEST_CASE("a scoped level is restored when the scope ends", "[cpu_isa]") {
  const CpuIsa before = ActiveCpuIsa();
  {
    ScopedCpuIsa scoped(CpuIsa::kAvx2);
    CHECK(ActiveCpuIsa() == CpuIsa::kAvx2);
  }
  CHECK(ActiveCpuIsa() == before);
}

}  // namespace
}  // namespace mmserve::model::cpu
