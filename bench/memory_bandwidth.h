// Memory bandwidth baselines for benchmarks, measured with every thread of a
// pool on buffers far larger than the last-level cache.
//
//   cpu::ThreadPool pool(2);
//   MemoryBandwidth bw = MeasureMemoryBandwidth(pool, 256 << 20, /*reps=*/5);
//   double ratio = achieved_bytes_per_s / bw.copy_bytes_per_s;
//
// copy: memcpy of `bytes` from one buffer to another, counted as STREAM
// does (bytes read + bytes written = 2 * bytes per copy). read: a vectorized
// sum over `bytes` (bytes read). Best of `reps` runs after a warm-up that
// faults the pages in. Not thread-safe (uses the pool).
#ifndef MMSERVE_BENCH_MEMORY_BANDWIDTH_H_
#define MMSERVE_BENCH_MEMORY_BANDWIDTH_H_

#include <cstddef>

#include "model/cpu/thread_pool.h"

namespace mmserve::bench {

struct MemoryBandwidth {
  double copy_bytes_per_s = 0;
  double read_bytes_per_s = 0;
};

MemoryBandwidth MeasureMemoryBandwidth(model::cpu::ThreadPool& pool, size_t bytes, int reps);

// The same in a forked child with its own pool of `threads`, so that the
// buffers never count toward this process's peak RSS. Zeros if the child
// fails. Call it while no other thread of this process is working.
MemoryBandwidth MeasureMemoryBandwidthInChild(int threads, size_t bytes, int reps);

// The compute roofline: fp32 FLOP/s of 256-bit fused multiply-adds on every
// thread of the pool (12 independent chains per thread, registers only, so
// neither memory nor latency limits it), best of `reps`.
double MeasureFmaPeakGflops(model::cpu::ThreadPool& pool, int reps);

}  // namespace mmserve::bench

#endif  // MMSERVE_BENCH_MEMORY_BANDWIDTH_H_
