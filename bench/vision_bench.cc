// Vision tower throughput and memory at Qwen2-VL-2B vision dimensions
// (random weights, bf16 by default), for 448x448 and 1024x1024 inputs.
// Baselines, measured in the same run right before each size: the kernel
// the tower's linear layers run (bf16 panels with fp32 activations: kDot;
// with --activation_dtype=bf16: kBf16Dot; fp32 weights: OpenBLAS) on the
// tower's first MLP layer at that size's patch rows (embed_dim -> its MLP
// width), best of three; tower_vs_kernel = tower GFLOP/s / kernel GFLOP/s
// (every FLOP of the tower counted, attention included). And the peaks of
// the CPU's units (bench/isa_peaks.h): tower_vs_isa_peak = tower GFLOP/s /
// the larger of the widest FMA's peak and, with bf16 activations,
// vdpbf16ps's: at most 1 by construction; above 1 the bench prints FAILED
// on stderr and exits 1 (the peak is wrong, and is not clamped). Memory:
// the tower's RSS = the growth from creating it (its weights) + the peak
// growth during a forward (activations), over the bf16 weight bytes; freed
// heap is handed back (malloc_trim) before each measurement so that the
// baseline's buffers are not counted or reused. The time's shares by stage
// (VisionTrace): linear layers, attention, then the row ops: LayerNorms
// (norm%), the rotary embedding with the q/k/v scatter (rope%), residual
// adds and activations (elem%). Then LayerNorm and RoPE alone on one row
// chunk at each kernel level beside a copy (row_ops_timing.h).
//
// --peer=torch: then transformers' tower in PyTorch (tools/torch_vision_peer.py,
// run with --peer_python, default the tools virtualenv) on the same grids,
// depth and threads, in bfloat16 with --activation_dtype=bf16 and float32
// otherwise (PyTorch has no bf16-weight, fp32-activation mode), each size
// right after ours (interleaved, so both see the same machine load; a child
// process per size; it times a forward after an untimed one at the same
// grid, as oneDNN sets up per shape, while ours is timed cold); vs_torch =
// torch time / our time (> 1: we are faster). Without PyTorch the peer is
// skipped and the reason printed.
//
// --model_dir: the tower of that model's config.json (Qwen2-VL, Qwen2.5-VL
// with its windows, Qwen3-VL and Qwen3-VL-MoE with their DeepStack mergers)
// and its preprocessor_config.json, at the config's depth unless --depth is
// given; its weights when the directory has safetensors, else random ones.
// FLOPs count each family's MLP (Qwen2.5-VL's gated one), attention inside
// windows where Qwen2.5-VL uses them, and the DeepStack mergers.
//
//   bazel run --config=opt //bench:vision_bench -- [--depth=32] [--iters=1] [--dtype=bf16|f32]
//       [--cpu_isa=avx2|avx512] [--activation_dtype=bf16] [--peer=torch] [--sizes=448,1024]
//       [--model_dir=/tmp/qwen3-vl-2b]
#include <malloc.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "bench/isa_peaks.h"
#include "bench/row_ops_timing.h"
#include "bench/torch_vision_peer.h"
#include "common/clock.h"
#include "common/logging.h"
#include "model/cpu/cpu_isa.h"
#include "model/cpu/linear.h"
#include "model/cpu/thread_pool.h"
#include "model/dtype.h"
#include "model/image_preprocess.h"
#include "model/model_config.h"
#include "model/safetensors.h"
#include "model/vision_tower.h"

