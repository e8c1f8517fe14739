// bench:isa_peaks: the vpdpbusd peak bounds the int8-activation kernel's
// whole rate from above, so the benchmarks' *_vs_isa_peak ratios stay at
// most 1.
#include "bench/isa_peaks.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <random>
#include <vector>

#include "common/clock.h"
#include "model/cpu/cpu_isa.h"
#include "model/cpu/linear.h"
#include "model/cpu/linear_int8.h"
#include "model/cpu/thread_pool.h"

namespace mmserve::bench {
namespace {

namespace cpu = model::cpu;

std::vector<float> Normal(int64_t n, float scale, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& e : v) e = d(gen);
  return v;
}

TEST_CASE("the int8-activation kernel at 512 rows runs below the measured vpdpbusd peak",
          "[isa_peaks]") {
  if (!cpu::DetectedCpuFeatures().avx512_vnni) {
    WARN("no AVX512-VNNI on this CPU: nothing to bound");
    return;
  }
  cpu::ScopedCpuIsa avx512(cpu::CpuIsa::kAvx512);
  REQUIRE(cpu::internal::Int8ActUsesVnni512());
  cpu::ThreadPool pool(cpu::ThreadPool::DefaultThreads());
  // Qwen2-0.5B's up projection for a 512-token prefill.
  const int64_t m = 512, n = 4864, k = 896;
  const std::vector<float> x = Normal(m * k, 1.0f, 1);
  const std::vector<float> w = Normal(n * k, 0.05f, 2);
  const cpu::Int8Weights q =
      cpu::Int8Weights::Quantize(pool, {model::DType::kF32, w.data(), n, k}, 0);
  std::vector<float> y(m * n);
  auto kernel_rate = [&] {
    double best = 0;
    for (int r = 0; r < 4; ++r) {
      Stopwatch sw;
      cpu::Linear(pool, x.data(), m, q.matrix(), nullptr, y.data(), cpu::LinearKernel::kInt8Act);
      best = std::max(best, 2.0 * m * n * k / sw.ElapsedSeconds() / 1e9);
    }
    return best;
  };
  // Interleaved, so that both see the same machine load.
  const double before = kernel_rate();
  const IsaPeaks peaks = MeasureIsaPeaks(pool, 2);
  const double after = kernel_rate();
  INFO("kernel " << std::max(before, after) << " GOP/s, peak " << peaks.vnni_gops << " (bare loop "
                 << peaks.vnni_loop_gops << ", kernel tile " << peaks.vnni_tile_gops << ")");
  CHECK(peaks.vnni_gops == std::max(peaks.vnni_loop_gops, peaks.vnni_tile_gops));
  CHECK(std::max(before, after) <= peaks.vnni_gops);
}

}  // namespace
}  // namespace mmserve::bench
