#include "bench/isa_peaks.h"

#include <immintrin.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "model/cpu/cpu_isa.h"
#include "model/cpu/linear_int8.h"

namespace mmserve::bench {
namespace {

constexpr int64_t kIterations = 10'000'000;
constexpr int kChains = 16;
// Passes of the int8-activation tile's inner loop per thread (about 0.1 s).
constexpr int64_t kInnerLoopReps = 100'000;

// The calling thread's CPU time in seconds: a loop's time on it leaves out
// the time other processes held the core.
double ThreadSeconds() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// Best over reps of the summed per-thread rates of `run`, which returns the
// operations it did and a value that keeps it alive.
template <typename Run>
double ThreadRate(model::cpu::ThreadPool& pool, int reps, Run run) {
  double best = 0;
  for (int r = 0; r < reps; ++r) {
    std::vector<double> rates(pool.num_threads(), 0.0);
    std::atomic<int64_t> sink{0};
    pool.ParallelFor(pool.num_threads(), 1, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        const double start = ThreadSeconds();
        const auto [ops, kept] = run(static_cast<int>(t));
        rates[t] = ops / (ThreadSeconds() - start) / 1e9;
        sink += kept;
      }
    });
    double sum = 0;
    for (double rate : rates) sum += rate;
    best = std::max(best, sum);
  }
  return best;
}

// Best rate over reps of `run` on every thread, where one call of run does
// kIterations x kChains instructions of ops_per_instruction operations and
// returns a value that keeps the loop alive. Each thread times its own
// call on its own CPU-time clock and the rates add up: neither a worker
// still waking nor a neighbour's process on the core lowers the figure.
template <typename Run>
double Rate(model::cpu::ThreadPool& pool, int reps, double ops_per_instruction, Run run) {
  const double ops = ops_per_instruction * kChains * kIterations;
  return ThreadRate(pool, reps, [&](int thread) {
    const int64_t kept = run(thread);
    return std::pair{ops, kept};
  });
}

int64_t Fma256(int seed) {
  __m256 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm256_set1_ps(static_cast<float>(c + seed));
  const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
  for (int64_t i = 0; i < kIterations; ++i) {
    _Pragma("GCC unroll 16") for (int c = 0; c < kChains; ++c) {
      acc[c] = _mm256_fmadd_ps(acc[c], a, b);
    }
  }
  __m256 sum = acc[0];
  for (int c = 1; c < kChains; ++c) sum = _mm256_add_ps(sum, acc[c]);
  return static_cast<int64_t>(_mm256_cvtss_f32(sum));
}

#if defined(__clang__)
#pragma clang attribute push(                                                            \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx512bf16"))), \
    apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx512bf16")
#endif

// Lane 0 of v (the unmasked reductions and extracts trip GCC 12's
// uninitialized warnings).
float Lane0(__m512 v) {
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, v);
  return lanes[0];
}

int64_t Fma512(int seed) {
  __m512 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_ps(static_cast<float>(c + seed));
  const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
  for (int64_t i = 0; i < kIterations; ++i) {
    _Pragma("GCC unroll 16") for (int c = 0; c < kChains; ++c) {
      acc[c] = _mm512_fmadd_ps(acc[c], a, b);
    }
  }
  __m512 sum = acc[0];
  for (int c = 1; c < kChains; ++c) sum = _mm512_add_ps(sum, acc[c]);
  return static_cast<int64_t>(Lane0(sum));
}

int64_t Bf16Dot(int seed) {
  __m512 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_ps(static_cast<float>(c + seed));
  // 0x3F80 is bf16 1.0, 0x3380 about 6e-8: acc grows slowly and stays finite.
  const __m512bh a = reinterpret_cast<__m512bh>(_mm512_set1_epi16(0x3F80));
  const __m512bh b = reinterpret_cast<__m512bh>(_mm512_set1_epi16(0x3380));
  for (int64_t i = 0; i < kIterations; ++i) {
    _Pragma("GCC unroll 16") for (int c = 0; c < kChains; ++c) {
      acc[c] = _mm512_dpbf16_ps(acc[c], a, b);
    }
  }
  __m512 sum = acc[0];
  for (int c = 1; c < kChains; ++c) sum = _mm512_add_ps(sum, acc[c]);
  return static_cast<int64_t>(Lane0(sum));
}

