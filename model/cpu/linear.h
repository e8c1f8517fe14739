// Linear layers on the CPU: y = x W^T + b with W in Hugging Face layout
// ([out_features][in_features], row-major), fp32 or bf16, fp32 accumulation.
//
//   WeightMatrix w{DType::kBF16, tensor->data, /*rows=*/896, /*cols=*/4864};
//   Linear(pool, x, /*m=*/num_tokens, w, /*bias=*/nullptr, y);  // y: [m][896]
//
// Two kernels:
//  - kDot (default): our AVX2+FMA kernel. Every output element is the same
//    chain of operations whatever m is, whichever rows surround it and
//    whichever thread runs it: 8 lane accumulators, lane l summing
//    x[k] * w[k] for k = l (mod 8) in increasing k with fused multiply-adds,
//    then the fixed tree ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)), then + bias.
//    That makes a row's result bitwise independent of the batch it is in
//    (batch invariance for greedy decoding). bf16 weights are widened to fp32
//    in registers, so the mapped checkpoint is read directly.
//  - kOpenBlas: cblas_sgemm from Debian's OpenBLAS (single-threaded calls on
//    column blocks spread over the pool); bf16 weights are widened into an
//    L2-sized fp32 panel first. OpenBLAS takes different code paths for
//    different m, so rows are not batch invariant. Kept to measure against.
//
// Why kDot is the default (measured on the 2-core AVX2 EPYC, per core, CPU
// time, best of runs; the machine is shared so absolute numbers wander):
// one row (decode) streams weights at ~1.5-2x OpenBLAS (which also needs a
// widening pass for bf16); at 32 rows the two are about equal (~55-70 vs
// ~60 GFLOP/s); at 512 rows (prefill) OpenBLAS is faster (~85 vs ~70
// GFLOP/s). kDot is kept everywhere for batch invariance, which OpenBLAS
// does not give (a row's result changes with m from m = 5 on); pick
// kOpenBlas per model (Qwen2ModelOptions) when prefill speed matters more.
//
// Both kernels use every thread of the pool. x is [m][cols] and y [m][rows],
// row-major and dense; bias, when given, has `rows` entries.
// Thread-safety: as ThreadPool::ParallelFor (one caller per pool).
#ifndef MMSERVE_MODEL_CPU_LINEAR_H_
#define MMSERVE_MODEL_CPU_LINEAR_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "model/cpu/thread_pool.h"
#include "model/dtype.h"

namespace mmserve::model::cpu {

// A borrowed weight matrix (usually pointing into the mapped checkpoint).
struct WeightMatrix {
  DType dtype = DType::kF32;  // kF32 or kBF16
  const void* data = nullptr;
  int64_t rows = 0;  // out_features
  int64_t cols = 0;  // in_features

  size_t bytes() const { return static_cast<size_t>(rows * cols) * DTypeSize(dtype); }
};

enum class LinearKernel { kDot, kOpenBlas };

// One layer of a LinearMany call: y = x w^T (+ bias).
struct LinearJob {
  const WeightMatrix* w = nullptr;
  const float* bias = nullptr;  // optional, w->rows entries
  float* y = nullptr;           // [m][w->rows]
};

// y[i][n] = sum_k x[i][k] * w[n][k] (+ bias[n]) for i < m, n < w.rows.
// CHECKs that w.dtype is kF32 or kBF16.
void Linear(ThreadPool& pool, const float* x, int64_t m, const WeightMatrix& w, const float* bias,
            float* y, LinearKernel kernel = LinearKernel::kDot);

// Several layers that read the same x (q/k/v, gate/up) in one parallel loop;
// each job's result is exactly what Linear would give. Every w has the same
// cols.
void LinearMany(ThreadPool& pool, const float* x, int64_t m, const std::vector<LinearJob>& jobs,
                LinearKernel kernel = LinearKernel::kDot);

}  // namespace mmserve::model::cpu

#endif  // MMSERVE_MODEL_CPU_LINEAR_H_
