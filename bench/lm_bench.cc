// llama-bench style throughput of the CPU Qwen2 decoder (model/qwen2_model.h):
//   pp<N>: one prefill step of N tokens from an empty cache (default 512);
//   tg<N>: N decode steps of one sequence from an empty cache (default 128);
//   batch: the same N decode steps for B sequences at once (default 32),
// for a model directory or random weights at named dimensions.
//
// Baselines measured in the same run (the machines are shared and noisy, so
// the ratios are what to compare, and baselines are interleaved with the
// runs they normalize). Every *_vs_*peak ratio and tg_bandwidth_ratio is at
// most 1 by construction; one above 1 means its reference is wrong, and the
// bench prints the JSON line, then FAILED on stderr, and exits 1:
//   - memory bandwidth (bench/memory_bandwidth.h) over all threads, in a
//     forked child (so its buffers stay out of the peak RSS) before each
//     chunk of decode steps, over a footprint of the bytes a decode step
//     reads (so weights that fit in the L2 or L3 are measured there:
//     bandwidth_level): the best read of any method (one stream, eight
//     streams, non-temporal, eight streams on each thread's CPU-time clock:
//     bandwidth_method) in any sample is the reference. tg_bandwidth_ratio = (bytes of the matrices
//     one decode step reads / step time) / that read bandwidth; copy_bandwidth_gbs (STREAM's read +
//     written) is shown beside it;
//   - the GEMM library's throughput: OpenBLAS cblas_sgemm (fp32) at the MLP
//     shape [pp x hidden] x [hidden x intermediate] before each prefill, and
//     our kernel at the same shape in the benchmark dtype, and with `batch`
//     rows after each chunk of batched decode steps and at the end (the
//     best);
//   - the peaks of the CPU's units (bench/isa_peaks.h, each thread on its
//     CPU-time clock): fma_peak_gflops is the widest FMA (512-bit where the
//     CPU has it), compute_peak_gflops the larger of that and the peak of the
//     instruction the linear layers run on (pp_linear_isa_instruction).
// A batched decode step is compute bound (2 FLOPs per parameter per
// sequence) while a single one is bandwidth bound, so batch<B>_speedup can
// be at most tg_step x FLOP rate / (2 x parameters): reported as
// batch_gemm_ceiling (at our kernel's rate for `batch` rows) and
// batch_peak_ceiling (at the compute peak).
// Batch-1 and batched decode steps alternate in chunks of 16 steps so that
// both see the same machine load; batch<B>_speedup is their throughput ratio.
// Peak RSS is the process high-water mark from loading the weights on (the
// baselines' buffers are freed and the mark reset first), next to
// weights_mb + kv_mb.
//
// --model_dir reads the model's config.json (any family: Qwen2-VL,
// Qwen2.5-VL, Qwen3-VL, Qwen3-VL-MoE, Qwen2, Qwen3, Qwen3-MoE) and its
// weights, or random weights at its dimensions when the directory has no
// safetensors. Of a mixture-of-experts model every per-token figure counts
// the active parameters: attention, the router and top_k experts per sparse
// layer (parameters, FLOPs and the bytes a decode step reads).
// FLOPs of a prefill of N tokens: 2 per parameter of the decoder layers per
// token, 2 per lm_head parameter once (only the last row gets logits), and
// the causal attention's 4 x N(N+1)/2 x heads x head_dim per layer.
// isa is the kernels' level (model/cpu/cpu_isa.h; --cpu_isa forces one);
// fma256_peak_gflops, fma512_peak_gflops, bf16dot_peak_gflops and
// vnni_peak_gflops are the units' peaks, pp_vs_isa_peak the prefill's rate
// over compute_peak_gflops and pp_linear_vs_isa_peak its linear layers over
// the peak of their instruction. The prefill's parts are timed inside the
// step (model::Qwen2StepTimes): pp_linear_ms (lm_head's last row included),
// pp_attention_ms, and pp_other_ms, the step's time outside both (norms,
// RoPE, activations, KV writes, thread hand-offs), never negative.
// Row ops: RMSNorm, RoPE's rotation and SiLU*mul at pp rows, timed at
// each level beside a copy of the same bytes (bench/row_ops_timing.h):
// <op>_avx2_us, <op>_avx512_us, <op>_copy_us.
//
// --dtype=int8 / int8_g32 / int4_g32 / int4_g128 / int4_g32_zp / int4_g128_zp
// quantizes the random bf16 weights (or the checkpoint) at load, as
// --quantize does (int4 layers always take int8 activations; their step
// bytes count nibbles, scales and zero points, so tg_bandwidth_ratio is the
// 4-bit stream's fraction of the read bandwidth). Then, after the run above,
// the same weights in bf16 are loaded and decoded in chunks alternating with
// the quantized model's (int8_vs_bf16_tg, or int4_vs_bf16_tg for int4_* =
// bf16 step time / its step time under the same load; cmp_int8_tg_step_ms or
// cmp_int4_tg_step_ms), and prefilled once (bf16_pp_vs_isa_peak, over the
// largest peak). The peak RSS is taken before the bf16 weights are loaded.
//
//   bazel run --config=opt //bench:lm_bench -- --dims=qwen2-0.5b --dtype=bf16
//   bazel run --config=opt //bench:lm_bench -- --dims=qwen2-0.5b --dtype=int8
//   bazel run --config=opt //bench:lm_bench -- --model_dir=/models/Qwen2-VL-2B-Instruct
//   # any family at real dimensions, random weights (config.json only):
//   python3 tools/make_random_checkpoint.py --preset=qwen3-vl-4b --out=/tmp/qwen3-vl-4b
//   bazel run --config=opt //bench:lm_bench -- --model_dir=/tmp/qwen3-vl-4b
//
// Prints a human table, then one JSON line last.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "bench/isa_peaks.h"
#include "bench/lm_bench_report.h"
#include "bench/memory_bandwidth.h"
#include "bench/qwen2_dims.h"
#include "bench/row_ops_timing.h"
#include "common/clock.h"
#include "common/logging.h"
#include "model/cpu/cpu_isa.h"
#include "model/cpu/cpu_isa_flag.h"
#include "model/cpu/linear.h"
#include "model/cpu/linear_bf16dot.h"
#include "model/cpu/linear_int4.h"
#include "model/cpu/linear_int8.h"
#include "model/cpu/thread_pool.h"
#include "model/kv_cache.h"
#include "model/model_config.h"
#include "model/qwen2_model.h"
#include "model/qwen2_weights.h"
#include "model/safetensors.h"

