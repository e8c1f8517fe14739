// Throughput of the CPU paged attention (model/cpu/paged_attention.h) at
// Qwen2-0.5B's attention shape (14 query heads, 2 KV heads, head_dim 64; or
// --dims=qwen2-vl-2b: 12 / 2 / 128): one causal prefill chunk of --pp tokens
// and one decode step of --batch sequences at context --pp, against the FMA
// peak measured in the same run (the compute roofline): bench/isa_peaks.h's
// vfmadd231ps of the width the kernel runs at the level in force (512-bit
// at kAvx512, 256-bit at kAvx2), on every thread's CPU-time clock, as
// lm_bench's. A kernel timed on the wall clock cannot pass it, so a ratio
// above 1 means the peak was measured wrong: the bench then prints the JSON
// line, FAILED on stderr, and exits 1.
//
//   bazel run --config=opt //bench:attention_bench
//
// FLOPs: 4 x heads x head_dim per (query, visible key) pair (q.k and p.v).
// Prints a human table, then one JSON line last.
#include <time.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "bench/isa_peaks.h"
#include "common/logging.h"
#include "model/cpu/cpu_isa.h"
#include "model/cpu/cpu_isa_flag.h"
#include "model/cpu/paged_attention.h"
#include "model/cpu/thread_pool.h"

ABSL_FLAG(std::string, dims, "qwen2-0.5b", "qwen2-0.5b or qwen2-vl-2b");
ABSL_FLAG(int, pp, 512, "prompt tokens (prefill) and decode context");
ABSL_FLAG(int, batch, 32, "decode sequences");
ABSL_FLAG(int, reps, 5, "timed repetitions (best reported)");
ABSL_FLAG(int, threads, 0, "compute threads (0: every core)");
ABSL_FLAG(std::string, clock, "wall",
          "wall, or cpu: the calling thread's CPU time (with --threads=1, where the kernels run on "
          "the caller; steadier on a loaded machine)");

