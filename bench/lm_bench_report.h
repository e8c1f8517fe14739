// lm_bench's options and measurements, and its report: the human table,
// the baselines in words and the closing JSON line (lm_bench.cc measures;
// this file only derives ratios and prints). Not thread-safe.
#ifndef MMSERVE_BENCH_LM_BENCH_REPORT_H_
#define MMSERVE_BENCH_LM_BENCH_REPORT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "bench/isa_peaks.h"
#include "bench/row_ops_timing.h"
#include "model/cpu/linear.h"
#include "model/dtype.h"
#include "model/model_config.h"
#include "model/qwen2_weights.h"

namespace mmserve::bench {

namespace cpu = model::cpu;

struct Options {
  int threads, pp, tg, batch, reps;
  int64_t block_size;
  std::string model_dir, model_name, kernel_name;
  cpu::LinearKernel kernel;
  model::DType dtype;           // of the random weights before quantization
  std::string quantize;         // "", "int8", "int8_g32", "int4_g32", ... (--quantize's names)
  std::string dtype_name;       // as reported
  std::string model_type;       // config.json's, with --model_dir
  bool random_weights = false;  // --model_dir without safetensors
};

struct Results {
  double pp_s = 0, sgemm = 0, tg_s = 0, batch_s = 0, kernel_gflops = 0;
  double kernel_batch_gflops = 0, fma_peak_gflops = 0;
  bench::IsaPeaks isa_peaks;  // the widest units' (fma_peak_gflops: 256-bit FMA)
  double peak_rss = 0, kv_mb = 0;
  bool rss_reset = false;
  // --dtype=int8 or int4_*: the bf16 comparison (step times under the same
  // load; cmp_int8_tg_s is the quantized model's, int8 or int4).
  double cmp_int8_tg_s = 0, cmp_bf16_tg_s = 0, bf16_pp_s = 0;
  // Prefill parts timed alone right after each prefill step (PrefillParts):
  // medians over the reps of the linear layers, the attention and the rest
  // of that rep's step (step - linear - attention).
  double pp_linear_s = 0, pp_attention_s = 0, pp_rest_s = 0;
  // RMSNorm, RoPE and SiLU*mul at pp rows, each level beside a copy.
  std::vector<RowOpTiming> row_ops;
  std::vector<double> copy_samples, read_samples;  // sorted
  double copy() const { return copy_samples[copy_samples.size() / 2]; }
  double read() const { return read_samples[read_samples.size() / 2]; }
};

// Prints the table and the closing JSON line of one run.
void Report(const Options& o, const model::TextConfig& cfg, const model::Qwen2Weights& weights,
            const Results& r);

}  // namespace mmserve::bench

#endif  // MMSERVE_BENCH_LM_BENCH_REPORT_H_