ABSL_FLAG(std::string, model_dir, "", "Hugging Face model directory (overrides --dims)");
ABSL_FLAG(std::string, dims, "qwen2-0.5b",
          "random weights at these text dimensions: qwen2-0.5b, qwen2-vl-2b, qwen3-0.6b, tiny");
ABSL_FLAG(std::string, dtype, "bf16",
          "weights: bf16 or fp32 (random weights' dtype), int8, int8_g32, int4_g32, int4_g128, "
          "int4_g32_zp or int4_g128_zp (quantized at load from bf16 random weights or the "
          "checkpoint, as --quantize)");
ABSL_FLAG(int, threads, 0, "compute threads (0: every core)");
ABSL_FLAG(int, pp, 512, "prompt tokens of the prefill test");
ABSL_FLAG(int, tg, 128, "decode steps of the generation tests");
ABSL_FLAG(int, batch, 32, "concurrent sequences of the batched decode test");
ABSL_FLAG(int, reps, 3,
          "repetitions of the prefill test (the median rep is reported, and the medians of its "
          "breakdown)");
ABSL_FLAG(std::string, kernel, "dot", "linear kernel: dot (ours) or openblas");
ABSL_FLAG(std::string, activation_dtype, "f32",
          "activations of the linear layers with --kernel=dot: f32, bf16 (bf16 layers round them "
          "at each linear, vdpbf16ps: LinearKernel::kBf16Dot) or int8 (int8 layers quantize them "
          "per 32 columns, vpdpbusd: LinearKernel::kInt8Act)");
