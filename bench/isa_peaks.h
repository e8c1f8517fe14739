// Compute rooflines of the CPU's widest units, on every thread of a pool:
// what lm_bench and linear_bench set the kernels' rates against.
//
//   IsaPeaks peaks = MeasureIsaPeaks(pool, /*reps=*/3);
//   double ratio = kernel_gflops / peaks.fma512_gflops;
//
// Each figure is one instruction back to back in 16 independent register
// chains per thread (neither memory nor latency limits it), best of `reps`,
// counted as 2 operations per multiply-add; each thread times its own loop
// on its CPU-time clock (time other processes hold its core left out) and
// the threads' rates add up: what the cores can do, however loaded the
// machine, so a kernel's rate under load is a smaller fraction of it. The rates are measured, not
// derived from the CPU model, so a unit that runs 512-bit instructions as two 256-bit halves (Zen
// 4) and one that runs them at full width (Zen 5, Intel) each get their own figure.
//  - fma512: vfmadd231ps on zmm, 16 lanes (32 FLOPs an instruction);
//  - bf16dot: vdpbf16ps on zmm, 32 bf16 pairs into 16 fp32 lanes (64);
//  - vnni: vpdpbusd on zmm, 64 u8 x s8 products into 16 int32 lanes (128):
//    the larger of the bare instruction loop (vnni_loop) and the
//    int8-activation kernel's own register tile from L1 (vnni_tile,
//    linear_int8.h's Int8ActInnerLoop), so that the kernel's whole rate,
//    which adds memory traffic and epilogues to that tile, cannot exceed it;
//  - vnni_int16: vpdpwssd on ymm, 16 int16 products (32), the instruction of
//    the int16-activation int8 kernels (linear_int8.cc) at the kAvx512
//    level.
// A figure the CPU has no instruction for is 0. Not thread-safe (uses the
// pool).
#ifndef MMSERVE_BENCH_ISA_PEAKS_H_
#define MMSERVE_BENCH_ISA_PEAKS_H_

#include "model/cpu/thread_pool.h"

namespace mmserve::bench {

struct IsaPeaks {
  double fma512_gflops = 0;
  double bf16dot_gflops = 0;
  double vnni_gops = 0;
  double vnni_loop_gops = 0;
  double vnni_tile_gops = 0;
  double vnni_int16_gops = 0;
};

IsaPeaks MeasureIsaPeaks(model::cpu::ThreadPool& pool, int reps);

}  // namespace mmserve::bench

#endif  // MMSERVE_BENCH_ISA_PEAKS_H_
