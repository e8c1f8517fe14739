#include "model/cpu/cpu_isa_flag.h"

#include "absl/flags/flag.h"
#include "common/logging.h"
#include "model/cpu/cpu_isa.h"

ABSL_FLAG(std::string, cpu_isa, "",
          "CPU kernels' instruction set: avx2 or avx512 (default: the widest this CPU has, or "
          "MMSERVE_CPU_ISA)");

namespace mmserve::model::cpu {

absl::Status ApplyCpuIsaFlag() {
  absl::Status status = SetCpuIsaByName(absl::GetFlag(FLAGS_cpu_isa));
  if (!status.ok()) return status;
  LOG(INFO) << "cpu kernels: " << IsaName();
  return absl::OkStatus();
}

}  // namespace mmserve::model::cpu