ABSL_FLAG(int, block_size, 16, "KV block size");

namespace mmserve {
namespace {

using model::ForwardBatch;
using model::TextConfig;
namespace cpu = model::cpu;
using bench::Options;
using bench::Report;
using bench::Results;

// A sequence's share of one step: n tokens from cache position `start`, its
// blocks starting at first_block (contiguous; the kernels do not care).
struct Work {
  int64_t first_block;
  int64_t start;
  int64_t n;
};

ForwardBatch MakeBatch(const std::vector<Work>& work, int64_t block_size, int64_t vocab,
                       uint64_t seed) {
  ForwardBatch b;
  std::vector<int64_t> pos;
  for (const Work& w : work) {
    model::SequenceChunk chunk{b.num_tokens(), w.n, w.start + w.n, {}};
    for (int64_t blk = 0; blk * block_size < w.start + w.n; ++blk) {
      chunk.block_table.push_back(static_cast<int32_t>(w.first_block + blk));
    }
    for (int64_t i = 0; i < w.n; ++i) {
      const int64_t p = w.start + i;
      seed = seed * 6364136223846793005ull + 1442695040888963407ull;
      b.token_ids.push_back(static_cast<int32_t>((seed >> 33) % vocab));
      pos.push_back(p);
      b.slot_mapping.push_back((w.first_block + p / block_size) * block_size + p % block_size);
    }
    b.logits_rows.push_back(b.num_tokens() - 1);
    b.sequences.push_back(std::move(chunk));
  }
  for (int c = 0; c < 3; ++c) b.positions.insert(b.positions.end(), pos.begin(), pos.end());
  return b;
}

// Process memory high-water mark in MiB (VmHWM), and its reset.
double PeakRssMb() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
  }
  return -1;
}
bool ResetPeakRss() {
  std::ofstream out("/proc/self/clear_refs");
  out << "5";
  return static_cast<bool>(out);
}

double LinearGflops(cpu::ThreadPool& pool, int64_t m, int64_t n, int64_t k, model::DType dtype,
                    cpu::LinearKernel kernel, const std::string& quantize = "") {
  std::vector<float> x(m * k, 0.01f), y(m * n);
  std::vector<float> wf(dtype == model::DType::kF32 ? n * k : 0, 0.02f);
  std::vector<uint16_t> wb(dtype == model::DType::kBF16 ? n * k : 0, model::F32ToBf16(0.02f));
  cpu::WeightMatrix w{dtype,
                      dtype == model::DType::kF32 ? static_cast<const void*>(wf.data())
                                                  : static_cast<const void*>(wb.data()),
                      n, k};
  // bf16 runs on panels, as Qwen2Weights holds it.
  std::optional<cpu::PanelWeights> packed;
  std::optional<cpu::Int8Weights> quantized;
  std::optional<cpu::Int4Weights> quantized4;
  const auto scheme = model::ParseQuantize(quantize);
  CHECK_OK(scheme.status());
  if (scheme->quantize == model::Quantization::kInt4) {
    quantized4 = cpu::Int4Weights::Quantize(pool, w, scheme->int4);
    w = quantized4->matrix();
  } else if (!quantize.empty()) {
    quantized = cpu::Int8Weights::Quantize(pool, w, scheme->int8_group);
    w = quantized->matrix();
  } else if (dtype == model::DType::kBF16) {
    packed = cpu::PanelWeights::Pack(pool, w);
    w = packed->matrix();
  }
  cpu::Linear(pool, x.data(), m, w, nullptr, y.data(), kernel);  // warm-up
  double best = 0;
  for (int r = 0; r < 3; ++r) {
    Stopwatch sw;
    cpu::Linear(pool, x.data(), m, w, nullptr, y.data(), kernel);
    best = std::max(best, 2.0 * m * n * k / sw.ElapsedSeconds() / 1e9);
  }
  return best;
}

