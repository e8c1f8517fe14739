// Vision path throughput at Qwen2-VL-2B vision dimensions (random weights):
// preprocessing (smart resize, bicubic, normalize, patchify) and the vision
// tower, for 448x448 and 1024x1024 inputs, with the share of tower time spent
// in GEMM. Baseline, measured in the same run: OpenBLAS sgemm GFLOP/s on a
// tower-sized matmul, so the tower's FLOP rate is reported as a fraction of it.
//
//   bazel run --config=opt //bench:vision_bench -- [--depth=32] [--iters=1]
#include <cblas.h>

#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/clock.h"
#include "model/image_preprocess.h"
#include "model/vision_tower.h"

namespace mmserve {
namespace {

using model::ImageGrid;
using model::RgbImage;

struct Args {
  int depth = 32;
  int iters = 1;
};

Args ParseArgs(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string s = argv[i];
    if (s.rfind("--depth=", 0) == 0) (void)absl::SimpleAtoi(s.substr(8), &a.depth);
    if (s.rfind("--iters=", 0) == 0) (void)absl::SimpleAtoi(s.substr(8), &a.iters);
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

// FLOPs of one tower forward over n patches of one image.
double TowerFlops(const model::VisionConfig& c, double n) {
  const double e = c.embed_dim, mlp = e * c.mlp_ratio, patch = 3.0 * 2 * 14 * 14;
  const double merged = e * 4, tokens = n / 4;
  const double block = 2 * n * e * 3 * e + 2 * n * e * e + 2 * 2 * n * e * mlp + 2 * 2 * n * n * e;
  return 2 * n * patch * e + c.depth * block + 2 * tokens * merged * merged +
         2 * tokens * merged * c.hidden_size;
}

double SgemmGflops() {
  const int m = 1024, n = 1280, k = 5120;
  std::vector<float> a(static_cast<size_t>(m) * k, 0.5f), b(static_cast<size_t>(n) * k, 0.25f),
      c(static_cast<size_t>(m) * n);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1, a.data(), k, b.data(), k, 0,
              c.data(), n);  // warm-up
  Stopwatch w;
  const int reps = 3;
  for (int r = 0; r < reps; ++r) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1, a.data(), k, b.data(), k, 0,
                c.data(), n);
  }
  return 2.0 * m * n * k * reps / w.ElapsedSeconds() * 1e-9;
}

int Main(int argc, char** argv) {
  const Args args = ParseArgs(argc, argv);
  model::VisionConfig cfg;  // Qwen2-VL-2B vision tower
  cfg.depth = args.depth;
  cfg.embed_dim = 1280;
  cfg.num_heads = 16;
  cfg.mlp_ratio = 4;
  cfg.hidden_size = 1536;
  auto tower = model::VisionTower::CreateRandom(cfg, 1);
  model::PreprocessorConfig pre;  // defaults: min 56*56, max 28*28*1280 pixels

  const double sgemm = SgemmGflops();
  std::printf("vision tower: depth %d, embed %d, heads %d, out %d (random weights), fp32\n",
              cfg.depth, cfg.embed_dim, cfg.num_heads, cfg.hidden_size);
  std::printf("baseline: OpenBLAS sgemm 1024x1280x5120 = %.1f GFLOP/s\n\n", sgemm);
  std::printf("%8s %8s %7s %12s %10s %10s %9s %10s\n", "input", "patches", "tokens", "preproc_ms",
              "tower_ms", "images/s", "gemm_%", "of_sgemm");
  std::vector<std::string> json_rows;
  for (int size : {448, 1024}) {
    RgbImage img = TestImage(size);
    double pre_s = 0, tower_s = 0, gemm_s = 0;
    int64_t patches = 0, tokens = 0;
    for (int it = 0; it < args.iters; ++it) {
      Stopwatch w;
      auto p = model::PreprocessImage(img, pre);
      pre_s += w.ElapsedSeconds();
      if (!p.ok()) return 1;
      model::VisionTrace trace;
      std::vector<ImageGrid> grids = {p->grid};
      auto out = tower->Forward(p->values, grids, &trace);
      if (!out.ok()) return 1;
      tower_s += trace.total_seconds;
      gemm_s += trace.gemm_seconds;
      patches = p->grid.num_patches();
      tokens = p->grid.num_tokens();
    }
    pre_s /= args.iters;
    tower_s /= args.iters;
    gemm_s /= args.iters;
    const double gflops = TowerFlops(cfg, patches) / tower_s * 1e-9;
    const double ips = 1.0 / (pre_s + tower_s);
    std::printf("%8d %8lld %7lld %12.1f %10.1f %10.3f %8.1f%% %10.2f\n", size,
                static_cast<long long>(patches), static_cast<long long>(tokens), pre_s * 1e3,
                tower_s * 1e3, ips, 100 * gemm_s / tower_s, gflops / sgemm);
    json_rows.push_back(absl::StrFormat(
        "{\"size\":%d,\"patches\":%d,\"tokens\":%d,\"preprocess_ms\":%.1f,\"tower_ms\":%.1f,"
        "\"images_per_s\":%.4f,\"gemm_share\":%.3f,\"tower_gflops\":%.1f,\"ratio_to_sgemm\":%.3f}",
        size, patches, tokens, pre_s * 1e3, tower_s * 1e3, ips, gemm_s / tower_s, gflops,
        gflops / sgemm));
  }
  std::printf(
      "\n{\"bench\":\"vision\",\"dims\":\"qwen2-vl-2b\",\"depth\":%d,\"sgemm_gflops\":%.1f,"
      "\"sizes\":[%s]}\n",
      cfg.depth, sgemm, absl::StrJoin(json_rows, ",").c_str());
  return 0;
}

}  // namespace
}  // namespace mmserve

int main(int argc, char** argv) { return mmserve::Main(argc, argv); }
