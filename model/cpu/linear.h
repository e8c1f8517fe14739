// Linear layers on the CPU: y = x W^T + b with W [out_features][in_features]
// (Hugging Face's orientation), fp32, bf16 or int8 weights, fp32 activations
// and accumulation (int8: integer products of int16-quantized activations,
// below; kBf16Dot: bf16 activations). The instruction set is chosen at run
// time (cpu_isa.h).
//
//   WeightMatrix w{DType::kBF16, tensor->data, /*rows=*/896, /*cols=*/4864};
//   PanelWeights packed = PanelWeights::Pack(pool, w);  // once, at load
//   Linear(pool, x, /*m=*/num_tokens, packed.matrix(), /*bias=*/nullptr, y);
//
// Weights come in two layouts:
//  - kRows: row-major as in the checkpoint, fp32 or bf16, used in place from
//    the mapping. fp32 checkpoints stay this way: fp32 is the compute dtype,
//    so their weights are never copied.
//  - kPanels (bf16): repacked once by PanelWeights::Pack into panels of 16
//    rows stored k-major, so one 32-byte load holds 16 outputs' weights for
//    one k and widens to fp32 with one shift and one and. Qwen2Weights packs
//    every bf16 matrix and drops the mapped pages it came from, so memory
//    stays at one copy.
//  - kPanels (int8): quantized once by Int8Weights::Quantize, symmetric int8
//    with fp32 scales, in 16-row panels of k pairs (32 bytes per pair).
//  - kPanels (int4): quantized once by Int4Weights::Quantize, group-wise
//    4-bit with fp32 scales and optional zero points, 16-row panels of
//    octets of columns (linear_int4.h: its layout, arithmetic and kernels;
//    int4 layers always take int8 activations).
//
// Kernels (LinearKernel):
//  - kDot (default), on kPanels: a 6-row x 16-column register tile of outer
//    products (broadcast x, panel row of w), cache-blocked in k. Every output
//    element is the single chain acc = fma(x[i][k], w[n][k], acc) over
//    k = 0, 1, ..., cols - 1 from acc = 0, then + bias. One row (decode)
//    streams four panels at a time.
//  - kDot on kRows: a dot-product kernel with 8 lane accumulators, lane l
//    summing x[k] * w[k] for k = l (mod 8) in increasing k with fused
//    multiply-adds, then the fixed tree ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)),
//    then + bias. bf16 is widened in registers.
//  With more than 6 rows, the bf16 kernel widens each panel's block of 256 k
//  steps to fp32 once per task and runs every 6-row tile on that block (the
//  same values, so the same sums), leaving only loads and FMAs in the hot
//  loop. At the kAvx512 level (cpu_isa.h) calls of 2 rows or more run the
//  same chains on 512-bit registers, a 6-row x 4-panel tile
//  (linear_avx512.h): lanes never mix, so the bits are the AVX2 kernel's.
//  - kDot on int8 panels (linear_int8.cc): integer dot products. Each row of
//    x is quantized to int16 with its own scale, s_x = max|x| / 32767,
//    x_q = round(x / s_x) (exactly: round-half-even of x * (32767 / max|x|)).
//    vpmaddwd multiplies pairs of x_q by pairs of weights sign-extended to
//    int16 and sums them exactly in int32 (16 multiply-adds an instruction
//    where an fp32 FMA does 8), in segments: k is cut at every multiple of
//    256 (so no sum can overflow) and of the scale group. Each segment's
//    integer sum S goes to fp32 once: c = c + float(S) (one scale per output
//    row) or c = fma(float(S), s_group, c) (grouped), from c = 0 in
//    increasing k; then y = c * s_row (per row) * s_x + bias, as separate
//    roundings. Integer sums are exact in any order, so tiles of any shape
//    give the same bits. The activation rounding adds a relative error of at
//    most 2^-16 of the row's largest |x| per element, 2^8 finer than the
//    weights' own step (max|w| / 254). At the kAvx512 level on a CPU
//    with AVX512-VNNI, vpdpwssd does vpmaddwd and the add in one
//    instruction: the same exact sums, so the same bits (linear_test runs
//    both levels).
//  In all, an element's result does not depend on m, on the rows around it
//  or on the thread that runs it: a row's result is bitwise the same in any
//  batch (batch invariance for greedy decoding).
//  - kOpenBlas: cblas_sgemm from Debian's OpenBLAS (single-threaded calls on
//    column blocks spread over the pool); bf16 weights (either layout) are
//    widened into an L2-sized fp32 block first. OpenBLAS takes different
//    code paths for different m, so rows are not batch invariant. Kept to
//    measure against.
//
// Why our kernels and not OpenBLAS (bench:linear_bench at Qwen2-0.5B shapes,
// 2 threads on the 2-core EPYC, family 25 model 17 (Zen 4); Debian's
// OpenBLAS has no bf16 GEMM, so its figures are sgemm on fp32 copies of the
// weights; 2026-11-22): bf16 panels ran at 150-180
// GFLOP/s for 32 rows (1.3-1.5x sgemm) and 170-187 for 512 rows (1.04-1.18x
// sgemm, against an FMA peak of ~205), and one row at 4-11x sgemm's rate
// (half the bytes, no widening pass). Row-major bf16 reached 80-95 at 32 and
// 512 rows. int8 (2026-11-25, quiet): 250-380 GFLOP/s-equivalent at 32 and
// 512 rows on VNNI, 210-300 on the AVX2 kernels, above the FMA peak of
// ~230 (integer multiply-adds); one row streams int8 at bf16's bytes per
// second. Only kDot and kBf16Dot are batch invariant.
// AVX-512 (2026-11-25, one thread on the CPU clock, the machine loaded):
// Zen 4 runs 512-bit FMAs as two 256-bit halves (bench/isa_peaks.h: the
// same FMA peak at both widths), so the 512-bit fp32-activation tiles only
// match the AVX2 ones (96-108 vs 93-107 GFLOP/s at 32 and 512 rows, 69-71
// vs 57 at 2 rows); vdpbf16ps has twice the FMA peak, and kBf16Dot ran at
// 140-201 GFLOP/s at 32 and 512 rows (1.6-1.9x kDot) and at kDot's rate
// for one row. kInt8Act on vpdpbusd (linear_int8_act.h) with one scale
// per 32 activation columns (2026-11-29, an Intel Xeon with AMX, family 6,
// one thread on the CPU-time clock, load 5-9): 170-280 GOP/s at 512 rows,
// 1.6-2.6x the int16-activation kernel, about 0.55 of the same tiles with
// one scale per row (each block converts and scales every accumulator
// every 8 quads); one row runs the int16 kernels' stream on the int8
// values. It costs accuracy (qwen2_int8_parity_test, bench:quality).
//
// All kernels use every thread of the pool. x is [m][cols] and y [m][rows],
// row-major and dense; bias, when given, has `rows` entries.
// Thread-safety: as ThreadPool::ParallelFor (one caller per pool).
#ifndef MMSERVE_MODEL_CPU_LINEAR_H_
#define MMSERVE_MODEL_CPU_LINEAR_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "model/cpu/thread_pool.h"
#include "model/dtype.h"