namespace mmserve {
namespace {

using model::MediaGrid;
using model::RgbImage;
namespace cpu = model::cpu;

struct Args {
  int depth = 32;
  bool depth_given = false;
  std::string model_dir;
  int iters = 1;
  model::DType dtype = model::DType::kBF16;
  std::string cpu_isa;                   // --cpu_isa=avx2|avx512 (cpu_isa.h)
  bool bf16_activations = false;         // --activation_dtype=bf16
  std::string peer;                      // --peer=torch
  std::vector<int> sizes = {448, 1024};  // --sizes=448,1024 (square images)
  std::string peer_python = "/root/.cache/mmserve-tools-venv/bin/python";
  std::string peer_script = bench::DefaultTorchVisionPeerScript();
};

Args ParseArgs(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string s = argv[i];
    if (s.rfind("--depth=", 0) == 0) a.depth_given = absl::SimpleAtoi(s.substr(8), &a.depth);
    if (s.rfind("--model_dir=", 0) == 0) a.model_dir = s.substr(12);
    if (s.rfind("--iters=", 0) == 0) (void)absl::SimpleAtoi(s.substr(8), &a.iters);
    if (s == "--dtype=f32") a.dtype = model::DType::kF32;
    if (s.rfind("--cpu_isa=", 0) == 0) a.cpu_isa = s.substr(10);
    if (s == "--activation_dtype=bf16") a.bf16_activations = true;
    if (s.rfind("--peer=", 0) == 0) a.peer = s.substr(7);
    if (s.rfind("--sizes=", 0) == 0) {
      a.sizes.clear();
      const std::string list = s.substr(8);
      for (absl::string_view part : absl::StrSplit(list, ',')) {
        int size = 0;
        if (absl::SimpleAtoi(part, &size) && size > 0) a.sizes.push_back(size);
      }
    }
    if (s.rfind("--peer_python=", 0) == 0) a.peer_python = s.substr(14);
    if (s.rfind("--peer_script=", 0) == 0) a.peer_script = s.substr(14);
  }
  return a;
}

// A deterministic test card: gradients and stripes, so resizing has work.
RgbImage TestImage(int size) {
  RgbImage img;
  img.width = img.height = size;
  img.pixels.resize(static_cast<size_t>(size) * size * 3);
  for (int y = 0; y < size; ++y) {
    for (int x = 0; x < size; ++x) {
      uint8_t* p = &img.pixels[(static_cast<size_t>(y) * size + x) * 3];
      p[0] = static_cast<uint8_t>(x * 255 / size);
      p[1] = static_cast<uint8_t>(y * 255 / size);
      p[2] = static_cast<uint8_t>(((x / 16) + (y / 16)) % 2 ? 220 : 30);
    }
  }
  return img;
}

// FLOPs of one tower forward over n patches of one image, for the
// config's family: patch embedding, per block q/k/v, proj, the MLP (gated
// for Qwen2.5-VL) and attention (inside windows of window_size pixels in
// Qwen2.5-VL's windowed blocks), then the merger and Qwen3-VL's DeepStack
// mergers.
double TowerFlops(const model::VisionConfig& c, double n) {
  using Arch = model::VisionConfig::Arch;
  const double e = c.embed_dim;
  const double patch = 1.0 * c.in_channels * c.temporal_patch_size * c.patch_size * c.patch_size;
  const double unit = c.spatial_merge_size * c.spatial_merge_size;
  const double merged = e * unit, tokens = n / unit;
  const double mlp = c.arch == Arch::kQwen2Vl    ? 2 * 2 * n * e * e * c.mlp_ratio
                     : c.arch == Arch::kQwen25Vl ? 3 * 2 * n * e * c.intermediate_size
                                                 : 2 * 2 * n * e * c.intermediate_size;
  const double window = c.window_size > 0 ? std::pow(c.window_size / c.patch_size, 2) : n;
  double blocks = 0;
  for (int b = 0; b < c.depth; ++b) {
    const bool full = c.arch != Arch::kQwen25Vl ||
                      std::find(c.fullatt_block_indexes.begin(), c.fullatt_block_indexes.end(),
                                b) != c.fullatt_block_indexes.end();
    blocks +=
        2 * n * e * 3 * e + 2 * n * e * e + mlp + 2 * 2 * n * (full ? n : std::min(n, window)) * e;
  }
  const double merger = 2 * tokens * merged * merged + 2 * tokens * merged * c.hidden_size;
  return 2 * n * patch * e + blocks + merger * (1 + c.deepstack_visual_indexes.size());
}

// The tower's linear kernel on `rows` rows of its first MLP layer
// (embed_dim -> MLP width) in the tower's dtype, best of three, GFLOP/s.
double KernelGflops(const Args& args, const model::VisionConfig& cfg, cpu::ThreadPool& pool,
                    int64_t rows) {
  const int64_t m = rows, k = cfg.embed_dim;
  const int64_t n = cfg.intermediate_size > 0 ? cfg.intermediate_size
                                              : static_cast<int64_t>(cfg.embed_dim) * cfg.mlp_ratio;
  std::vector<float> wf;
  std::vector<uint16_t> wb;
  std::optional<cpu::PanelWeights> panels;
  cpu::WeightMatrix w{args.dtype, nullptr, n, k};
  cpu::LinearKernel kernel = cpu::LinearKernel::kOpenBlas;
  if (args.dtype == model::DType::kF32) {
    wf.resize(n * k);
    for (size_t i = 0; i < wf.size(); ++i) wf[i] = ((i * 7919) % 97) * 1e-3f - 0.05f;
    w.data = wf.data();
  } else {
    wb.resize(n * k);
    for (size_t i = 0; i < wb.size(); ++i) {
      wb[i] = model::F32ToBf16(((i * 7919) % 97) * 1e-3f - 0.05f);
    }
    w.data = wb.data();
    panels = cpu::PanelWeights::Pack(pool, w);
    w = panels->matrix();
    kernel = args.bf16_activations ? cpu::LinearKernel::kBf16Dot : cpu::LinearKernel::kDot;
  }
  std::vector<float> x(m * k, 0.25f), y(m * n);
  cpu::Linear(pool, x.data(), m, w, nullptr, y.data(), kernel);  // warm-up
  double best = 0;
  for (int r = 0; r < 3; ++r) {
    Stopwatch watch;
    cpu::Linear(pool, x.data(), m, w, nullptr, y.data(), kernel);
    best = std::max(best, 2.0 * m * n * k / watch.ElapsedSeconds() * 1e-9);
  }
  return best;
}

// The peak the whole tower is set against: the widest FMA's, or with bf16
// activations the larger of that and vdpbf16ps's.
double TowerPeak(const Args& args, const bench::IsaPeaks& p) {
  return std::max(p.widest_fma_gflops(), args.bf16_activations ? p.bf16dot_gflops : 0.0);
}

int64_t ProcStatusBytes(const char* key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key, 0) == 0) return std::atoll(line.c_str() + std::strlen(key)) * 1024;
  }
  return 0;
}

