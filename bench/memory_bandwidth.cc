#include "bench/memory_bandwidth.h"

#include <immintrin.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <vector>

#include "common/clock.h"

namespace mmserve::bench {
namespace {

constexpr int64_t kChunk = 1 << 20;  // bytes per parallel-for item

float SumChunk(const float* p, int64_t n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(),
         a3 = _mm256_setzero_ps();
  for (int64_t i = 0; i + 32 <= n; i += 32) {
    a0 = _mm256_add_ps(a0, _mm256_loadu_ps(p + i));
    a1 = _mm256_add_ps(a1, _mm256_loadu_ps(p + i + 8));
    a2 = _mm256_add_ps(a2, _mm256_loadu_ps(p + i + 16));
    a3 = _mm256_add_ps(a3, _mm256_loadu_ps(p + i + 24));
  }
  __m256 s = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
  float out[8];
  _mm256_storeu_ps(out, s);
  return out[0] + out[1] + out[2] + out[3] + out[4] + out[5] + out[6] + out[7];
}

}  // namespace

MemoryBandwidth MeasureMemoryBandwidth(model::cpu::ThreadPool& pool, size_t bytes, int reps) {
  const int64_t chunks = static_cast<int64_t>(bytes) / kChunk;
  std::vector<char> src(chunks * kChunk, 1), dst(chunks * kChunk, 0);
  MemoryBandwidth best;
  std::vector<float> sums(chunks);
  for (int r = 0; r <= reps; ++r) {  // r == 0 warms up
    Stopwatch copy_watch;
    pool.ParallelFor(chunks, 1, [&](int64_t b, int64_t e) {
      for (int64_t c = b; c < e; ++c) std::memcpy(&dst[c * kChunk], &src[c * kChunk], kChunk);
    });
    const double copy_s = copy_watch.ElapsedSeconds();
    Stopwatch read_watch;
    pool.ParallelFor(chunks, 1, [&](int64_t b, int64_t e) {
      for (int64_t c = b; c < e; ++c) {
        sums[c] = SumChunk(reinterpret_cast<const float*>(&src[c * kChunk]), kChunk / 4);
      }
    });
    const double read_s = read_watch.ElapsedSeconds();
    if (r == 0) continue;
    best.copy_bytes_per_s = std::max(best.copy_bytes_per_s, 2.0 * chunks * kChunk / copy_s);
    best.read_bytes_per_s = std::max(best.read_bytes_per_s, 1.0 * chunks * kChunk / read_s);
  }
  volatile float sink = sums[0];
  (void)sink;
  return best;
}

MemoryBandwidth MeasureMemoryBandwidthInChild(int threads, size_t bytes, int reps) {
  int fds[2];
  MemoryBandwidth result;
  if (pipe(fds) != 0) return result;
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    model::cpu::ThreadPool pool(threads);
    const MemoryBandwidth bw = MeasureMemoryBandwidth(pool, bytes, reps);
    const ssize_t n = write(fds[1], &bw, sizeof(bw));
    _exit(n == sizeof(bw) ? 0 : 1);
  }
  close(fds[1]);
  if (pid > 0) {
    if (read(fds[0], &result, sizeof(result)) != sizeof(result)) result = MemoryBandwidth();
    waitpid(pid, nullptr, 0);
  }
  close(fds[0]);
  return result;
}

double MeasureFmaPeakGflops(model::cpu::ThreadPool& pool, int reps) {
  constexpr int64_t kIterations = 20'000'000;
  constexpr int kChains = 12;
  double best = 0;
  for (int r = 0; r < reps; ++r) {
    std::atomic<int64_t> sink{0};
    Stopwatch sw;
    pool.ParallelFor(pool.num_threads(), 1, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        __m256 acc[kChains];
        for (int c = 0; c < kChains; ++c) acc[c] = _mm256_set1_ps(static_cast<float>(c + t));
        const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
        for (int64_t i = 0; i < kIterations; ++i) {
          _Pragma("GCC unroll 12") for (int c = 0; c < kChains; ++c) {
            acc[c] = _mm256_fmadd_ps(acc[c], a, b);
          }
        }
        __m256 sum = acc[0];
        for (int c = 1; c < kChains; ++c) sum = _mm256_add_ps(sum, acc[c]);
        sink += static_cast<int64_t>(_mm256_cvtss_f32(sum));  // keeps the loop alive
      }
    });
    const double flops = 2.0 * 8 * kChains * kIterations * pool.num_threads();
    best = std::max(best, flops / sw.ElapsedSeconds() / 1e9);
  }
  return best;
}

}  // namespace mmserve::bench