int64_t VnniU8(int seed) {
  __m512i acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_epi32(c + seed);
  const __m512i a = _mm512_set1_epi8(1), b = _mm512_set1_epi8(-1);
  for (int64_t i = 0; i < kIterations; ++i) {
    _Pragma("GCC unroll 16") for (int c = 0; c < kChains; ++c) {
      acc[c] = _mm512_dpbusd_epi32(acc[c], a, b);
    }
  }
  __m512i sum = acc[0];
  for (int c = 1; c < kChains; ++c) sum = _mm512_add_epi32(sum, acc[c]);
  alignas(64) int32_t lanes[16];
  _mm512_store_si512(lanes, sum);
  return lanes[0];
}

int64_t VnniInt16(int seed) {
  __m256i acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm256_set1_epi32(c + seed);
  const __m256i a = _mm256_set1_epi16(1), b = _mm256_set1_epi16(-1);
  for (int64_t i = 0; i < kIterations; ++i) {
    _Pragma("GCC unroll 16") for (int c = 0; c < kChains; ++c) {
      acc[c] = _mm256_dpwssd_epi32(acc[c], a, b);
    }
  }
  __m256i sum = acc[0];
  for (int c = 1; c < kChains; ++c) sum = _mm256_add_epi32(sum, acc[c]);
  return _mm256_extract_epi32(sum, 0);
}

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

}  // namespace

double IsaPeaks::widest_fma_gflops() const { return std::max(fma256_gflops, fma512_gflops); }

double IsaPeaks::top_gops() const {
  return std::max({fma256_gflops, fma512_gflops, bf16dot_gflops, vnni_gops, vnni_int16_gops});
}

absl::StatusOr<double> PeakRatio(std::string_view what, double rate, double peak) {
  if (!(peak > 0)) {
    return absl::InvalidArgumentError(absl::StrFormat("%s: no peak measured", what));
  }
  if (rate > peak) {
    return absl::FailedPreconditionError(
        absl::StrFormat("%s: %.2f is above its peak %.2f (ratio %.3f): the peak is measured wrong",
                        what, rate, peak, rate / peak));
  }
  return rate / peak;
}

IsaPeaks MeasureIsaPeaks(model::cpu::ThreadPool& pool, int reps) {
  const model::cpu::CpuFeatures& f = model::cpu::DetectedCpuFeatures();
  IsaPeaks peaks;
  if (f.avx2) peaks.fma256_gflops = Rate(pool, reps, 16, &Fma256);
  if (!f.avx512) return peaks;
  peaks.fma512_gflops = Rate(pool, reps, 32, &Fma512);
  if (f.avx512_bf16) peaks.bf16dot_gflops = Rate(pool, reps, 64, &Bf16Dot);
  if (f.avx512_vnni) {
    // The kernel's own loop from L1 bounds the peak from below: on a CPU
    // where the bare instruction loop misses the issue rate the kernel
    // reaches, a ratio to it would pass 1.
    const double tile = ThreadRate(pool, reps, [](int) {
      return std::pair{model::cpu::internal::Int8ActInnerLoop(kInnerLoopReps), int64_t{0}};
    });
    peaks.vnni_loop_gops = Rate(pool, reps, 128, &VnniU8);
    peaks.vnni_tile_gops = tile;
    peaks.vnni_gops = std::max(peaks.vnni_loop_gops, tile);
    peaks.vnni_int16_gops = Rate(pool, reps, 32, &VnniInt16);
  }
  return peaks;
}

}  // namespace mmserve::bench
