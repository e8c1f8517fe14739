// The int8 kernels behind Linear (a detail of model/cpu: include linear.h).
//
// An int8 layer computes with integer dot products: every row of x is
// quantized to int16 with its own scale (QuantizeRows; kInt8Act: int8 with
// one scale per kInt8ActBlock columns), and each product of
// an int16 activation and an int8 weight is summed exactly in int32 by
// vpmaddwd, 16 multiply-adds per instruction against the 8 of an fp32 FMA.
// See linear.h for the numbers an output element gets.
#ifndef MMSERVE_MODEL_CPU_LINEAR_INT8_H_
#define MMSERVE_MODEL_CPU_LINEAR_INT8_H_

#include <cstdint>

#include "model/cpu/linear.h"
#include "model/cpu/thread_pool.h"

namespace mmserve::model::cpu::internal {

// The int32 sums of a tile restart every kInt8Segment steps of k (and at
// every weight group's and activation block's start): 256 products of |q| <= 32767 and |w| <= 127
// stay below 2^31 (1.07e9), whatever the values.
inline constexpr int64_t kInt8Segment = 256;

// Panels per parallel task when x has one row (decode): 16 (256 outputs,
// 224 KiB at k = 896) streamed one after another beat 4 by 15% in tokens
// per second and 32-64 lose to imbalance on the small matrices.
inline constexpr int64_t kRowPanelsPerTask = 16;

// Columns per activation scale in the int8-activation mode (kInt8Act):
// llama.cpp's Q8_0 block. An outlier then coarsens the steps of its own 32
// columns only, where one scale per row let it coarsen the whole row.
inline constexpr int64_t kInt8ActBlock = 32;

// x quantized for one Linear call: row i is q[i * stride ...] (zero-padded
// past cols to stride, a multiple of 16), in blocks of `block` columns (0:
// the whole row is one block) whose scales are scale[i * scale_stride + b].
struct QuantizedRows {
  const int16_t* q = nullptr;
  int64_t stride = 0;
  const float* scale = nullptr;
  int64_t block = 0;
  int64_t scale_stride = 1;
  // Int8-activation mode (max_q 127): the same values plus 128 as bytes
  // (vpdpbusd's unsigned operand), row i at u8[i * stride].
  const uint8_t* u8 = nullptr;

  // The scale of row i's block holding column k.
  const float* ScaleAt(int64_t i, int64_t k) const {
    return scale + i * scale_stride + (block > 0 ? k / block : 0);
  }
};

// Quantizes x [m][cols] block by block (block 0: row by row): s = max|x| /
// Q and q = the nearest integer (ties to even) to x * (Q / max|x|), Q =
// max_q (32767, or 127 for int8 activations), over the block; a zero block
// gets s = 0, a block holding an infinity or NaN s = NaN (its outputs
// become NaN, as they would in fp32). block is 0 or a multiple of 4 that
// divides kInt8Segment. The storage is the calling thread's and lives until
// its next call.
QuantizedRows QuantizeRows(ThreadPool& pool, const float* x, int64_t m, int64_t cols,
                           int max_q = 32767, int64_t block = 0);

// Output columns of int8 panels [p0, p1) of one job, for every row of x.
void Int8PanelColumns(const QuantizedRows& x, int64_t m, const LinearJob& job, int64_t p0,
                      int64_t p1);

// The integer products run on AVX512-VNNI's vpdpwssd at the kAvx512 level
// on a CPU with VNNI (cpu_isa.h), else on AVX2's vpmaddwd + vpaddd: the same
// exact sums, so the same results to the bit. Tests switch levels to show it.
bool Int8UsesVnni();
// Int8 activations (x.u8 set) run vpdpbusd on 512-bit registers at the
// kAvx512 level with VNNI (x + 128 times the weights, and the offset's
// 128 * sum(w) taken back per segment and output), else the kernels above
// on the same values: the same exact sums either way.
bool Int8ActUsesVnni512();

// The int8-activation tile's inner loop alone, for rooflines: `reps` passes
// of its 6-row x 4-panel register tile over 256 columns held in L1 (the
// kernel's own instruction mix: weight loads, x broadcasts, vpdpbusd).
// Returns the integer operations done, 2 per multiply-add; its rate is what
// bench/isa_peaks.h's vpdpbusd peak can be no lower than. The CPU must have
// AVX512-VNNI.
double Int8ActInnerLoop(int64_t reps);

// out[0:cols] = row `row` of an int8 matrix dequantized: q * s.
void Int8RowToF32(const WeightMatrix& w, int64_t row, float* out);

}  // namespace mmserve::model::cpu::internal

#endif  // MMSERVE_MODEL_CPU_LINEAR_INT8_H_
