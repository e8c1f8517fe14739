// Memory bandwidth references for benchmarks, measured with every thread of
// a pool over a footprint the caller chooses (the bytes its kernel reads:
// a decode step's weights, so that a footprint that fits in the L2 or L3 is
// measured there, as the kernel meets it).
//
//   cpu::ThreadPool pool(2);
//   MemoryBandwidth bw = MeasureMemoryBandwidth(pool, step_weight_bytes, /*reps=*/3);
//   double ratio = weight_bytes_per_s / bw.best_read();  // at most 1
//
// copy: memcpy of `bytes` from one buffer to another, counted as STREAM
// does (bytes read + bytes written = 2 * bytes per copy). Reads of `bytes`
// (bytes read), three ways, as a kernel that only reads weights might:
//  - read_sum: a 256-bit vectorized sum, one stream per thread;
//  - read_streams: the widest loads (512-bit where the CPU has them), eight
//    streams per thread at once (eight prefetcher streams, eight lines in
//    flight);
//  - read_nt: the widest non-temporal loads (vmovntdqa), eight streams;
//  - read_cpu_time: read_streams with each thread timing its share on its
//    CPU-time clock and the rates added up (time other processes hold a
//    core left out, as bench/isa_peaks.h counts): on a loaded machine the
//    largest, as a wall-clock rate of the same reads cannot pass it.
// The others are wall-clock timed, every thread of the pool working at
// once. best_read() is the largest: the reference a reading kernel's rate
// is set against. Best of `reps` runs after a warm-up that faults the pages
// in and brings a cache-sized footprint into its cache. Not thread-safe
// (uses the pool).
#ifndef MMSERVE_BENCH_MEMORY_BANDWIDTH_H_
#define MMSERVE_BENCH_MEMORY_BANDWIDTH_H_

#include <cstddef>
#include <string>

#include "model/cpu/thread_pool.h"

namespace mmserve::bench {

struct MemoryBandwidth {
  double copy_bytes_per_s = 0;
  double read_sum_bytes_per_s = 0;
  double read_streams_bytes_per_s = 0;
  double read_nt_bytes_per_s = 0;
  double read_cpu_time_bytes_per_s = 0;
  double best_read() const;
  // "sum", "streams", "nt" or "streams_cpu_time": the method of best_read().
  const char* best_read_method() const;
};

MemoryBandwidth MeasureMemoryBandwidth(model::cpu::ThreadPool& pool, size_t bytes, int reps);

// The bytes MeasureMemoryBandwidth really reads for a footprint of `bytes`:
// `bytes`, up to 8 x the last-level cache (at least 1 GiB). Past every
// cache the rate is the DRAM's whatever the size, and a model of several GB
// would otherwise need its weights' size twice more (the copy's two
// buffers) beside the weights themselves.
size_t SampleBytes(size_t bytes);

// The same in a forked child with its own pool of `threads`, so that the
// buffers never count toward this process's peak RSS. Zeros if the child
// fails. Call it while no other thread of this process is working.
MemoryBandwidth MeasureMemoryBandwidthInChild(int threads, size_t bytes, int reps);

// Where a footprint of `bytes` lives once read repeatedly: "l2" if it fits
// in the L2 of `threads` cores, "l3" if in the last-level cache, else
// "dram" (cache sizes from sysconf; "dram" when unknown).
std::string FootprintLevel(size_t bytes, int threads);

// The compute roofline: fp32 FLOP/s of 256-bit fused multiply-adds on every
// thread of the pool (12 independent chains per thread, registers only, so
// neither memory nor latency limits it), best of `reps`, wall-clock timed.
// bench/isa_peaks.h measures the widest units on each thread's CPU-time
// clock, which a kernel's rate never exceeds: use that for ratios.
double MeasureFmaPeakGflops(model::cpu::ThreadPool& pool, int reps);

}  // namespace mmserve::bench

#endif  // MMSERVE_BENCH_MEMORY_BANDWIDTH_H_
