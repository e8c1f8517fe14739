// The --cpu_isa flag of the binaries that run the CPU kernels: avx2, avx512,
// or "" (the default: the widest the CPU has, or MMSERVE_CPU_ISA). See
// cpu_isa.h.
//
//   absl::ParseCommandLine(argc, argv);
//   if (absl::Status s = cpu::ApplyCpuIsaFlag(); !s.ok()) {
//     std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
//     return 1;
//   }
//
// Thread-safety: call once from main, before the kernels run.
#ifndef MMSERVE_MODEL_CPU_CPU_ISA_FLAG_H_
#define MMSERVE_MODEL_CPU_CPU_ISA_FLAG_H_

#include <string>

#include "absl/flags/declare.h"
#include "absl/status/status.h"

ABSL_DECLARE_FLAG(std::string, cpu_isa);

namespace mmserve::model::cpu {

// Applies --cpu_isa (SetCpuIsaByName) and logs the level in force.
// InvalidArgument for an unknown name or a level this CPU lacks.
[[nodiscard]] absl::Status ApplyCpuIsaFlag();

}  // namespace mmserve::model::cpu

#endif  // MMSERVE_MODEL_CPU_CPU_ISA_FLAG_H_
