// The int8-activation kernels of Linear (LinearKernel::kInt8Act) on
// AVX512-VNNI's vpdpbusd, 512-bit (a detail of model/cpu: include
// linear.h).
//
// vpdpbusd multiplies unsigned bytes by signed bytes, 4 products into each
// of 16 int32 lanes an instruction (64 where vpdpwssd on ymm does 16). x
// goes in offset, x_q + 128 (QuantizedRows::u8), the weights as they are,
// and each segment's sum is taken back by 128 x (the segment's sum of each
// output's weights): the exact integer sum of x_q * w_q per segment that
// linear_int8.cc's kernels get, so the same fp32 operations after it and
// the same bits (linear.h has the arithmetic).
//
// Rows of x run in register tiles of up to 6 rows by 4 panels (64 outputs,
// 24 zmm accumulators), each tile over all of k with its outputs in L1;
// each task first puts its panels' weights in vpdpbusd's 4-column form
// (and their segment sums) once for all its row tiles. One row (decode)
// does not come here: linear_int8.cc's pair kernels stream the panels as
// stored, with prefetching, on the same int8 values (exact sums, the same
// bits). Streaming them through vpdpbusd needed a vpermw per 64 bytes, a
// second vpdpbusd for the offset and one dependent accumulator, and ran
// at under half their rate.
#ifndef MMSERVE_MODEL_CPU_LINEAR_INT8_ACT_H_
#define MMSERVE_MODEL_CPU_LINEAR_INT8_ACT_H_

#include <cstdint>

#include "model/cpu/linear.h"
#include "model/cpu/linear_int8.h"

namespace mmserve::model::cpu::internal {

// Output columns of int8 panels [p0, p1) of one job, for every row of x;
// linear_int8.h's Int8PanelColumns when m > 1, x.u8 is set, job.w->group %
// 4 == 0 and Int8ActUsesVnni512(). The CPU must have AVX512-VNNI.
void Int8ActPanelColumns(const QuantizedRows& x, int64_t m, const LinearJob& job, int64_t p0,
                         int64_t p1);

}  // namespace mmserve::model::cpu::internal

#endif  // MMSERVE_MODEL_CPU_LINEAR_INT8_ACT_H_