namespace mmserve::model::cpu {

enum class WeightLayout {
  kRows,    // [rows][cols], row-major (Hugging Face)
  kPanels,  // panels of 16 rows: PanelWeights, Int8Weights, Int4Weights
};

// Rows of one panel of the kPanels layout.
inline constexpr int64_t kPanelRows = 16;

// A borrowed weight matrix (pointing into the mapped checkpoint, or into a
// PanelWeights).
struct WeightMatrix {
  // kF32, kBF16, kI8 or kI4 (kPanels only), or kF16 (kRows, only as the source of
  // Int8Weights::Quantize and of WeightRowToF32: Linear does not take it).
  DType dtype = DType::kF32;
  const void* data = nullptr;
  int64_t rows = 0;  // out_features
  int64_t cols = 0;  // in_features
  WeightLayout layout = WeightLayout::kRows;
  // kI8 and kI4 only: the fp32 scales (see Int8Weights, Int4Weights) and
  // their group along k (0: one scale per output row; kI4: > 0).
  const float* scales = nullptr;
  int64_t group = 0;
  // kI4 with zero points only: one byte per scale (see Int4Weights).
  const uint8_t* zeros = nullptr;

  // Rows as stored: kPanels pads the last panel to 16 rows with zeros.
  int64_t stored_rows() const {
    return layout == WeightLayout::kRows ? rows : (rows + kPanelRows - 1) / kPanelRows * kPanelRows;
  }
  // Scales stored for kI8 and kI4: one per stored row and group.
  int64_t num_scales() const {
    if (dtype != DType::kI8 && dtype != DType::kI4) return 0;
    return stored_rows() * (group == 0 ? 1 : (cols + group - 1) / group);
  }
  // Bytes a pass over the matrix reads: values (int8: k padded to pairs;
  // int4: two a byte, k padded to 32) plus scales (and zero points).
  size_t bytes() const {
    if (dtype == DType::kI4) {
      return static_cast<size_t>(stored_rows() * ((cols + 31) / 32 * 16)) +
             static_cast<size_t>(num_scales()) * (sizeof(float) + (zeros != nullptr ? 1 : 0));
    }
    const int64_t k = dtype == DType::kI8 ? (cols + 1) / 2 * 2 : cols;
    return static_cast<size_t>(stored_rows() * k) * DTypeSize(dtype) +
           static_cast<size_t>(num_scales()) * sizeof(float);
  }
};

// A bf16 matrix repacked into the kPanels layout, owning its memory.
// Panel p holds rows [16p, 16p + 16); within it, for each k in order, 16
// values as 8 pairs (row 16p + l, row 16p + l + 8), l = 0..7, each pair one
// 32-bit word with the first row in the low half. A 256-bit load of one k is
// then the eight low rows after a 16-bit left shift and the eight high rows
// after masking the low halves off.
//
//   PanelWeights packed = PanelWeights::Pack(pool, mapped);  // mapped: kRows bf16
//   Linear(pool, x, m, packed.matrix(), bias, y);
class PanelWeights {
 public:
  // CHECKs that w is bf16 in the kRows layout. Uses the pool's threads.
  static PanelWeights Pack(ThreadPool& pool, const WeightMatrix& w);