// One input size through the tower, args.iters times (the baseline kernel
// measured right before it): prints its table row, returns its JSON object
// and sets *tower_s (mean seconds) and *activations (peak growth, bytes).
std::string MeasureSize(const Args& args, cpu::ThreadPool& pool, model::VisionTower& tower,
                        const model::VisionConfig& cfg, int size, const model::ImagePatches& p,
                        double pre_ms, double* tower_s, int64_t* activations,
                        std::vector<std::string>* failures) {
  // Baselines next to each size.
  const double kernel = KernelGflops(args, cfg, pool, p.grid.num_patches());
  const double peak = TowerPeak(args, bench::MeasureIsaPeaks(pool, 2));
  malloc_trim(0);
  std::ofstream("/proc/self/clear_refs") << "5";  // reset the peak RSS (VmHWM)
  const int64_t rss_before = ProcStatusBytes("VmRSS:");
  double total_s = 0, gemm_s = 0, attn_s = 0, norm_s = 0, rope_s = 0, elem_s = 0;
  for (int it = 0; it < args.iters; ++it) {
    model::VisionTrace trace;
    trace.record_activations = false;
    std::vector<MediaGrid> grids = {p.grid};
    auto out = tower.Forward(p.values, grids, &trace);
    CHECK_OK(out.status());
    total_s += trace.total_seconds;
    gemm_s += trace.gemm_seconds;
    attn_s += trace.attention_seconds;
    norm_s += trace.norm_seconds;
    rope_s += trace.rope_seconds;
    elem_s += trace.elementwise_seconds;
  }
  *activations = ProcStatusBytes("VmHWM:") - rss_before;
  const double t = total_s / args.iters;
  gemm_s /= args.iters;
  attn_s /= args.iters;
  norm_s /= args.iters;
  rope_s /= args.iters;
  elem_s /= args.iters;
  *tower_s = t;
  const int64_t patches = p.grid.num_patches(), tokens = p.grid.num_tokens();
  const double gflops = TowerFlops(cfg, patches) / t * 1e-9;
  const absl::StatusOr<double> vs_peak =
      bench::PeakRatio(absl::StrFormat("tower_vs_isa_peak at %d", size), gflops, peak);
  if (!vs_peak.ok()) failures->emplace_back(vs_peak.status().message());
  const double ips = 1.0 / (pre_ms * 1e-3 + t);
  std::printf(
      "%6d %8lld %7lld %10.1f %10.1f %10.3f %7.1f%% %7.1f%% %6.2f%% %6.2f%% %6.2f%% %11.1f %11.1f "
      "%9.2f %8.3f\n",
      size, static_cast<long long>(patches), static_cast<long long>(tokens), pre_ms, t * 1e3, ips,
      100 * gemm_s / t, 100 * attn_s / t, 100 * norm_s / t, 100 * rope_s / t, 100 * elem_s / t,
      gflops, kernel, gflops / kernel, gflops / peak);
  return absl::StrFormat(
      "{\"size\":%d,\"patches\":%d,\"tokens\":%d,\"preprocess_ms\":%.1f,\"tower_ms\":%.1f,"
      "\"images_per_s\":%.4f,\"linear_share\":%.3f,\"attention_share\":%.3f,"
      "\"norm_ms\":%.1f,\"rope_ms\":%.1f,\"elementwise_ms\":%.1f,"
      "\"tower_gflops\":%.1f,\"kernel_gflops\":%.1f,\"tower_vs_kernel\":%.3f,"
      "\"isa_peak_gflops\":%.1f,\"tower_vs_isa_peak\":%.3f,\"activation_peak_bytes\":%d}",
      size, patches, tokens, pre_ms, t * 1e3, ips, gemm_s / t, attn_s / t, norm_s * 1e3,
      rope_s * 1e3, elem_s * 1e3, gflops, kernel, gflops / kernel, peak, gflops / peak,
      *activations);
}

