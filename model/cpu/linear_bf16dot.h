// The bf16-activation kernel of Linear, LinearKernel::kBf16Dot (a detail of
// model/cpu: include linear.h).
//
// Each row of x is rounded to bf16 (round-to-nearest-even; subnormals to
// zero) once per call and taken in pairs along k: (x[2j], x[2j + 1]), a zero
// completing an odd k. An output element is then, with w the bf16 weights
// and the products exact in fp32:
//   acc = 0; for j = 0, 1, ...: acc = acc + x[2j+1] w[2j+1]; acc = acc + x[2j] w[2j]
// each addition rounded to nearest even and a subnormal result flushed to
// zero (subnormal weights count as zero); then + bias as in kDot. That is
// vdpbf16ps (AVX512-BF16) on fp32 accumulators: the kernel runs it at the
// kAvx512 level of a CPU that has it, and the same arithmetic in scalar code
// elsewhere (slow: a portable fallback, not a fast path). Each element is one
// chain in fixed order, so results are batch invariant and the same at
// every level.
#ifndef MMSERVE_MODEL_CPU_LINEAR_BF16DOT_H_
#define MMSERVE_MODEL_CPU_LINEAR_BF16DOT_H_

#include <cstdint>
#include <vector>

#include "model/cpu/linear.h"
#include "model/cpu/thread_pool.h"

namespace mmserve::model::cpu::internal {

// The jobs of a LinearMany call with kBf16Dot. Jobs whose weights are not
// bf16 panels run kDot (fp32 activations).
void Bf16DotLinear(ThreadPool& pool, const float* x, int64_t m, const std::vector<LinearJob>& jobs);

// Whether the vdpbf16ps kernel runs (else the scalar one).
bool Bf16DotUsesAvx512();

}  // namespace mmserve::model::cpu::internal

#endif  // MMSERVE_MODEL_CPU_LINEAR_BF16DOT_H_
