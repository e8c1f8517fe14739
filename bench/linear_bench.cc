// Throughput of the CPU linear kernels (model/cpu/linear.h) at the shapes a
// Qwen2 decoder step runs, for one decode row, a 32-row decode batch and a
// 512-row prefill, against OpenBLAS cblas_sgemm on fp32 copies of the same
// weights, measured in the same run (interleaved, best of --reps).
//
//   bazel run --config=opt //bench:linear_bench -- --dims=qwen2-0.5b
//
// Columns: GFLOP/s of our kernel on bf16 panels (how Qwen2Weights holds bf16
// checkpoints), on int8 panels with one scale per output row and with one
// per group of 32 columns (--quantize=int8), the per-row int8 again on the
// AVX2 kernels where the CPU would use AVX512-VNNI (the same results; the
// instruction sets measured side by side), on row-major bf16 and fp32
// weights, of sgemm, and the ratio panels / sgemm. One-row rows also give
// the weight bytes (int8: values plus scales) streamed per second. After
// the table, the widest units' peaks measured in the same run
// (bench/isa_peaks.h) and each kernel's best 512-row rate over the peak of
// its instruction (bf16 panels: 512-bit FMA; bf16 dot: vdpbf16ps; int8:
// vpdpwssd; int8 activations: vpdpbusd). Prints a human table, then one JSON
// line last.
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "bench/isa_peaks.h"
#include "common/clock.h"
#include "common/logging.h"
#include "model/cpu/cpu_isa.h"
#include "model/cpu/cpu_isa_flag.h"
#include "model/cpu/linear.h"
#include "model/cpu/linear_int8.h"
#include "model/cpu/thread_pool.h"
#include "model/dtype.h"

ABSL_FLAG(std::string, dims, "qwen2-0.5b", "shapes of: qwen2-0.5b or qwen2-vl-2b");
ABSL_FLAG(std::string, rows, "1,32,512", "x rows (m) to measure");
ABSL_FLAG(std::string, shapes, "", "comma-separated shape names to measure (empty: all)");
ABSL_FLAG(int, threads, 0, "compute threads (0: every core)");
ABSL_FLAG(int, reps, 5, "timed repetitions per kernel (best reported)");
ABSL_FLAG(std::string, clock, "wall",
          "wall, or cpu: the calling thread's CPU time (with --threads=1 only), which leaves out "
          "the time other processes hold the core: for A/B runs on a busy shared machine");

