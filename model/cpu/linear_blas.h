// LinearKernel::kOpenBlas, the baseline the dot kernels are measured
// against (see linear.h): cblas_sgemm from Debian's OpenBLAS on column
// blocks spread over the pool, bf16 weights widened to fp32 first. Not batch
// invariant. A detail of model/cpu.
#ifndef MMSERVE_MODEL_CPU_LINEAR_BLAS_H_
#define MMSERVE_MODEL_CPU_LINEAR_BLAS_H_

#include <cstdint>

#include "model/cpu/linear.h"
#include "model/cpu/thread_pool.h"

namespace mmserve::model::cpu::internal {

// y = x w^T (+ bias) for one layer.
void BlasLinear(ThreadPool& pool, const float* x, int64_t m, const WeightMatrix& w,
                const float* bias, float* y);

}  // namespace mmserve::model::cpu::internal

#endif  // MMSERVE_MODEL_CPU_LINEAR_BLAS_H_