// The Qwen2-VL-2B vision tower's dimensions, at `depth` blocks.
model::VisionConfig TowerConfig(int depth) {
  model::VisionConfig cfg;
  cfg.depth = depth;
  cfg.embed_dim = 1280;
  cfg.num_heads = 16;
  cfg.mlp_ratio = 4;
  cfg.hidden_size = 1536;
  return cfg;
}

// --peer=torch on one grid: transformers' tower in a child process.
bench::TorchVisionPeerResult PeerOnGrid(const Args& args, int threads, const MediaGrid& grid) {
  bench::TorchVisionPeerRequest req;
  req.python = args.peer_python;
  req.script = args.peer_script;
  req.grids = {grid};
  req.depth = args.depth;
  req.threads = threads;
  req.dtype = args.bf16_activations ? "bfloat16" : "float32";
  req.iters = args.iters;
  return bench::RunTorchVisionPeer(req);
}

// The peer's lines and JSON field (with a leading comma; "" without
// --peer). peers[i]: the run right after our size i (the first skip ends
// the list).
std::string PeerReport(const Args& args, int threads, const std::vector<int>& sizes,
                       const std::vector<double>& tower_s,
                       const std::vector<bench::TorchVisionPeerResult>& peers) {
  if (args.peer.empty()) return "";
  if (peers.empty() || !peers.back().ran) {
    const std::string reason = peers.empty() ? "not run" : peers.back().skipped_reason;
    std::printf("peer torch: skipped (%s)\n", reason.c_str());
    return absl::StrFormat(",\"peer\":{\"name\":\"torch\",\"skipped\":\"%s\"}",
                           absl::CEscape(reason));
  }
  const char* dtype = args.bf16_activations ? "bfloat16" : "float32";
  std::printf("peer torch %s, %s, %d threads, same grids and depth, each right after ours:\n",
              peers[0].torch_version.c_str(), dtype, threads);
  std::vector<std::string> rows;
  for (size_t i = 0; i < peers.size(); ++i) {
    const double torch_s = peers[i].seconds[0], ratio = torch_s / tower_s[i];
    std::printf("%6d  torch %10.1f ms  ours %10.1f ms  vs_torch %.2f\n", sizes[i], torch_s * 1e3,
                tower_s[i] * 1e3, ratio);
    rows.push_back(absl::StrFormat("{\"size\":%d,\"torch_ms\":%.1f,\"vs_torch\":%.3f}", sizes[i],
                                   torch_s * 1e3, ratio));
  }
  return absl::StrFormat(
      ",\"peer\":{\"name\":\"torch\",\"torch\":\"%s\",\"dtype\":\"%s\",\"sizes\":[%s]}",
      peers[0].torch_version, dtype, absl::StrJoin(rows, ","));
}

