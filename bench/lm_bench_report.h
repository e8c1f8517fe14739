// lm_bench's options and measurements, and its report: the human table,
// the baselines in words and the closing JSON line (lm_bench.cc measures;
// this file only derives ratios and prints). Not thread-safe.
#ifndef MMSERVE_BENCH_LM_BENCH_REPORT_H_
#define MMSERVE_BENCH_LM_BENCH_REPORT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "bench/isa_peaks.h"
#include "bench/memory_bandwidth.h"
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
  double kernel_batch_gflops = 0;
  bench::IsaPeaks isa_peaks;  // the peaks every *_vs_*peak ratio is set against
  double peak_rss = 0, kv_mb = 0;
  bool rss_reset = false;
  // --dtype=int8 or int4_*: the bf16 comparison (step times under the same
  // load; cmp_quant_tg_s is the quantized model's).
  double cmp_quant_tg_s = 0, cmp_bf16_tg_s = 0, bf16_pp_s = 0;
  // Prefill parts timed inside each prefill step (model::Qwen2StepTimes):
  // medians over the reps of the linear layers, the attention and the rest
  // of that rep's step (step - linear - attention, never negative).
  double pp_linear_s = 0, pp_attention_s = 0, pp_rest_s = 0;
  // RMSNorm, RoPE and SiLU*mul at pp rows, each level beside a copy.
  std::vector<RowOpTiming> row_ops;
  // One sample before each chunk of decode steps, over bandwidth_footprint
  // bytes (a decode step's weights).
  std::vector<MemoryBandwidth> bandwidth_samples;
  size_t bandwidth_footprint = 0;
};

// Prints the table and the closing JSON line of one run. False (and the
// reasons on stderr) if a rate passed its peak or bandwidth reference.
bool Report(const Options& o, const model::TextConfig& cfg, const model::Qwen2Weights& weights,
            const Results& r);

}  // namespace mmserve::bench

#endif  // MMSERVE_BENCH_LM_BENCH_REPORT_H_
