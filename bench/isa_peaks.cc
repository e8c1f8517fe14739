#include "bench/isa_peaks.h"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "common/clock.h"
#include "model/cpu/cpu_isa.h"

namespace mmserve::bench {
namespace {

constexpr int64_t kIterations = 10'000'000;
constexpr int kChains = 16;

// Best rate over reps of `run` on every thread, where one call of run does
// kIterations x kChains instructions of ops_per_instruction operations and
// returns a value that keeps the loop alive.
template <typename Run>
double Rate(model::cpu::ThreadPool& pool, int reps, double ops_per_instruction, Run run) {
  double best = 0;
  for (int r = 0; r < reps; ++r) {
    std::atomic<int64_t> sink{0};
    Stopwatch sw;
    pool.ParallelFor(pool.num_threads(), 1, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) sink += run(static_cast<int>(t));
    });
    const double ops = ops_per_instruction * kChains * kIterations * pool.num_threads();
    best = std::max(best, ops / sw.ElapsedSeconds() / 1e9);
  }
  return best;
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

IsaPeaks MeasureIsaPeaks(model::cpu::ThreadPool& pool, int reps) {
  const model::cpu::CpuFeatures& f = model::cpu::DetectedCpuFeatures();
  IsaPeaks peaks;
  if (!f.avx512) return peaks;
  peaks.fma512_gflops = Rate(pool, reps, 32, &Fma512);
  if (f.avx512_bf16) peaks.bf16dot_gflops = Rate(pool, reps, 64, &Bf16Dot);
  if (f.avx512_vnni) {
    peaks.vnni_gops = Rate(pool, reps, 128, &VnniU8);
    peaks.vnni_int16_gops = Rate(pool, reps, 32, &VnniInt16);
  }
  return peaks;
}

}  // namespace mmserve::bench
