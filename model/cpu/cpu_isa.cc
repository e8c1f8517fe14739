#include "model/cpu/cpu_isa.h"

#include <cpuid.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace mmserve::model::cpu {
namespace {

// XCR0, the state components the OS saves on context switches. Read with
// the raw instruction so that this file needs no -mxsave.
uint64_t ReadXcr0() {
  uint32_t eax, edx;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (static_cast<uint64_t>(edx) << 32) | eax;
}

bool Bit(uint32_t reg, int bit) { return (reg >> bit) & 1u; }

CpuFeatures Detect() {
  CpuFeatures f;
  uint32_t eax, ebx, ecx, edx;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return f;
  const bool osxsave = Bit(ecx, 27), avx = Bit(ecx, 28), fma = Bit(ecx, 12), f16c = Bit(ecx, 29);
  if (!osxsave || !avx) return f;
  const uint64_t xcr0 = ReadXcr0();
  const bool os_ymm = (xcr0 & 0x6) == 0x6;    // SSE and AVX state
  const bool os_zmm = (xcr0 & 0xE0) == 0xE0;  // opmask, ZMM_Hi256, Hi16_ZMM
  if (!os_ymm || !__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return f;
  f.avx2 = Bit(ebx, 5) && fma && f16c;
  const bool avx512f = Bit(ebx, 16), dq = Bit(ebx, 17), bw = Bit(ebx, 30), vl = Bit(ebx, 31);
  f.avx512 = f.avx2 && os_zmm && avx512f && dq && bw && vl;
  f.avx512_vnni = f.avx512 && Bit(ecx, 11);
  uint32_t eax1, ebx1, ecx1, edx1;
  f.avx512_bf16 = f.avx512 && __get_cpuid_count(7, 1, &eax1, &ebx1, &ecx1, &edx1) && Bit(eax1, 5);
  return f;
}

bool Supported(CpuIsa isa) {
  return isa == CpuIsa::kAvx2 ? DetectedCpuFeatures().avx2 : DetectedCpuFeatures().avx512;
}

CpuIsa DefaultIsa() {
  const char* env = std::getenv("MMSERVE_CPU_ISA");
  if (env == nullptr || *env == '\0') return WidestCpuIsa();
  absl::StatusOr<CpuIsa> isa = ParseCpuIsa(env);
  if (isa.ok() && Supported(*isa)) return *isa;
  LOG(ERROR) << "MMSERVE_CPU_ISA=" << env << " ignored: "
             << (isa.ok() ? absl::StrCat("this CPU supports up to ", IsaName(WidestCpuIsa()))
                          : std::string(isa.status().message()));
  return WidestCpuIsa();
}

// -1 until the first ActiveCpuIsa or SetCpuIsa.
std::atomic<int> active{-1};

}  // namespace

const CpuFeatures& DetectedCpuFeatures() {
  static const CpuFeatures features = Detect();
  return features;
}

CpuIsa WidestCpuIsa() { return DetectedCpuFeatures().avx512 ? CpuIsa::kAvx512 : CpuIsa::kAvx2; }

std::vector<CpuIsa> SupportedCpuIsas() {
  std::vector<CpuIsa> levels = {CpuIsa::kAvx2};
  if (Supported(CpuIsa::kAvx512)) levels.push_back(CpuIsa::kAvx512);
  return levels;
}

CpuIsa ActiveCpuIsa() {
  int level = active.load(std::memory_order_relaxed);
  if (level < 0) {
    // Racing first callers compute the same default; the first store wins.
    int expected = -1;
    active.compare_exchange_strong(expected, static_cast<int>(DefaultIsa()));
    level = active.load(std::memory_order_relaxed);
  }
  return static_cast<CpuIsa>(level);
}

absl::Status SetCpuIsa(CpuIsa isa) {
  if (!Supported(isa)) {
    return absl::InvalidArgumentError(absl::StrCat("this CPU does not support ", IsaName(isa),
                                                   " (it supports up to ", IsaName(WidestCpuIsa()),
                                                   ")"));
  }
  active.store(static_cast<int>(isa), std::memory_order_relaxed);
  return absl::OkStatus();
}

const char* IsaName(CpuIsa isa) { return isa == CpuIsa::kAvx512 ? "avx512" : "avx2"; }

const char* IsaName() { return IsaName(ActiveCpuIsa()); }

absl::StatusOr<CpuIsa> ParseCpuIsa(std::string_view name) {
  if (name == "avx2") return CpuIsa::kAvx2;
  if (name == "avx512") return CpuIsa::kAvx512;
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown CPU instruction set \"", std::string(name), "\" (expected avx2 or avx512)"));
}

absl::Status SetCpuIsaByName(std::string_view name) {
  if (name.empty() || name == "auto") return absl::OkStatus();
  absl::StatusOr<CpuIsa> isa = ParseCpuIsa(name);
  if (!isa.ok()) return isa.status();
  return SetCpuIsa(*isa);
}

ScopedCpuIsa::ScopedCpuIsa(CpuIsa isa) : previous_(ActiveCpuIsa()) {
  absl::Status status = SetCpuIsa(isa);
  CHECK(status.ok()) << status.message();
}

ScopedCpuIsa::~ScopedCpuIsa() { (void)SetCpuIsa(previous_); }

}  // namespace mmserve::model::cpu