namespace mmserve {
namespace {

namespace cpu = model::cpu;

// Seconds on the chosen clock.
double Now(bool cpu_clock) {
  timespec ts;
  clock_gettime(cpu_clock ? CLOCK_THREAD_CPUTIME_ID : CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

int Run() {
  const std::string dims = absl::GetFlag(FLAGS_dims);
  CHECK(dims == "qwen2-0.5b" || dims == "qwen2-vl-2b") << dims;
  const int64_t heads = dims == "qwen2-0.5b" ? 14 : 12, kv_heads = 2;
  const int64_t hd = dims == "qwen2-0.5b" ? 64 : 128;
  const int64_t pp = absl::GetFlag(FLAGS_pp), batch = absl::GetFlag(FLAGS_batch);
  const int reps = absl::GetFlag(FLAGS_reps);
  const int threads = absl::GetFlag(FLAGS_threads) > 0 ? absl::GetFlag(FLAGS_threads)
                                                       : cpu::ThreadPool::DefaultThreads();
  const std::string clock = absl::GetFlag(FLAGS_clock);
  CHECK(clock == "wall" || (clock == "cpu" && threads == 1))
      << "--clock=cpu needs --threads=1 (workers' time is not the caller's)";
  const bool cpu_clock = clock == "cpu";
  cpu::ThreadPool pool(threads);
  constexpr int64_t kBlock = 16;
  const int64_t blocks_per_seq = (pp + kBlock - 1) / kBlock;
  const int64_t slots = batch * blocks_per_seq * kBlock;
  std::vector<float> k(slots * kv_heads * hd), v(k.size());
  for (size_t i = 0; i < k.size(); ++i) {
    k[i] = 0.01f * static_cast<float>(static_cast<int>(i * 7919 % 201) - 100);
    v[i] = 0.01f * static_cast<float>(static_cast<int>(i * 104729 % 199) - 99);
  }
  std::vector<float> q(std::max(pp, batch) * heads * hd), out(q.size());
  for (size_t i = 0; i < q.size(); ++i) q[i] = 0.02f * static_cast<float>(i % 101) - 1.0f;
  std::vector<std::vector<int32_t>> tables(batch);
  for (int64_t s = 0; s < batch; ++s) {
    for (int64_t b = 0; b < blocks_per_seq; ++b) {
      tables[s].push_back(static_cast<int32_t>(s * blocks_per_seq + b));
    }
  }
  const cpu::PagedKvLayer kv{k.data(), v.data(), kBlock, kv_heads, hd};
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  auto best_of = [&](const std::vector<cpu::AttentionSequence>& seqs) {
    cpu::PagedAttention(pool, q.data(), heads, kv, seqs, scale, out.data());
    double best = 1e30;
    for (int r = 0; r < reps; ++r) {
      const double start = Now(cpu_clock);
      cpu::PagedAttention(pool, q.data(), heads, kv, seqs, scale, out.data());
      best = std::min(best, Now(cpu_clock) - start);
    }
    return best;
  };
  const double pp_s = best_of({{0, pp, pp, tables[0].data()}});
  std::vector<cpu::AttentionSequence> decode;
  for (int64_t s = 0; s < batch; ++s) decode.push_back({s, 1, pp, tables[s].data()});
  const double decode_s = best_of(decode);
  const bench::IsaPeaks peaks = bench::MeasureIsaPeaks(pool, 3);
  const bool zmm = cpu::ActiveCpuIsa() == cpu::CpuIsa::kAvx512;
  const double peak = zmm ? peaks.fma512_gflops : peaks.fma256_gflops;
  const double pp_gflops = 4.0 * heads * hd * pp * (pp + 1) / 2.0 / pp_s / 1e9;
  const double decode_gflops = 4.0 * heads * hd * pp * batch / decode_s / 1e9;
  // Decode reads every visible key and value once per KV head.
  const double decode_gbs = 2.0 * batch * pp * kv_heads * hd * 4 / decode_s / 1e9;
  const absl::StatusOr<double> ratio =
      bench::PeakRatio(zmm ? "prefill attention vs the 512-bit FMA peak"
                           : "prefill attention vs the 256-bit FMA peak",
                       pp_gflops, peak);
  const double pp_vs_peak = ratio.ok() ? *ratio : pp_gflops / peak;
  std::printf(
      "attention_bench: %s (%lld heads, %lld KV heads, head_dim %lld), %d threads, isa %s, %s "
      "clock\n",
      dims.c_str(), static_cast<long long>(heads), static_cast<long long>(kv_heads),
      static_cast<long long>(hd), threads, cpu::IsaName(), clock.c_str());
  std::printf("  prefill %lld tokens       %8.2f ms  %6.1f GFLOP/s = %.3f of the FMA peak\n",
              static_cast<long long>(pp), 1e3 * pp_s, pp_gflops, pp_vs_peak);
  std::printf("  decode %lld x context %lld  %8.2f ms  %6.1f GFLOP/s, %.1f GB/s of K/V\n",
              static_cast<long long>(batch), static_cast<long long>(pp), 1e3 * decode_s,
              decode_gflops, decode_gbs);
  std::printf("  FMA peak (%s, CPU time, %d threads) %.1f GFLOP/s\n", zmm ? "zmm" : "ymm", threads,
              peak);
  std::printf(
      "{\"bench\":\"attention\",\"dims\":\"%s\",\"threads\":%d,\"isa\":\"%s\",\"clock\":\"%s\","
      "\"pp\":%lld,\"batch\":%lld,"
      "\"prefill_ms\":%.3f,\"prefill_gflops\":%.2f,\"prefill_vs_fma_peak\":%.3f,"
      "\"decode_ms\":%.3f,\"decode_gflops\":%.2f,\"decode_kv_gbs\":%.2f,\"fma_peak_gflops\":%.2f,"
      "\"fma_peak_width\":%d}"
      "\n",
      dims.c_str(), threads, cpu::IsaName(), clock.c_str(), static_cast<long long>(pp),
      static_cast<long long>(batch), 1e3 * pp_s, pp_gflops, pp_vs_peak, 1e3 * decode_s,
      decode_gflops, decode_gbs, peak, zmm ? 512 : 256);
  if (!ratio.ok()) {
    std::fprintf(stderr, "attention_bench: FAILED: %s\n",
                 std::string(ratio.status().message()).c_str());
    return 1;
  }
  return 0;
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