Options ReadFlags() {
  Options o;
  o.threads = absl::GetFlag(FLAGS_threads) > 0 ? absl::GetFlag(FLAGS_threads)
                                               : cpu::ThreadPool::DefaultThreads();
  o.pp = absl::GetFlag(FLAGS_pp);
  o.tg = absl::GetFlag(FLAGS_tg);
  o.batch = absl::GetFlag(FLAGS_batch);
  o.reps = absl::GetFlag(FLAGS_reps);
  o.block_size = absl::GetFlag(FLAGS_block_size);
  o.model_dir = absl::GetFlag(FLAGS_model_dir);
  o.model_name = o.model_dir.empty() ? absl::GetFlag(FLAGS_dims) : o.model_dir;
  o.kernel_name = absl::GetFlag(FLAGS_kernel);
  o.kernel = o.kernel_name == "openblas" ? cpu::LinearKernel::kOpenBlas : cpu::LinearKernel::kDot;
  const std::string activations = absl::GetFlag(FLAGS_activation_dtype);
  CHECK(activations == "f32" || activations == "bf16" || activations == "int8")
      << "unknown --activation_dtype";
  if (activations == "bf16" && o.kernel == cpu::LinearKernel::kDot) {
    o.kernel = cpu::LinearKernel::kBf16Dot;
    o.kernel_name = "bf16dot";
  }
  if (activations == "int8" && o.kernel == cpu::LinearKernel::kDot) {
    o.kernel = cpu::LinearKernel::kInt8Act;
    o.kernel_name = "int8act";
  }
  const std::string dtype = absl::GetFlag(FLAGS_dtype);
  o.dtype = dtype == "fp32" ? model::DType::kF32 : model::DType::kBF16;
  if (dtype != "fp32" && dtype != "bf16") {
    CHECK(model::ParseQuantize(dtype).ok()) << "unknown --dtype " << dtype;
    o.quantize = dtype;
  }
  if (o.quantize.rfind("int4", 0) == 0 && o.kernel == cpu::LinearKernel::kDot) {
    o.kernel = cpu::LinearKernel::kInt8Act;  // what int4 layers run whatever the flag
    o.kernel_name = "int8act";
  }
  o.dtype_name = dtype;
  return o;
}

// The weights, from the directory or random (then `ckpt` stays empty).
struct BenchModel {
  TextConfig cfg;
  std::unique_ptr<model::SafetensorsCheckpoint> ckpt;
  std::unique_ptr<model::Qwen2Weights> weights;
};

// Whether dir holds safetensors weights (one file or an index of shards).
bool HasWeights(const std::string& dir) {
  return access((dir + "/model.safetensors").c_str(), R_OK) == 0 ||
         access((dir + "/model.safetensors.index.json").c_str(), R_OK) == 0;
}

