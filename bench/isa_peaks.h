// Compute rooflines of the CPU's widest units, on every thread of a pool:
// what lm_bench, linear_bench and vision_bench set the kernels' rates
// against.
//
//   IsaPeaks peaks = MeasureIsaPeaks(pool, /*reps=*/3);
//   double ratio = kernel_gflops / peaks.fma512_gflops;
//
// Each figure is one instruction back to back in 16 independent register
// chains per thread (neither memory nor latency limits it: 16 covers a
// 4-6 cycle latency on two pipes, the most any of these CPUs has), best of `reps`,
// counted as 2 operations per multiply-add; each thread times its own loop
// on its CPU-time clock (time other processes hold its core left out) and
// the threads' rates add up: what the cores can do, however loaded the
// machine, so a kernel's rate under load is a smaller fraction of it. The rates are measured, not
// derived from the CPU model, so a unit that runs 512-bit instructions as two 256-bit halves (Zen
// 4) and one that runs them at full width (Zen 5, Intel) each get their own figure.
//  - fma256: vfmadd231ps on ymm, 8 lanes (16 FLOPs an instruction), the
//    AVX2 level's; measured wherever the CPU has AVX2;
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
//
// A rate timed on the wall clock (all threads of the same pool working)
// cannot pass the peak of the instruction it runs on, so PeakRatio fails
// rather than report a ratio above 1: such a ratio means the peak was
// measured wrong, and clamping it would hide that.
#ifndef MMSERVE_BENCH_ISA_PEAKS_H_
#define MMSERVE_BENCH_ISA_PEAKS_H_

#include <string_view>

#include "absl/status/statusor.h"
#include "model/cpu/thread_pool.h"

namespace mmserve::bench {

struct IsaPeaks {
  double fma256_gflops = 0;
  double fma512_gflops = 0;
  double bf16dot_gflops = 0;
  double vnni_gops = 0;
  double vnni_loop_gops = 0;
  double vnni_tile_gops = 0;
  double vnni_int16_gops = 0;
  // The widest fp32 FMA the CPU reaches: max(fma256, fma512) (on Zen 4 the
  // two are about equal; on Zen 5 and Intel fma512 is about twice fma256).
  double widest_fma_gflops() const;
  // The largest of every figure: no kernel, whatever it runs on, passes it.
  double top_gops() const;
};

IsaPeaks MeasureIsaPeaks(model::cpu::ThreadPool& pool, int reps);

// rate / peak. InvalidArgument if peak is not positive (not measured);
// FailedPrecondition naming `what` if rate > peak.
absl::StatusOr<double> PeakRatio(std::string_view what, double rate, double peak);

}  // namespace mmserve::bench

#endif  // MMSERVE_BENCH_ISA_PEAKS_H_
