// Group-wise 4-bit weights for Linear (linear.h), quantized once at load,
// and the kernels that multiply them with int8 activations.
//
//   Int4Weights q = Int4Weights::Quantize(pool, mapped, {/*group=*/32, /*zero_point=*/true});
//   Linear(pool, x, m, q.matrix(), bias, y);
//
// Quantization, for each row and each group of `group` consecutive columns
// (group a multiple of kInt4Block; the last group may be short), with w the
// group's fp32 values and round() round-half-even:
//  - symmetric: s = max|w| / 7, q = clamp(round(w / s), -7, 7), stored as
//    the nibble u = q + 8 with the implied zero point z = 8;
//  - with zero points: lo = min(0, min w), hi = max(0, max w),
//    s = (hi - lo) / 15, z = clamp(round(-lo / s), 0, 15),
//    u = clamp(round(w / s) + z, 0, 15), z stored per group and row.
// The dequantized weight is (u - z) * s (0 when s = 0). Scales are fp32.
//
// Arithmetic: x is quantized as kInt8Act does (linear_int8.h's
// QuantizeRows: int8, one scale s_x per kInt4Block columns). For each
// block b of 32 columns, within weight group g, the exact int32 sum
//   S = sum u * x_q - z * sum x_q
// (vpdpbusd takes the nibbles as its unsigned operand and x_q as the
// signed one) goes to fp32 once: c = fma(float(S), s_g * s_x[b], c), from
// c = 0 in increasing k, then y = c + bias. Integer sums are exact in any
// order, so the AVX-512 VNNI, AVX2 (vpmaddubsw + vpmaddwd) and scalar
// paths give the same bits, and a row's result does not depend on the
// batch around it (batch invariance). LinearKernel is ignored: int4 layers
// always take int8 activations.
//
// Layout: panels of 16 rows (as every kPanels matrix); k padded with zeros
// to a multiple of 32; each octet of columns [8j, 8j + 8) is 64 bytes, row l
// at bytes 4l..4l+3, byte t holding u[8j + t] in its low nibble and
// u[8j + 4 + t] in its high one. One 512-bit load is then 16 rows x 8
// columns: an AND gives vpdpbusd's operand for columns 8j..8j+3, a shift
// and an AND the one for 8j+4..8j+7. Scales (and zero points, one byte
// each) are [panel][group][16].
#ifndef MMSERVE_MODEL_CPU_LINEAR_INT4_H_
#define MMSERVE_MODEL_CPU_LINEAR_INT4_H_

#include <cstdint>
#include <memory>

#include "model/cpu/linear.h"
#include "model/cpu/linear_int8.h"
#include "model/cpu/thread_pool.h"

namespace mmserve::model::cpu {

// Columns per activation scale of an int4 layer, and the unit k is padded
// to: kInt8Act's block.
inline constexpr int64_t kInt4Block = internal::kInt8ActBlock;

struct Int4Scheme {
  int64_t group = 32;  // columns per weight scale: a positive multiple of kInt4Block
  bool zero_point = false;
};

class Int4Weights {
 public:
  // CHECKs that w is kRows F32, BF16 or F16 and the group a positive
  // multiple of kInt4Block. Uses the pool's threads.
  static Int4Weights Quantize(ThreadPool& pool, const WeightMatrix& w, const Int4Scheme& scheme);

  const WeightMatrix& matrix() const { return matrix_; }

 private:
  struct Free {
    void operator()(void* p) const;
  };
  std::unique_ptr<uint8_t, Free> data_;
  std::unique_ptr<float, Free> scales_;
  std::unique_ptr<uint8_t, Free> zeros_;
  WeightMatrix matrix_;
};

namespace internal {

// x prepared for int4 layers: row i's int8 values at q[i * stride] (zero
// past cols; stride a multiple of kInt4Block), and per block b of
// kInt4Block columns its scale scale[i * blocks + b] and the sum of its
// values sums[i * blocks + b], blocks = stride / kInt4Block. The storage is
// the calling thread's and lives until its next call.
struct Int4Rows {
  const int8_t* q = nullptr;
  int64_t stride = 0;
  int64_t blocks = 0;
  const float* scale = nullptr;
  const int32_t* sums = nullptr;
};

// From QuantizeRows(pool, x, m, cols, 127, kInt4Block).
Int4Rows PrepareInt4Rows(ThreadPool& pool, const QuantizedRows& x, int64_t m, int64_t cols);

// Output columns of int4 panels [p0, p1) of one job, for every row of x.
void Int4PanelColumns(const Int4Rows& x, int64_t m, const LinearJob& job, int64_t p0, int64_t p1);

// Whether the int4 kernels run on AVX512-VNNI (the kAvx512 level on a CPU
// with it) rather than AVX2: the same exact sums, so the same results.
bool Int4UsesVnni();

// out[0:cols] = row `row` of an int4 matrix dequantized: (u - z) * s.
void Int4RowToF32(const WeightMatrix& w, int64_t row, float* out);

}  // namespace internal
}  // namespace mmserve::model::cpu

#endif  // MMSERVE_MODEL_CPU_LINEAR_INT4_H_
