#include "bench/lm_bench_report.h"

#include <algorithm>
#include <cstdio>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "model/cpu/cpu_isa.h"
#include "model/cpu/linear_bf16dot.h"
#include "model/cpu/linear_int4.h"
#include "model/cpu/linear_int8.h"

namespace mmserve::bench {
namespace {

using model::TextConfig;

// Parameters one token multiplies (active parameters): attention, then the
// dense MLP, or of a sparse layer the router and top_k experts' MLPs.
struct ParamCounts {
  double layers = 0, lm_head = 0;
  double total() const { return layers + lm_head; }
};
double Params(const cpu::WeightMatrix& m) { return static_cast<double>(m.rows) * m.cols; }
ParamCounts CountParams(const model::Qwen2Weights& w, const TextConfig& cfg) {
  ParamCounts c;
  for (const model::Qwen2LayerWeights& l : w.layers()) {
    for (const cpu::WeightMatrix* m : {&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down}) {
      c.layers += Params(*m);  // gate, up and down are empty in a sparse layer
    }
    if (l.experts.empty()) continue;
    const model::Qwen2LayerWeights::Expert& x = l.experts[0];  // all the same size
    c.layers += Params(l.router) +
                cfg.num_experts_per_tok * (Params(x.gate) + Params(x.up) + Params(x.down));
  }
  c.lm_head = Params(w.lm_head());
  return c;
}

// Ratios to the peaks and the bandwidth reference, each checked by
// PeakRatio: a rate above its reference is recorded (and printed by
// PrintErrors), never clamped. An unmeasured reference gives 0.
class CheckedRatios {
 public:
  double operator()(std::string_view what, double rate, double reference) {
    const absl::StatusOr<double> ratio = PeakRatio(what, rate, reference);
    if (ratio.ok()) return *ratio;
    if (ratio.status().code() == absl::StatusCode::kInvalidArgument) return 0;
    errors_.emplace_back(ratio.status().message());
    return rate / reference;
  }
  // True if every ratio was at most 1; else prints why on stderr.
  bool Report() const {
    for (const std::string& e : errors_) std::fprintf(stderr, "lm_bench: FAILED: %s\n", e.c_str());
    return errors_.empty();
  }

