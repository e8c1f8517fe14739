// bench:isa_peaks: each measured peak bounds the library's own kernels on
// that instruction from above (timed as the benchmarks time them: wall
// clock, every thread of the pool), so the benchmarks' *_vs_*peak ratios
// stay at most 1; and a ratio above 1 is an error, never clamped.
#include "bench/isa_peaks.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <random>
#include <vector>

#include "common/clock.h"
#include "model/cpu/cpu_isa.h"
#include "model/cpu/linear.h"
#include "model/cpu/linear_bf16dot.h"
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

// Best of three wall-clock rates of `kernel` on m rows of x against w.
double KernelGflops(cpu::ThreadPool& pool, const std::vector<float>& x, int64_t m,
                    const cpu::WeightMatrix& w, cpu::LinearKernel kernel) {
  std::vector<float> y(m * w.rows);
  double best = 0;
  for (int r = 0; r < 3; ++r) {
    Stopwatch sw;
    cpu::Linear(pool, x.data(), m, w, nullptr, y.data(), kernel);
    best = std::max(best, 2.0 * m * w.rows * w.cols / sw.ElapsedSeconds() / 1e9);
  }
  return best;
}

// The peaks, measured once for the test cases that bound a kernel (each
// measurement spins every unit on every thread: slow under ASan).
const IsaPeaks& Peaks(cpu::ThreadPool& pool) {
  static const IsaPeaks peaks = MeasureIsaPeaks(pool, 2);
  return peaks;
}

TEST_CASE("a rate above its peak is an error, not a clamped ratio", "[isa_peaks]") {
  const absl::StatusOr<double> above = PeakRatio("pp_vs_isa_peak", 110, 100);
  REQUIRE(!above.ok());
  CHECK(above.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(above.status().message().find("pp_vs_isa_peak") != std::string_view::npos);
  const absl::StatusOr<double> below = PeakRatio("pp_vs_isa_peak", 25, 100);
  REQUIRE(below.ok());
  CHECK(*below == 0.25);
  CHECK(*PeakRatio("equal", 100, 100) == 1.0);
  CHECK(PeakRatio("unmeasured", 1, 0).status().code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("the widest FMA and the top figure are the largest of the peaks", "[isa_peaks]") {
  IsaPeaks p;
  p.fma256_gflops = 40;
  p.fma512_gflops = 80;
  p.bf16dot_gflops = 150;
  p.vnni_gops = 300;
  CHECK(p.widest_fma_gflops() == 80);
  CHECK(p.top_gops() == 300);
  p.fma512_gflops = 0;  // an AVX2-only CPU
  CHECK(p.widest_fma_gflops() == 40);
}

TEST_CASE("the bf16 panel kernels at their best shape run below the FMA and vdpbf16ps peaks",
          "[isa_peaks]") {
  if (!cpu::DetectedCpuFeatures().avx2) {
    WARN("no AVX2 on this CPU: nothing to bound");
    return;
  }
  cpu::ThreadPool pool(cpu::ThreadPool::DefaultThreads());
  // Qwen2-0.5B's up projection for a 512-token prefill: the panel kernel's
  // best shape (linear_bench).
  const int64_t m = 512, n = 4864, k = 896;
  const std::vector<float> x = Normal(m * k, 1.0f, 1);
  // The kernels' speed does not depend on the values: a cheap pattern.
  std::vector<uint16_t> w(n * k);
  for (size_t i = 0; i < w.size(); ++i) w[i] = model::F32ToBf16(((i * 7919) % 97) * 1e-3f - 0.05f);
  const cpu::PanelWeights panels =
      cpu::PanelWeights::Pack(pool, cpu::WeightMatrix{model::DType::kBF16, w.data(), n, k});
  const double dot_before = KernelGflops(pool, x, m, panels.matrix(), cpu::LinearKernel::kDot);
  const bool bf16dot = cpu::internal::Bf16DotUsesAvx512();
  const double bf16dot_before =
      bf16dot ? KernelGflops(pool, x, m, panels.matrix(), cpu::LinearKernel::kBf16Dot) : 0;
  const IsaPeaks& peaks = Peaks(pool);
  const double dot =
      std::max(dot_before, KernelGflops(pool, x, m, panels.matrix(), cpu::LinearKernel::kDot));
  INFO("fp32-activation kernel " << dot << " GFLOP/s, FMA peaks 256-bit " << peaks.fma256_gflops
                                 << ", 512-bit " << peaks.fma512_gflops);
  CHECK(PeakRatio("dot", dot, peaks.widest_fma_gflops()).ok());
  if (bf16dot) {
    const double rate = std::max(
        bf16dot_before, KernelGflops(pool, x, m, panels.matrix(), cpu::LinearKernel::kBf16Dot));
    INFO("bf16-activation kernel " << rate << " GFLOP/s, vdpbf16ps peak " << peaks.bf16dot_gflops);
    CHECK(PeakRatio("bf16dot", rate, peaks.bf16dot_gflops).ok());
  }
  CHECK(peaks.top_gops() >= peaks.widest_fma_gflops());
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
    for (int r = 0; r < 3; ++r) {
      Stopwatch sw;
      cpu::Linear(pool, x.data(), m, q.matrix(), nullptr, y.data(), cpu::LinearKernel::kInt8Act);
      best = std::max(best, 2.0 * m * n * k / sw.ElapsedSeconds() / 1e9);
    }
    return best;
  };
  // Before and after the peaks (measured here unless an earlier case did),
  // so that a kernel rate sees the load the peaks saw.
  const double before = kernel_rate();
  const IsaPeaks& peaks = Peaks(pool);
  const double after = kernel_rate();
  INFO("kernel " << std::max(before, after) << " GOP/s, peak " << peaks.vnni_gops << " (bare loop "
                 << peaks.vnni_loop_gops << ", kernel tile " << peaks.vnni_tile_gops << ")");
  CHECK(peaks.vnni_gops == std::max(peaks.vnni_loop_gops, peaks.vnni_tile_gops));
  CHECK(PeakRatio("int8act", std::max(before, after), peaks.vnni_gops).ok());
}

}  // namespace
}  // namespace mmserve::bench