namespace mmserve {
namespace {

namespace cpu = model::cpu;

struct Shape {
  const char* name;
  int64_t n, k;  // out_features, in_features
};

std::vector<Shape> Shapes(const std::string& dims) {
  if (dims == "qwen2-vl-2b") {
    return {{"qkv", 1536 + 2 * 256, 1536},
            {"o", 1536, 1536},
            {"gate_up", 2 * 8960, 1536},
            {"down", 1536, 8960}};
  }
  CHECK(dims == "qwen2-0.5b") << "unknown --dims " << dims;
  return {{"qkv", 896 + 2 * 128, 896},
          {"o", 896, 896},
          {"gate_up", 2 * 4864, 896},
          {"down", 896, 4864},
          {"lm_head", 151936, 896}};
}

struct Row {
  std::string shape;
  int64_t m, n, k;
  double bf16 = 0, bf16_rows = 0, f32 = 0, sgemm = 0;  // GFLOP/s
  double bf16_avx2 = 0;                                // GFLOP/s, bf16 panels at the AVX2 level
  double bf16dot = 0;  // GFLOP/s, bf16 panels with bf16 activations (kBf16Dot)
  double i8_act = 0;   // GFLOP/s, int8 (row scales) with int8 activations (kInt8Act)
  double i8 = 0, i8_g32 = 0, i8_avx2 = 0;  // GFLOP/s
  double i8_bytes = 0, i8_g32_bytes = 0;   // per matrix
};

// Seconds on the chosen clock.
double Now(bool cpu_clock) {
  timespec ts;
  clock_gettime(cpu_clock ? CLOCK_THREAD_CPUTIME_ID : CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// Best GFLOP/s of `reps` calls (one untimed call first).
double Time(cpu::ThreadPool& pool, const std::vector<float>& x, int64_t m,
            const cpu::WeightMatrix& w, std::vector<float>& y, cpu::LinearKernel kernel, int reps) {
  cpu::Linear(pool, x.data(), m, w, nullptr, y.data(), kernel);
  double best = 0;
  for (int r = 0; r < reps; ++r) {
    const bool cpu_clock = absl::GetFlag(FLAGS_clock) == "cpu";
    const double start = Now(cpu_clock);
    cpu::Linear(pool, x.data(), m, w, nullptr, y.data(), kernel);
    best = std::max(best, 2.0 * m * w.rows * w.cols / (Now(cpu_clock) - start) / 1e9);
  }
  return best;
}

// The widest units' peaks (bench/isa_peaks.h), measured now, and the best
// 512-row rate of each kernel over the peak of the instruction it runs on
// (the bf16 panels over the widest FMA's): prints them and returns their
// JSON fields (with a leading comma). A ratio above 1 (the peak measured
// wrong) is added to *failures.
std::string PeaksReport(cpu::ThreadPool& pool, const std::vector<Row>& rows,
                        std::vector<std::string>* failures) {
  const bench::IsaPeaks p = bench::MeasureIsaPeaks(pool, 3);
  double bf16 = 0, bf16dot = 0, i8 = 0, i8_act = 0;
  for (const Row& r : rows) {
    if (r.m != 512) continue;
    bf16 = std::max(bf16, r.bf16);
    bf16dot = std::max(bf16dot, r.bf16dot);
    i8 = std::max(i8, r.i8);
    i8_act = std::max(i8_act, r.i8_act);
  }
  auto ratio = [&](const char* what, double rate, double peak) {
    const absl::StatusOr<double> r = bench::PeakRatio(what, rate, peak);
    if (!r.ok() && r.status().code() == absl::StatusCode::kFailedPrecondition) {
      failures->emplace_back(r.status().message());
    }
    return peak > 0 ? rate / peak : 0.0;
  };
  const double r_bf16 = ratio("bf16_panels_vs_fma512_peak", bf16, p.widest_fma_gflops());
  const double r_dot = ratio("bf16dot_vs_bf16dot_peak", bf16dot, p.bf16dot_gflops);
  const double r_i8 = ratio("int8_vs_vnni_int16_peak", i8, p.vnni_int16_gops);
  const double r_act = ratio("int8_act_vs_vnni_peak", i8_act, p.vnni_gops);
  std::printf(
      "  peaks (measured now): fma512 %.1f, bf16dot %.1f GFLOP/s, vnni %.1f, vnni int16 %.1f "
      "GOP/s; best at 512 rows: bf16 panels %.3f of the widest FMA, bf16 dot %.3f of bf16dot, int8 "
      "%.3f "
      "of vnni int16, int8 activations %.3f of vnni\n",
      p.fma512_gflops, p.bf16dot_gflops, p.vnni_gops, p.vnni_int16_gops, r_bf16, r_dot, r_i8,
      r_act);
  return absl::StrFormat(
      ",\"fma512_peak_gflops\":%.2f,\"bf16dot_peak_gflops\":%.2f,\"vnni_peak_gflops\":%.2f,"
      "\"vnni_int16_peak_gflops\":%.2f,\"bf16_panels_vs_fma512_peak\":%.3f,"
      "\"bf16dot_vs_bf16dot_peak\":%.3f,\"int8_vs_vnni_int16_peak\":%.3f,"
      "\"int8_act_vs_vnni_peak\":%.3f",
      p.fma512_gflops, p.bf16dot_gflops, p.vnni_gops, p.vnni_int16_gops, r_bf16, r_dot, r_i8,
      r_act);
}

// The table, then the JSON line (with the peaks).
bool PrintReport(cpu::ThreadPool& pool, const std::vector<Row>& rows, int threads, int reps,
                 const std::string& clock) {
  std::vector<std::string> failures;
  std::printf("linear_bench: %s, %d threads, isa %s (GFLOP/s on the %s clock, best of %d)\n",
              absl::GetFlag(FLAGS_dims).c_str(), threads, cpu::IsaName(), clock.c_str(), reps);
  std::printf("  %-8s %5s %7s %6s %10s %9s %8s %8s %8s %8s %10s %9s %9s %9s %22s\n", "shape", "m",
              "n", "k", "bf16 panel", "bf16 avx2", "bf16 dot", "i8 row", "i8 g32", "i8 avx2",
              "bf16 rows", "f32 rows", "sgemm", "panel/sg", "GB/s bf16 / i8 / g32");
  std::vector<std::string> json;
  for (const Row& r : rows) {
    // Weight bytes per second: one pass over the matrix per call.
    const double flops = 2.0 * r.m * r.n * r.k;
    const double gbs = r.bf16 / flops * (2.0 * r.n * r.k);
    const double i8_gbs = r.i8 / flops * r.i8_bytes, g32_gbs = r.i8_g32 / flops * r.i8_g32_bytes;
    std::printf(
        "  %-8s %5lld %7lld %6lld %10.1f %9.1f %8.1f %8.1f %8.1f %8.1f %10.1f %9.1f %9.1f %9.2f "
        "%22s\n",
        r.shape.c_str(), static_cast<long long>(r.m), static_cast<long long>(r.n),
        static_cast<long long>(r.k), r.bf16, r.bf16_avx2, r.bf16dot, r.i8, r.i8_g32, r.i8_avx2,
        r.bf16_rows, r.f32, r.sgemm, r.bf16 / r.sgemm,
        r.m == 1 ? absl::StrFormat("%.1f / %.1f / %.1f", gbs, i8_gbs, g32_gbs).c_str() : "");
    json.push_back(absl::StrFormat(
        "{\"shape\":\"%s\",\"m\":%d,\"n\":%d,\"k\":%d,\"bf16_panels_gflops\":%.2f,"
        "\"int8_row_scale_gflops\":%.2f,\"int8_g32_gflops\":%.2f,"
        "\"int8_avx2_gflops\":%.2f,\"bf16_rows_gflops\":%.2f,\"f32_rows_gflops\":%."
        "2f,\"sgemm_gflops\":%.2f,"
        "\"panels_vs_sgemm\":%.3f,\"int8_vs_bf16\":%.3f,\"int8_g32_vs_bf16\":%.3f,"
        "\"bf16_panels_avx2_gflops\":%.2f,\"bf16_panels_vs_avx2\":%.3f,\"bf16dot_gflops\":%.2f,"
        "\"bf16dot_vs_bf16_panels\":%.3f,\"int8_act_gflops\":%.2f,\"int8_act_vs_int8\":%.3f}",
        r.shape, r.m, r.n, r.k, r.bf16, r.i8, r.i8_g32, r.i8_avx2, r.bf16_rows, r.f32, r.sgemm,
        r.bf16 / r.sgemm, r.i8 / r.bf16, r.i8_g32 / r.bf16, r.bf16_avx2, r.bf16 / r.bf16_avx2,
        r.bf16dot, r.bf16dot / r.bf16, r.i8_act, r.i8_act / r.i8));
  }
  std::printf(
      "{\"bench\":\"linear\",\"dims\":\"%s\",\"threads\":%d,\"isa\":\"%s\",\"int8_vnni\":%s,"
      "\"rows\":[%s]%s}\n",
      absl::GetFlag(FLAGS_dims).c_str(), threads, cpu::IsaName(),
      cpu::internal::Int8UsesVnni() ? "true" : "false", absl::StrJoin(json, ",").c_str(),
      PeaksReport(pool, rows, &failures).c_str());
  std::fflush(stdout);
  for (const std::string& f : failures)
    std::fprintf(stderr, "linear_bench: FAILED: %s\n", f.c_str());
  return failures.empty();
}

int Run() {
  const int threads = absl::GetFlag(FLAGS_threads) > 0 ? absl::GetFlag(FLAGS_threads)
                                                       : cpu::ThreadPool::DefaultThreads();
  const int reps = absl::GetFlag(FLAGS_reps);
  const std::string clock = absl::GetFlag(FLAGS_clock);
  CHECK(clock == "wall" || (clock == "cpu" && threads == 1))
      << "--clock=cpu needs --threads=1 (workers' time is not the caller's)";
  cpu::ThreadPool pool(threads);
  std::vector<int64_t> ms;
  for (absl::string_view s : absl::StrSplit(absl::GetFlag(FLAGS_rows), ',')) {
    ms.push_back(std::stoll(std::string(s)));
  }
  std::vector<Row> rows;
  const std::string only = absl::GetFlag(FLAGS_shapes);
  const std::vector<std::string> wanted = absl::StrSplit(only, ',', absl::SkipEmpty());
  for (const Shape& shape : Shapes(absl::GetFlag(FLAGS_dims))) {
    if (!wanted.empty() && std::find(wanted.begin(), wanted.end(), shape.name) == wanted.end()) {
      continue;
    }
    // Random-ish weights of both dtypes, same values.
    std::vector<float> wf(shape.n * shape.k);
    std::vector<uint16_t> wb(wf.size());
    uint32_t state = 12345;
    for (size_t i = 0; i < wf.size(); ++i) {
      state = state * 1664525u + 1013904223u;
      wb[i] = model::F32ToBf16((static_cast<int32_t>(state >> 8) - (1 << 23)) * 1e-9f);
      wf[i] = model::Bf16ToF32(wb[i]);
    }
    const cpu::WeightMatrix w16{model::DType::kBF16, wb.data(), shape.n, shape.k};
    const cpu::WeightMatrix w32{model::DType::kF32, wf.data(), shape.n, shape.k};
    const cpu::PanelWeights panels = cpu::PanelWeights::Pack(pool, w16);
    const cpu::Int8Weights i8 = cpu::Int8Weights::Quantize(pool, w16, 0);
    const cpu::Int8Weights i8_g32 = cpu::Int8Weights::Quantize(pool, w16, 32);
    for (int64_t m : ms) {
      std::vector<float> x(m * shape.k), y(m * shape.n);
      for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 97) * 0.01f - 0.4f;
      Row row{shape.name, m, shape.n, shape.k};
      row.sgemm = Time(pool, x, m, w32, y, cpu::LinearKernel::kOpenBlas, reps);
      row.bf16 = Time(pool, x, m, panels.matrix(), y, cpu::LinearKernel::kDot, reps);
      row.bf16dot = Time(pool, x, m, panels.matrix(), y, cpu::LinearKernel::kBf16Dot, reps);
      row.i8 = Time(pool, x, m, i8.matrix(), y, cpu::LinearKernel::kDot, reps);
      row.i8_act = Time(pool, x, m, i8.matrix(), y, cpu::LinearKernel::kInt8Act, reps);
      row.i8_g32 = Time(pool, x, m, i8_g32.matrix(), y, cpu::LinearKernel::kDot, reps);
      {
        cpu::ScopedCpuIsa avx2(cpu::CpuIsa::kAvx2);
        row.i8_avx2 = Time(pool, x, m, i8.matrix(), y, cpu::LinearKernel::kDot, reps);
        row.bf16_avx2 = Time(pool, x, m, panels.matrix(), y, cpu::LinearKernel::kDot, reps);
      }
      row.i8_bytes = static_cast<double>(i8.matrix().bytes());
      row.i8_g32_bytes = static_cast<double>(i8_g32.matrix().bytes());
      row.bf16_rows = Time(pool, x, m, w16, y, cpu::LinearKernel::kDot, reps);
      row.f32 = Time(pool, x, m, w32, y, cpu::LinearKernel::kDot, reps);
      rows.push_back(row);
    }
  }
  return PrintReport(pool, rows, threads, reps, clock) ? 0 : 1;
}

}  // namespace
}  // namespace mmserve

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (absl::Status s = mmserve::model::cpu::ApplyCpuIsaFlag(); !s.ok()) {
    std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
    return 1;
  }
  return mmserve::Run();
}