 private:
  std::vector<std::string> errors_;
};

// The bandwidth reference: the best read of any method in any sample.
struct BandwidthReference {
  double read = 0, median_copy = 0;
  const char* method = "";
};
BandwidthReference ReferenceBandwidth(const Results& r) {
  BandwidthReference ref;
  std::vector<double> copies;
  for (const MemoryBandwidth& b : r.bandwidth_samples) {
    copies.push_back(b.copy_bytes_per_s);
    if (b.best_read() > ref.read) {
      ref.read = b.best_read();
      ref.method = b.best_read_method();
    }
  }
  std::sort(copies.begin(), copies.end());
  if (!copies.empty()) ref.median_copy = copies[copies.size() / 2];
  return ref;
}

// The measured baselines, in words.
void PrintBaselines(const Options& o, const TextConfig& cfg, const Results& r, double weights_mb,
                    const BandwidthReference& bw, const std::string& level) {
  const char* dname = o.dtype_name.c_str();
  const double rss_ratio = r.peak_rss / (weights_mb + r.kv_mb);
  std::printf(
      "  read bandwidth %.2f GB/s (best of %zu samples x {sum, 8 streams, non-temporal, 8 streams "
      "on CPU time} over %.0f MiB, the step's weights, which live in %s: %s); copy %.2f GB/s "
      "(read+write, median)\n",
      bw.read / 1e9, r.bandwidth_samples.size(), r.bandwidth_footprint / 1048576.0, level.c_str(),
      bw.method, bw.median_copy / 1e9);
  std::printf(
      "  sgemm (OpenBLAS fp32, %dx%dx%d) %.1f GFLOP/s; ours (%s) %.1f GFLOP/s; widest FMA peak "
      "%.1f GFLOP/s\n",
      o.pp, cfg.intermediate_size, cfg.hidden_size, r.sgemm, dname, r.kernel_gflops,
      r.isa_peaks.widest_fma_gflops());
  std::printf("  peak RSS %.0f MiB vs weights %.0f + KV %.0f MiB = %.3f x%s\n", r.peak_rss,
              weights_mb, r.kv_mb, rss_ratio,
              r.rss_reset ? "" : " (mark not reset: includes start-up)");
}

// The instruction the linear layers of a prefill run on, at the level in
// force (cpu_isa.h), and its measured peak in GFLOP/s (0 if not measured).
std::pair<const char*, double> LinearIsaPeak(const Options& o, const Results& r) {
  const double fma = r.isa_peaks.widest_fma_gflops();
  if (o.quantize.rfind("int4", 0) == 0) {  // int4 layers always run int8 activations
    return cpu::internal::Int4UsesVnni()
               ? std::pair{"vpdpbusd zmm", r.isa_peaks.vnni_gops}
               : std::pair{"vpmaddubsw ymm (vs the widest FMA peak)", fma};
  }
  if (!o.quantize.empty() && o.kernel == cpu::LinearKernel::kInt8Act &&
      cpu::internal::Int8ActUsesVnni512()) {
    return {"vpdpbusd zmm", r.isa_peaks.vnni_gops};
  }
  if (!o.quantize.empty()) {
    return cpu::internal::Int8UsesVnni() ? std::pair{"vpdpwssd ymm", r.isa_peaks.vnni_int16_gops}
                                         : std::pair{"vpmaddwd ymm (vs the widest FMA peak)", fma};
  }
  if (o.kernel == cpu::LinearKernel::kBf16Dot && o.dtype == model::DType::kBF16) {
    return cpu::internal::Bf16DotUsesAvx512()
               ? std::pair{"vdpbf16ps zmm", r.isa_peaks.bf16dot_gflops}
               : std::pair{"scalar bf16 dot (vs the widest FMA peak)", fma};
  }
  return {"vfmadd231ps (the widest FMA)", fma};
}

// Prints the level in force and the peaks of its widest units; returns
// their JSON fields (with a leading comma).
std::string ReportIsa(const Results& r, const char* instruction, double linear_ratio) {
  const bench::IsaPeaks& p = r.isa_peaks;
  std::printf(
      "  isa %s: peaks fma256 %.1f, fma512 %.1f, bf16dot %.1f GFLOP/s, vnni %.1f (int16 %.1f) "
      "GOP/s; prefill linear layers %.3f of the %s peak\n",
      cpu::IsaName(), p.fma256_gflops, p.fma512_gflops, p.bf16dot_gflops, p.vnni_gops,
      p.vnni_int16_gops, linear_ratio, instruction);
  return absl::StrFormat(
      ",\"isa\":\"%s\",\"fma256_peak_gflops\":%.2f,\"fma512_peak_gflops\":%.2f,"
      "\"bf16dot_peak_gflops\":%.2f,\"vnni_peak_gflops\":%.2f,\"vnni_loop_peak_gflops\":%.2f,"
      "\"vnni_tile_peak_gflops\":%.2f,\"vnni_int16_peak_gflops\":%.2f,"
      "\"pp_linear_vs_isa_peak\":%.3f,\"pp_linear_isa_instruction\":\"%s\"",
      cpu::IsaName(), p.fma256_gflops, p.fma512_gflops, p.bf16dot_gflops, p.vnni_gops,
      p.vnni_loop_gops, p.vnni_tile_gops, p.vnni_int16_gops, linear_ratio, instruction);
}

// One line per row op (512-bit vs 256-bit time, each over a copy of the
// same bytes); returns their JSON fields (with a leading comma).
std::string ReportRowOps(const Options& o, const Results& r) {
  std::string json;
  for (const RowOpTiming& t : r.row_ops) {
    const double avx2_us = 1e6 * t.level_s[0], avx512_us = 1e6 * t.level_s[1];
    const double copy_us = 1e6 * t.copy_s;
    std::printf(
        "  %-28s avx2 %.1f us, avx512 %.1f us (%.2f x), copy of the same %.2f MB %.1f us: %.2f "
        "and %.2f of copy speed\n",
        absl::StrFormat("%s, %d rows", t.name, o.pp).c_str(), avx2_us, avx512_us,
        avx512_us > 0 ? avx2_us / avx512_us : 0, t.bytes / 1e6, copy_us,
        avx2_us > 0 ? copy_us / avx2_us : 0, avx512_us > 0 ? copy_us / avx512_us : 0);
    absl::StrAppendFormat(&json, ",\"%s_avx2_us\":%.1f,\"%s_avx512_us\":%.1f,\"%s_copy_us\":%.1f",
                          t.name, avx2_us, t.name, avx512_us, t.name, copy_us);
  }
  return json;
}

}  // namespace

bool Report(const Options& o, const TextConfig& cfg, const model::Qwen2Weights& weights,
            const Results& r) {
  CheckedRatios ratio;
  const double step_bytes = static_cast<double>(weights.StepWeightBytes());
  const ParamCounts pc = CountParams(weights, cfg);
  const double params = pc.total();
  const double pp_tok_s = o.pp / r.pp_s, tg_tok_s = o.tg / r.tg_s;
  const double batch_tok_s = static_cast<double>(o.tg) * o.batch / r.batch_s;
  const double tg_weight_gbs = step_bytes / (r.tg_s / o.tg) / 1e9;
  const BandwidthReference bw = ReferenceBandwidth(r);
  const std::string level = FootprintLevel(r.bandwidth_footprint, o.threads);
  const double tg_bw_ratio = ratio("tg_bandwidth_ratio", tg_weight_gbs * 1e9, bw.read);
  // Prefill FLOPs: layers for every token, lm_head for the last one, causal
  // attention (q.k and p.v over N(N+1)/2 pairs) in every layer.
  const double attn_flops = 4.0 * cfg.num_attention_heads * cfg.head_dim() * o.pp * (o.pp + 1) /
                            2.0 * cfg.num_hidden_layers;
  const double linear_flops = 2.0 * pc.layers * o.pp + 2.0 * pc.lm_head;
  const double pp_flops = linear_flops + attn_flops;
  const double pp_gflops = pp_flops / r.pp_s / 1e9;
  const double linear_gflops = linear_flops / r.pp_linear_s / 1e9;
  const double weights_mb = weights.TotalWeightBytes() / 1048576.0;
  const double rss_ratio = r.peak_rss / (weights_mb + r.kv_mb);
  const char* dname = o.dtype_name.c_str();
  // The linear layers run on one instruction, the attention on FMAs: the
  // whole step's reference is the larger of the two peaks.
  const auto [instruction, linear_peak] = LinearIsaPeak(o, r);
  const double compute_peak = std::max(linear_peak, r.isa_peaks.widest_fma_gflops());
  const double pp_vs_peak = ratio("pp_vs_isa_peak", pp_gflops, compute_peak);
  const double linear_vs_peak = ratio("pp_linear_vs_isa_peak", linear_gflops, linear_peak);
  // The batched speedup if a batched step cost only its matrix FLOPs (2 per
  // parameter per sequence) at our kernel's rate for that many rows, and at
  // the compute peak: decode of one sequence is bound by weight bandwidth,
  // the batch by compute, so these bound batch<B>_speedup from above.
  const double tg_step_s = r.tg_s / o.tg;
  const double gemm_ceiling = tg_step_s * r.kernel_batch_gflops * 1e9 / (2.0 * params);
  const double peak_ceiling = tg_step_s * compute_peak * 1e9 / (2.0 * params);
  const double speedup = batch_tok_s / tg_tok_s;
  const double batch_vs_peak = ratio("batch_vs_peak_ceiling", speedup, peak_ceiling);
  const bool compared = !o.quantize.empty();
  // int4_* runs report int4_* keys, int8 runs int8_* keys.
  const std::string quant = o.quantize.rfind("int4", 0) == 0 ? "int4" : "int8";
  const double quant_vs_bf16_tg = compared ? r.cmp_bf16_tg_s / r.cmp_quant_tg_s : 0;
  const double bf16_pp_gflops = compared ? pp_flops / r.bf16_pp_s / 1e9 : 0;
  // The bf16 model runs the flag's kernel on bf16 weights: any unit.
  const double bf16_pp_vs_peak =
      compared ? ratio("bf16_pp_vs_isa_peak", bf16_pp_gflops, r.isa_peaks.top_gops()) : 0;

  std::printf(
      "lm_bench: %s%s %s, %d threads, kernel %s, %.0f MiB weights (%.0f MiB per step), %.3f G "
      "active parameters per token\n",
      o.model_name.c_str(), o.random_weights ? " (random weights)" : "", dname, o.threads,
      o.kernel_name.c_str(), weights_mb, step_bytes / 1048576.0, params / 1e9);
  std::printf("  %-28s %10.1f tok/s  (%.1f GFLOP/s, %.2f x sgemm, %.3f of the %.1f GFLOP/s peak)\n",
              absl::StrFormat("pp%d", o.pp).c_str(), pp_tok_s, pp_gflops, pp_gflops / r.sgemm,
              pp_vs_peak, compute_peak);
  std::printf(
      "  %-28s %10.2f tok/s  (%.1f ms/step, %.2f GB/s of weights, %.3f of the read bandwidth)\n",
      absl::StrFormat("tg%d", o.tg).c_str(), tg_tok_s, 1e3 * r.tg_s / o.tg, tg_weight_gbs,
      tg_bw_ratio);
  std::printf(
      "  %-28s linear layers %.0f ms (%.1f GFLOP/s = %.3f of the %s peak), attention %.0f ms "
      "(%.1f GFLOP/s), the rest %.0f ms (medians over reps, timed inside the step)\n",
      "pp breakdown", 1e3 * r.pp_linear_s, linear_gflops, linear_vs_peak, instruction,
      1e3 * r.pp_attention_s, attn_flops / r.pp_attention_s / 1e9, 1e3 * r.pp_rest_s);
  if (compared) {
    std::printf(
        "  vs the same weights in bf16, alternating 16-step chunks: %s %.1f ms/step, bf16 %.1f "
        "ms/step = %.2f x; bf16 pp%d %.1f GFLOP/s = %.3f of the top peak\n",
        o.quantize.c_str(), 1e3 * r.cmp_quant_tg_s / o.tg, 1e3 * r.cmp_bf16_tg_s / o.tg,
        quant_vs_bf16_tg, o.pp, bf16_pp_gflops, bf16_pp_vs_peak);
  }
  std::printf(
      "  %-28s %10.2f tok/s  (%.2f x batch 1; bound %.2f x at our kernel's %.1f GFLOP/s for %d "
      "rows, %.2f x at the compute peak: %.2f of that ceiling)\n",
      absl::StrFormat("tg%d x %d sequences", o.tg, o.batch).c_str(), batch_tok_s, speedup,
      gemm_ceiling, r.kernel_batch_gflops, o.batch, peak_ceiling, batch_vs_peak);
  PrintBaselines(o, cfg, r, weights_mb, bw, level);
  const std::string isa_json = ReportIsa(r, instruction, linear_vs_peak) + ReportRowOps(o, r);
  const std::string cmp_json =
      compared ? absl::StrFormat(
                     ",\"%s_vs_bf16_tg\":%.3f,\"bf16_pp_gflops\":%.2f,\"bf16_pp_vs_isa_peak\":%.3f,"
                     "\"cmp_%s_tg_step_ms\":%.2f,\"cmp_bf16_tg_step_ms\":%.2f",
                     quant, quant_vs_bf16_tg, bf16_pp_gflops, bf16_pp_vs_peak, quant,
                     1e3 * r.cmp_quant_tg_s / o.tg, 1e3 * r.cmp_bf16_tg_s / o.tg)
               : "";
  std::printf(
      "{\"bench\":\"lm_bench\",\"model\":\"%s\",\"model_type\":\"%s\",\"random_weights\":%s,"
      "\"active_params_g\":%.4f,\"dtype\":\"%s\",\"threads\":%d,\"kernel\":\"%s\","
      "\"pp%d_tok_s\":%.2f,\"tg%d_tok_s\":%.3f,\"tg_step_ms\":%.2f,\"batch%d_tok_s\":%.2f,"
      "\"batch%d_speedup\":%.2f,\"batch_gemm_ceiling\":%.2f,\"batch_peak_ceiling\":%.2f,"
      "\"kernel_batch_gflops\":%.2f,\"fma_peak_gflops\":%.2f,\"compute_peak_gflops\":%.2f,"
      "\"step_weight_mb\":%.1f,\"tg_weight_gbs\":%.3f,\"copy_bandwidth_gbs\":%.3f,"
      "\"read_bandwidth_gbs\":%.3f,\"bandwidth_method\":\"%s\",\"bandwidth_footprint_mb\":%.1f,"
      "\"bandwidth_level\":\"%s\",\"tg_bandwidth_ratio\":%.3f,"
      "\"sgemm_gflops\":%.2f,\"kernel_gflops\":%.2f,\"pp_gflops\":%.2f,\"pp_vs_sgemm\":%.3f,"
      "\"peak_rss_mb\":%.1f,\"weights_mb\":%.1f,\"kv_mb\":%.1f,\"rss_ratio\":%.3f,"
      "\"pp_vs_isa_peak\":%.3f,\"batch_vs_peak_ceiling\":%.3f,\"batch_vs_gemm_ceiling\":%.3f,"
      "\"pp_linear_ms\":%.1f,\"pp_attention_ms\":%.1f,\"pp_other_ms\":%.1f%s%s}\n",
      o.model_name.c_str(), o.model_type.c_str(),
      o.random_weights || o.model_dir.empty() ? "true" : "false", params / 1e9, dname, o.threads,
      o.kernel_name.c_str(), o.pp, pp_tok_s, o.tg, tg_tok_s, 1e3 * r.tg_s / o.tg, o.batch,
      batch_tok_s, o.batch, speedup, gemm_ceiling, peak_ceiling, r.kernel_batch_gflops,
      r.isa_peaks.widest_fma_gflops(), compute_peak, step_bytes / 1048576.0, tg_weight_gbs,
      bw.median_copy / 1e9, bw.read / 1e9, bw.method, r.bandwidth_footprint / 1048576.0,
      level.c_str(), tg_bw_ratio, r.sgemm, r.kernel_gflops, pp_gflops, pp_gflops / r.sgemm,
      r.peak_rss, weights_mb, r.kv_mb, rss_ratio, pp_vs_peak, batch_vs_peak, speedup / gemm_ceiling,
      1e3 * r.pp_linear_s, 1e3 * r.pp_attention_s, 1e3 * r.pp_rest_s, isa_json.c_str(),
      cmp_json.c_str());
  std::fflush(stdout);
  return ratio.Report();
}

}  // namespace mmserve::bench