// The tower's row ops on one of its 256-row chunks, one thread, at each
// level beside a copy (row_ops_timing.h): prints a line per op and returns
// the JSON fields, with a leading comma.
std::string RowOpsReport(const model::VisionConfig& cfg) {
  constexpr int64_t kRows = 256;
  std::string json;
  std::printf("row ops, %lld patches, one thread, best of 20 (us): avx2 / avx512 / copy\n",
              static_cast<long long>(kRows));
  for (const bench::RowOpTiming& t : bench::TimeVisionRowOps(kRows, cfg.embed_dim, cfg.num_heads,
                                                             /*reps=*/20)) {
    std::printf("  %-12s %8.1f / %8.1f / %8.1f\n", t.name, t.level_s[0] * 1e6, t.level_s[1] * 1e6,
                t.copy_s * 1e6);
    absl::StrAppendFormat(&json, ",\"%s_avx2_us\":%.1f,\"%s_avx512_us\":%.1f,\"%s_copy_us\":%.1f",
                          t.name, t.level_s[0] * 1e6, t.name, t.level_s[1] * 1e6, t.name,
                          t.copy_s * 1e6);
  }
  return json;
}

int Main(int argc, char** argv) {
  const Args args = ParseArgs(argc, argv);
  if (absl::Status s = cpu::SetCpuIsaByName(args.cpu_isa); !s.ok()) {
    std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
    return 1;
  }
  if (!args.peer.empty() && args.peer != "torch") {
    std::fprintf(stderr, "--peer takes \"torch\", not \"%s\"\n", args.peer.c_str());
    return 1;
  }
  model::VisionConfig cfg = TowerConfig(args.depth);
  model::PreprocessorConfig pre;  // defaults: min 56*56, max 28*28*1280 pixels
  std::string name = "qwen2-vl-2b", model_type = "qwen2_vl";
  std::unique_ptr<model::SafetensorsCheckpoint> ckpt;  // --model_dir with weights
  std::optional<model::ModelConfig> model_cfg;
  if (!args.model_dir.empty()) {
    auto loaded = model::LoadModelConfig(args.model_dir);
    if (!loaded.ok() || !loaded->vision) {
      std::fprintf(stderr, "%s\n",
                   loaded.ok() ? "--model_dir: config.json has no vision_config"
                               : std::string(loaded.status().message()).c_str());
      return 1;
    }
    if (!args.peer.empty()) {
      std::fprintf(stderr, "--peer runs the Qwen2-VL-2B tower only: drop --model_dir\n");
      return 1;
    }
    model_cfg = *loaded;
    cfg = *loaded->vision;
    if (args.depth_given) cfg.depth = args.depth;
    if (loaded->preprocessor) {
      pre = *loaded->preprocessor;
    } else {  // the tower's own patching
      pre.patch_size = cfg.patch_size;
      pre.merge_size = cfg.spatial_merge_size;
      pre.temporal_patch_size = cfg.temporal_patch_size;
    }
    name = args.model_dir;
    model_type = loaded->model_type;
    // Its tower's weights, if the directory holds them (a checkpoint of the
    // language model alone does not).
    if (auto opened = model::SafetensorsCheckpoint::Open(args.model_dir);
        opened.ok() && ((*opened)->Find("model.visual.patch_embed.proj.weight") != nullptr ||
                        (*opened)->Find("visual.patch_embed.proj.weight") != nullptr)) {
      ckpt = std::move(*opened);
    }
  }
  cpu::ThreadPool pool(cpu::ThreadPool::DefaultThreads());

  // Inputs first, so that the memory measured below is the tower's.
  const std::vector<int>& sizes = args.sizes;
  if (sizes.empty()) {
    std::fprintf(stderr, "--sizes takes image sizes in pixels, e.g. --sizes=448,1024\n");
    return 1;
  }
  std::vector<model::ImagePatches> inputs;
  std::vector<double> pre_ms;
  for (int size : sizes) {
    RgbImage img = TestImage(size);
    Stopwatch w;
    auto p = model::PreprocessImage(img, pre);
    pre_ms.push_back(w.ElapsedSeconds() * 1e3);
    if (!p.ok()) return 1;
    inputs.push_back(std::move(*p));
  }
  const double kernel_first = KernelGflops(args, cfg, pool, 512);
  const bench::IsaPeaks peaks = bench::MeasureIsaPeaks(pool, 2);

  malloc_trim(0);
  const int64_t rss0 = ProcStatusBytes("VmRSS:");
  model::VisionTowerOptions options;
  options.pool = &pool;
  options.bf16_activations = args.bf16_activations;
  Stopwatch create;
  std::unique_ptr<model::VisionTower> tower;
  if (ckpt != nullptr) {
    model::ModelConfig at_depth = *model_cfg;
    at_depth.vision = cfg;
    auto loaded = model::VisionTower::Load(*ckpt, at_depth, options);
    CHECK_OK(loaded.status());
    tower = std::move(*loaded);
  } else {
    tower = model::VisionTower::CreateRandom(cfg, 1, args.dtype, options);
  }
  const double create_s = create.ElapsedSeconds();
  const int64_t weights_rss = ProcStatusBytes("VmRSS:") - rss0;
  const double weight_bytes = static_cast<double>(tower->weight_bytes());

  std::printf("vision tower: isa %s, %s activations\n", cpu::IsaName(),
              args.bf16_activations ? "bf16" : "fp32");
  std::printf(
      "vision tower: %s (%s), depth %d, embed %d, heads %d, out %d, %s weights (%s, %.2f GB)\n",
      name.c_str(), model_type.c_str(), cfg.depth, cfg.embed_dim, cfg.num_heads, cfg.hidden_size,
      std::string(model::DTypeName(args.dtype)).c_str(),
      ckpt != nullptr ? "from the checkpoint" : "random", weight_bytes * 1e-9);
  std::printf(
      "baselines: the tower's linear kernel, 512 rows of its first MLP layer = %.1f GFLOP/s; "
      "peaks fma256 %.1f, fma512 %.1f, bf16dot %.1f GFLOP/s (%d threads); each again before "
      "each size, at its patch rows\n\n",
      kernel_first, peaks.fma256_gflops, peaks.fma512_gflops, peaks.bf16dot_gflops,
      pool.num_threads());
  std::printf("%6s %8s %7s %10s %10s %10s %8s %8s %7s %7s %7s %11s %11s %9s %8s\n", "input",
              "patches", "tokens", "preproc_ms", "tower_ms", "images/s", "linear%", "attn%",
              "norm%", "rope%", "elem%", "tower_GF/s", "kernel_GF/s", "vs_kernel", "vs_peak");
  std::vector<std::string> json_rows;
  std::vector<double> tower_s(sizes.size());
  int64_t activations_peak = 0;
  std::vector<bench::TorchVisionPeerResult> peers;
  std::vector<std::string> failures;
  for (size_t si = 0; si < sizes.size(); ++si) {
    int64_t activations = 0;
    json_rows.push_back(MeasureSize(args, pool, *tower, cfg, sizes[si], inputs[si], pre_ms[si],
                                    &tower_s[si], &activations, &failures));
    activations_peak = std::max(activations_peak, activations);
    if (!args.peer.empty() && (peers.empty() || peers.back().ran)) {
      peers.push_back(PeerOnGrid(args, pool.num_threads(), inputs[si].grid));
    }
  }
  const double peak = static_cast<double>(weights_rss + activations_peak);
  const double bf16_bytes = weight_bytes * (args.dtype == model::DType::kF32 ? 0.5 : 1.0);
  std::printf(
      "\ntower created in %.1f s; its RSS %.3f GB (weights %.3f GB + activations %.3f GB at "
      "the largest input) = %.3f x the bf16 weight bytes\n",
      create_s, peak * 1e-9, weights_rss * 1e-9, activations_peak * 1e-9, peak / bf16_bytes);
  const std::string peer_json = PeerReport(args, pool.num_threads(), sizes, tower_s, peers);
  const std::string row_ops_json = RowOpsReport(cfg);
  std::printf(
      "{\"bench\":\"vision\",\"dims\":\"%s\",\"model_type\":\"%s\",\"random_weights\":%s,"
      "\"dtype\":\"%s\",\"depth\":%d,"
      "\"threads\":%d,\"weight_bytes\":%.0f,\"tower_rss_bytes\":%.0f,"
      "\"rss_vs_bf16_weights\":%.3f,\"sizes\":[%s]%s%s}\n",
      name.c_str(), model_type.c_str(), ckpt != nullptr ? "false" : "true",
      std::string(model::DTypeName(args.dtype)).c_str(), cfg.depth, pool.num_threads(),
      weight_bytes, peak, peak / bf16_bytes, absl::StrJoin(json_rows, ",").c_str(),
      peer_json.c_str(), row_ops_json.c_str());
  std::fflush(stdout);
  for (const std::string& f : failures)
    std::fprintf(stderr, "vision_bench: FAILED: %s\n", f.c_str());
  return failures.empty() ? 0 : 1;
}

}  // namespace
}  // namespace mmserve

int main(int argc, char** argv) { return mmserve::Main(argc, argv); }