BenchModel LoadBenchModel(Options& o, const std::string& quantize) {
  BenchModel m;
  auto weight_options = model::ParseQuantize(quantize);
  CHECK_OK(weight_options.status());
  if (o.model_dir.empty()) {
    if (!NamedTextDims(o.model_name, &m.cfg)) LOG(FATAL) << "unknown --dims " << o.model_name;
    m.weights = model::Qwen2Weights::Random(m.cfg, o.dtype, 1, *weight_options);
    return m;
  }
  auto cfg = model::LoadModelConfig(o.model_dir);
  CHECK_OK(cfg.status());
  m.cfg = cfg->text;
  o.model_type = cfg->model_type;
  // A directory with only config.json: random weights at its dimensions
  // (tools/make_random_checkpoint.py writes such directories).
  o.random_weights = !HasWeights(o.model_dir);
  if (o.random_weights) {
    m.weights = model::Qwen2Weights::Random(m.cfg, o.dtype, 1, *weight_options);
    return m;
  }
  auto opened = model::SafetensorsCheckpoint::Open(o.model_dir);
  CHECK_OK(opened.status());
  m.ckpt = std::move(opened).value();
  auto loaded = model::Qwen2Weights::Load(*m.ckpt, m.cfg, *weight_options);
  CHECK_OK(loaded.status());
  m.weights = std::move(loaded).value();
  if (quantize.empty()) {
    o.dtype = m.weights->layers()[0].q.dtype;
    o.dtype_name = o.dtype == model::DType::kF32 ? "fp32" : "bf16";
  }
  return m;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// pp (each rep preceded by an sgemm baseline; the model times its linear
// layers and attention inside the step, through `times`), then decode in
// chunks of single-sequence and batched steps, each pair preceded by a
// bandwidth sample over the bytes a decode step reads.
void RunSteps(const Options& o, const TextConfig& cfg, const model::Qwen2Weights& weights,
              model::Qwen2Model& qwen, model::Qwen2StepTimes& times, cpu::ThreadPool& pool,
              Results* r) {
  const int64_t per_seq_blocks = (std::max(o.pp, o.tg) + o.block_size - 1) / o.block_size;
  auto kv_or = model::KvCache::Create(qwen.KvShape(per_seq_blocks * o.batch, o.block_size));
  CHECK_OK(kv_or.status());
  model::KvCache& kv = **kv_or;
  r->kv_mb = kv.bytes() / 1048576.0;
  std::vector<float> logits;
  auto step = [&](const std::vector<Work>& work, uint64_t seed) {
    ForwardBatch b = MakeBatch(work, o.block_size, cfg.vocab_size, seed);
    CHECK_OK(qwen.Forward(b, kv, &logits));
  };
  step({{0, 0, 16}}, 0);  // warm-up: touches the weights once
  const double load_peak_rss = PeakRssMb();
  std::vector<double> step_s_all, linear_s, attention_s, rest_s;
  for (int rep = 0; rep < o.reps; ++rep) {
    r->sgemm += LinearGflops(pool, o.pp, cfg.intermediate_size, cfg.hidden_size, model::DType::kF32,
                             cpu::LinearKernel::kOpenBlas) /
                o.reps;
    times = {};
    Stopwatch sw;
    step({{0, 0, o.pp}}, rep + 1);
    const double step_s = sw.ElapsedSeconds();
    step_s_all.push_back(step_s);
    linear_s.push_back(times.linear_seconds);
    attention_s.push_back(times.attention_seconds);
    // The parts are disjoint intervals inside the step: the rest is >= 0.
    rest_s.push_back(step_s - times.linear_seconds - times.attention_seconds);
  }
  // Medians: one rep slowed by a neighbour's build does not move them.
  r->pp_s = Median(step_s_all);
  r->pp_linear_s = Median(linear_s);
  r->pp_attention_s = Median(attention_s);
  r->pp_rest_s = Median(rest_s);
  r->bandwidth_footprint = static_cast<size_t>(weights.StepWeightBytes());
  constexpr int kChunk = 16;
  for (int i0 = 0; i0 < o.tg; i0 += kChunk) {
    r->bandwidth_samples.push_back(
        bench::MeasureMemoryBandwidthInChild(o.threads, r->bandwidth_footprint, 3));
    const int i1 = std::min(o.tg, i0 + kChunk);
    Stopwatch tg_watch;
    for (int i = i0; i < i1; ++i) step({{0, i, 1}}, 100 + i);
    r->tg_s += tg_watch.ElapsedSeconds();
    Stopwatch batch_watch;
    for (int i = i0; i < i1; ++i) {
      std::vector<Work> work;
      for (int s = 0; s < o.batch; ++s) work.push_back({s * per_seq_blocks, i, 1});
      step(work, 1000 + i);
    }
    r->batch_s += batch_watch.ElapsedSeconds();
    // The batch ceiling's kernel rate under the same load as the chunk.
    r->kernel_batch_gflops = std::max(
        r->kernel_batch_gflops, LinearGflops(pool, o.batch, cfg.intermediate_size, cfg.hidden_size,
                                             o.dtype, o.kernel, o.quantize));
  }
  r->peak_rss = std::max(load_peak_rss, PeakRssMb());
}

// --dtype=int8: the same weights in bf16, prefilled once and decoded in
// chunks that alternate with the int8 model's.
void CompareWithBf16(Options o, model::Qwen2Model& int8_model, cpu::ThreadPool& pool, Results* r) {
  o.dtype = model::DType::kBF16;
  BenchModel m = LoadBenchModel(o, "");
  model::Qwen2Model bf16_model(m.cfg, *m.weights, pool, {o.kernel});
  const int64_t per_seq_blocks = (std::max(o.pp, o.tg) + o.block_size - 1) / o.block_size;
  auto kv_int8 = model::KvCache::Create(int8_model.KvShape(per_seq_blocks, o.block_size));
  auto kv_bf16 = model::KvCache::Create(bf16_model.KvShape(per_seq_blocks, o.block_size));
  CHECK_OK(kv_int8.status());
  CHECK_OK(kv_bf16.status());
  std::vector<float> logits;
  auto step = [&](model::Qwen2Model& qwen, model::KvCache& kv, const std::vector<Work>& work,
                  uint64_t seed) {
    ForwardBatch b = MakeBatch(work, o.block_size, m.cfg.vocab_size, seed);
    CHECK_OK(qwen.Forward(b, kv, &logits));
  };
  step(bf16_model, **kv_bf16, {{0, 0, 16}}, 0);  // warm-up
  std::vector<double> bf16_pp;
  for (int rep = 0; rep < o.reps; ++rep) {
    Stopwatch sw;
    step(bf16_model, **kv_bf16, {{0, 0, o.pp}}, rep + 1);
    bf16_pp.push_back(sw.ElapsedSeconds());
  }
  r->bf16_pp_s = Median(bf16_pp);
  constexpr int kChunk = 16;
  for (int i0 = 0; i0 < o.tg; i0 += kChunk) {
    const int i1 = std::min(o.tg, i0 + kChunk);
    Stopwatch int8_watch;
    for (int i = i0; i < i1; ++i) step(int8_model, **kv_int8, {{0, i, 1}}, 100 + i);
    r->cmp_quant_tg_s += int8_watch.ElapsedSeconds();
    Stopwatch bf16_watch;
    for (int i = i0; i < i1; ++i) step(bf16_model, **kv_bf16, {{0, i, 1}}, 100 + i);
    r->cmp_bf16_tg_s += bf16_watch.ElapsedSeconds();
  }
}

// Multiply-accumulates of the decoder layers' matrices and of lm_head.
int Run() {
  Options o = ReadFlags();
  cpu::ThreadPool pool(o.threads);
  Results r;
  r.rss_reset = ResetPeakRss();
  BenchModel m = LoadBenchModel(o, o.quantize);
  model::Qwen2StepTimes times;
  model::Qwen2Model qwen(m.cfg, *m.weights, pool, {o.kernel, nullptr, &times});
  RunSteps(o, m.cfg, *m.weights, qwen, times, pool, &r);
  if (!o.quantize.empty()) CompareWithBf16(o, qwen, pool, &r);
  r.kernel_gflops = LinearGflops(pool, o.pp, m.cfg.intermediate_size, m.cfg.hidden_size, o.dtype,
                                 o.kernel, o.quantize);
  r.kernel_batch_gflops = std::max(
      r.kernel_batch_gflops, LinearGflops(pool, o.batch, m.cfg.intermediate_size, m.cfg.hidden_size,
                                          o.dtype, o.kernel, o.quantize));
  r.isa_peaks = bench::MeasureIsaPeaks(pool, 3);
  r.row_ops = bench::TimeRowOps(pool, m.cfg, o.pp, 5);
  return Report(o, m.cfg, *m.weights, r) ? 0 : 1;
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