  const WeightMatrix& matrix() const { return matrix_; }

 private:
  struct Free {
    void operator()(uint16_t* p) const;
  };
  std::unique_ptr<uint16_t, Free> data_;
  WeightMatrix matrix_;
};

// A matrix quantized to symmetric int8 in the kPanels layout, owning its
// values and scales. For each row and each group of `group` consecutive
// columns (the whole row when group is 0; groups are even), with w the row's
// fp32 values:
//   s = max|w| / 127 (fp32), q = round-half-even(w / s) clamped to
//   [-127, 127] (q = 0 when s = 0), and the dequantized weight is q * s.
// tools/int8_goldens.py implements the same scheme. Layout: panel p holds
// rows [16p, 16p + 16); k is padded with a zero column to an even count and
// each pair (2j, 2j + 1) is 32 bytes: rows 0-7 then 8-15, each row's two
// values together (one 16-byte load sign-extends to vpmaddwd's operand for
// 8 rows). Scales are [stored_rows] for group 0, else [panel][group][16].
//
//   Int8Weights q = Int8Weights::Quantize(pool, mapped, /*group=*/0);
//   Linear(pool, x, m, q.matrix(), bias, y);
class Int8Weights {
 public:
  // CHECKs that w is kRows F32, BF16 or F16 and group >= 0. Uses the pool.
  static Int8Weights Quantize(ThreadPool& pool, const WeightMatrix& w, int64_t group);

  const WeightMatrix& matrix() const { return matrix_; }

 private:
  struct Free {
    void operator()(void* p) const;
  };
  std::unique_ptr<int8_t, Free> data_;
  std::unique_ptr<float, Free> scales_;
  WeightMatrix matrix_;
};

// out[0:cols] = row `row` of w widened to fp32, in any layout (embedding
// lookups in a table that is also a packed lm_head); int8 rows are q * s.
void WeightRowToF32(const WeightMatrix& w, int64_t row, float* out);

// kBf16Dot: bf16 activations (x rounded to bf16 at each call) and fp32
// accumulation on vdpbf16ps, for bf16 panels (other weights run kDot); batch
// invariant, the same bits at every level; see linear_bf16dot.h for the
// arithmetic.
// kInt8Act: as kDot, but int8 layers quantize x to int8 instead of int16,
// one scale per block of 32 columns of a row (max|x| / 127 over the block,
// llama.cpp's Q8_0 block), for vpdpbusd (4 products an instruction and
// lane). Segments are also cut at every block, and each segment's sum S
// goes to fp32 as c = fma(float(S), m, c) with m the block's x scale (one
// weight scale per row, applied at the end without the * s_x) or the
// weight group's scale times it (one rounding); bias as in kDot. Batch
// invariant and the same bits at every level (linear_int8.h,
// linear_int8_act.h).
enum class LinearKernel { kDot, kOpenBlas, kBf16Dot, kInt8Act };

// One layer of a LinearMany call: y = x w^T (+ bias).
struct LinearJob {
  const WeightMatrix* w = nullptr;
  const float* bias = nullptr;  // optional, w->rows entries
  float* y = nullptr;           // [m][w->rows]
};

// y[i][n] = sum_k x[i][k] * w[n][k] (+ bias[n]) for i < m, n < w.rows.
// CHECKs that w.dtype is kF32 or kBF16, or kI8 in panels.
void Linear(ThreadPool& pool, const float* x, int64_t m, const WeightMatrix& w, const float* bias,
            float* y, LinearKernel kernel = LinearKernel::kDot);

// Several layers that read the same x (q/k/v, gate/up) in one parallel loop;
// each job's result is exactly what Linear would give. Every w has the same
// cols.
void LinearMany(ThreadPool& pool, const float* x, int64_t m, const std::vector<LinearJob>& jobs,
                LinearKernel kernel = LinearKernel::kDot);

}  // namespace mmserve::model::cpu

#endif  // MMSERVE_MODEL_CPU_LINEAR_H_
