#include "bench/memory_bandwidth.h"

#include <immintrin.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "common/clock.h"
#include "model/cpu/cpu_isa.h"

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

constexpr int kStreams = 8;

// XORs of 64-byte lines of [p, p + n) read as kStreams streams at once
// (each an n / kStreams slice), with 256-bit loads, non-temporal or not.
template <bool kNonTemporal>
int64_t ReadStreams256(const char* p, int64_t n) {
  const int64_t slice = n / kStreams;
  __m256i acc[kStreams];
  for (int s = 0; s < kStreams; ++s) acc[s] = _mm256_setzero_si256();
  for (int64_t i = 0; i + 64 <= slice; i += 64) {
    _Pragma("GCC unroll 8") for (int s = 0; s < kStreams; ++s) {
      const __m256i* a = reinterpret_cast<const __m256i*>(p + s * slice + i);
      if constexpr (kNonTemporal) {
        acc[s] = _mm256_xor_si256(acc[s], _mm256_stream_load_si256(a));
        acc[s] = _mm256_xor_si256(acc[s], _mm256_stream_load_si256(a + 1));
      } else {
        acc[s] = _mm256_xor_si256(acc[s], _mm256_load_si256(a));
        acc[s] = _mm256_xor_si256(acc[s], _mm256_load_si256(a + 1));
      }
    }
  }
  __m256i x = acc[0];
  for (int s = 1; s < kStreams; ++s) x = _mm256_xor_si256(x, acc[s]);
  return _mm256_extract_epi64(x, 0);
}

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f")
#endif

template <bool kNonTemporal>
int64_t ReadStreams512(const char* p, int64_t n) {
  const int64_t slice = n / kStreams;
  __m512i acc[kStreams];
  for (int s = 0; s < kStreams; ++s) acc[s] = _mm512_setzero_si512();
  for (int64_t i = 0; i + 64 <= slice; i += 64) {
    _Pragma("GCC unroll 8") for (int s = 0; s < kStreams; ++s) {
      const void* a = p + s * slice + i;
      const __m512i v =
          kNonTemporal ? _mm512_stream_load_si512(const_cast<void*>(a)) : _mm512_load_si512(a);
      acc[s] = _mm512_xor_si512(acc[s], v);
    }
  }
  __m512i x = acc[0];
  for (int s = 1; s < kStreams; ++s) x = _mm512_xor_si512(x, acc[s]);
  alignas(64) int64_t lanes[8];
  _mm512_store_si512(lanes, x);
  return lanes[0];
}

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

int64_t ReadStreams(bool avx512, bool non_temporal, const char* p, int64_t n) {
  if (avx512) return non_temporal ? ReadStreams512<true>(p, n) : ReadStreams512<false>(p, n);
  return non_temporal ? ReadStreams256<true>(p, n) : ReadStreams256<false>(p, n);
}

// The calling thread's CPU time in seconds (time other processes hold its
// core left out).
double ThreadSeconds() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

struct FreeDeleter {
  void operator()(char* p) const { std::free(p); }
};

// `bytes` of 64-byte aligned memory, every byte set to `value`.
std::unique_ptr<char, FreeDeleter> Buffer(int64_t bytes, char value) {
  char* p = static_cast<char*>(std::aligned_alloc(64, bytes));
  std::memset(p, value, bytes);
  return std::unique_ptr<char, FreeDeleter>(p);
}

}  // namespace

double MemoryBandwidth::best_read() const {
  return std::max({read_sum_bytes_per_s, read_streams_bytes_per_s, read_nt_bytes_per_s,
                   read_cpu_time_bytes_per_s});
}

const char* MemoryBandwidth::best_read_method() const {
  const double best = best_read();
  if (best == read_cpu_time_bytes_per_s) return "streams_cpu_time";
  if (best == read_nt_bytes_per_s) return "nt";
  if (best == read_streams_bytes_per_s) return "streams";
  return "sum";
}

MemoryBandwidth MeasureMemoryBandwidth(model::cpu::ThreadPool& pool, size_t bytes, int reps) {
  bytes = SampleBytes(bytes);
  const int64_t chunks = std::max<int64_t>(1, static_cast<int64_t>(bytes) / kChunk);
  const int64_t total = chunks * kChunk;
  const auto src = Buffer(total, 1), dst = Buffer(total, 0);
  const bool avx512 = model::cpu::DetectedCpuFeatures().avx512;
  MemoryBandwidth best;
  std::vector<int64_t> kept(chunks);
  // Seconds of one parallel pass of `chunk` over every chunk.
  auto timed = [&](auto chunk) {
    Stopwatch watch;
    pool.ParallelFor(chunks, 1, [&](int64_t b, int64_t e) {
      for (int64_t c = b; c < e; ++c) chunk(c);
    });
    return watch.ElapsedSeconds();
  };
  for (int r = 0; r <= reps; ++r) {  // r == 0 warms up
    const double copy_s = timed(
        [&](int64_t c) { std::memcpy(dst.get() + c * kChunk, src.get() + c * kChunk, kChunk); });
    const double sum_s = timed([&](int64_t c) {
      kept[c] = static_cast<int64_t>(
          SumChunk(reinterpret_cast<const float*>(src.get() + c * kChunk), kChunk / 4));
    });
    const double streams_s = timed(
        [&](int64_t c) { kept[c] ^= ReadStreams(avx512, false, src.get() + c * kChunk, kChunk); });
    const double nt_s = timed(
        [&](int64_t c) { kept[c] ^= ReadStreams(avx512, true, src.get() + c * kChunk, kChunk); });
    // Eight streams again, each thread reading its share on its CPU-time
    // clock, the rates added up: what the threads read while they run, as
    // the peaks of bench/isa_peaks.h count.
    const int threads = pool.num_threads();
    std::vector<double> rates(threads, 0.0);
    pool.ParallelFor(threads, 1, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        const int64_t first = chunks * t / threads, last = chunks * (t + 1) / threads;
        const double start = ThreadSeconds();
        for (int64_t c = first; c < last; ++c) {
          kept[c] ^= ReadStreams(avx512, false, src.get() + c * kChunk, kChunk);
        }
        const double s = ThreadSeconds() - start;
        rates[t] = s > 0 ? (last - first) * kChunk / s : 0;
      }
    });
    double cpu_rate = 0;
    for (double rate : rates) cpu_rate += rate;
    if (r == 0) continue;
    best.read_cpu_time_bytes_per_s = std::max(best.read_cpu_time_bytes_per_s, cpu_rate);
    best.copy_bytes_per_s = std::max(best.copy_bytes_per_s, 2.0 * total / copy_s);
    best.read_sum_bytes_per_s = std::max(best.read_sum_bytes_per_s, total / sum_s);
    best.read_streams_bytes_per_s = std::max(best.read_streams_bytes_per_s, total / streams_s);
    best.read_nt_bytes_per_s = std::max(best.read_nt_bytes_per_s, total / nt_s);
  }
  volatile int64_t sink = kept[0];
  (void)sink;
  return best;
}

size_t SampleBytes(size_t bytes) {
  constexpr size_t kGiB = size_t{1} << 30;
  const long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
  const size_t cap = std::max(kGiB, 8 * static_cast<size_t>(std::max(l3, 0L)));
  return std::min(bytes, cap);
}

std::string FootprintLevel(size_t bytes, int threads) {
  const long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE), l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
  if (l2 > 0 && bytes <= static_cast<size_t>(l2) * threads) return "l2";
  if (l3 > 0 && bytes <= static_cast<size_t>(l3)) return "l3";
  return "dram";
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
