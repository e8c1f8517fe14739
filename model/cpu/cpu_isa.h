// The instruction-set level the CPU kernels run at, chosen once per process.
//
//   // In a main, after absl::ParseCommandLine (flag from cpu_isa_flag.h):
//   if (absl::Status s = cpu::ApplyCpuIsaFlag(); !s.ok()) { ... exit 1 ... }
//   LOG(INFO) << "cpu kernels: " << cpu::IsaName();
//
//   // In a kernel:
//   if (cpu::ActiveCpuIsa() == cpu::CpuIsa::kAvx512) { ...512-bit... }
//
// Levels:
//  - kAvx2: AVX2 + FMA + F16C, the portable floor (the kernels' own build
//    flags; there is no lower level).
//  - kAvx512: AVX-512 F, BW, VL and DQ, with the OS saving the opmask and
//    zmm state (XCR0 bits 5-7, read with xgetbv). VNNI and BF16 are features
//    of this level that kernels test separately (CpuFeatures).
//
// The level is the widest the CPU has, unless forced: by the environment
// variable MMSERVE_CPU_ISA=avx2|avx512 (read at the first ActiveCpuIsa(); a
// value that is malformed or that the CPU lacks is logged as an error and
// ignored), or by SetCpuIsa (mains, from --cpu_isa; tests and benchmarks,
// to run both levels). Results are bitwise the same at both levels wherever
// a kernel says so (linear.h).
//
// Thread-safety: every function may be called from any thread; a level set
// while kernels run applies from their next call.
#ifndef MMSERVE_MODEL_CPU_CPU_ISA_H_
#define MMSERVE_MODEL_CPU_CPU_ISA_H_

#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace mmserve::model::cpu {

enum class CpuIsa { kAvx2 = 0, kAvx512 = 1 };

// What this CPU and its OS support, from cpuid and xgetbv (found once).
struct CpuFeatures {
  bool avx2 = false;         // with FMA and F16C
  bool avx512 = false;       // F, BW, VL, DQ and the OS saves zmm/opmask state
  bool avx512_vnni = false;  // vpdpbusd, vpdpwssd (only with avx512)
  bool avx512_bf16 = false;  // vdpbf16ps, vcvtne2ps2bf16 (only with avx512)
};
const CpuFeatures& DetectedCpuFeatures();

// The widest level the CPU supports.
CpuIsa WidestCpuIsa();

// Every level the CPU supports, narrowest first (tests run each).
std::vector<CpuIsa> SupportedCpuIsas();

// The level in force (see above for how it is chosen).
CpuIsa ActiveCpuIsa();

// Forces the level. InvalidArgument when the CPU lacks it (and the level in
// force is left as it was).
[[nodiscard]] absl::Status SetCpuIsa(CpuIsa isa);

// "avx2" or "avx512".
const char* IsaName(CpuIsa isa);
// The name of the level in force: for logs and metric labels.
const char* IsaName();

// Parses "avx2" or "avx512"; InvalidArgument otherwise.
[[nodiscard]] absl::StatusOr<CpuIsa> ParseCpuIsa(std::string_view name);

// Forces the level named (as --cpu_isa takes it): "" or "auto" keeps the
// default choice; otherwise ParseCpuIsa then SetCpuIsa. Errors name the
// value and what this CPU supports.
[[nodiscard]] absl::Status SetCpuIsaByName(std::string_view name);

// Sets a level for one scope and restores the previous one (tests and
// benchmarks that run both levels). CHECKs that the CPU has it.
class ScopedCpuIsa {
 public:
  explicit ScopedCpuIsa(CpuIsa isa);
  ~ScopedCpuIsa();
  ScopedCpuIsa(const ScopedCpuIsa&) = delete;
  ScopedCpuIsa& operator=(const ScopedCpuIsa&) = delete;

 private:
  CpuIsa previous_;
};

}  // namespace mmserve::model::cpu

#endif  // MMSERVE_MODEL_CPU_CPU_ISA_H_
