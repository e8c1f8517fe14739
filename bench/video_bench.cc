// video_bench: the video path's three costs, measured in one run.
//   1. Decode + sample + preprocess per clip (model::LoadVideo: FFmpeg decode
//      of every frame, Qwen2VLVideoProcessor-exact resize, normalize,
//      patchify) on the committed clips, at the video processor's default
//      pixel limits (128 to 768 merged tokens a frame); with --peer=transformers
//      the same work by transformers' processor reading with PyAV
//      (tools/transformers_video_bench.py, one thread) in the same run.
//   2. The vision tower (Qwen2-VL-2B vision dims, random bf16 weights,
//      --depth layers) per patch for a video grid (t, h, w) against an image
//      grid of the same patch count (1, t * h, w), and against t images of
//      (1, h, w) in one call (the same attention work); rounds alternated,
//      medians. video_vs_image_ratio = image per-patch time / video
//      per-patch time (target >= 0.9: a video patch costs what an image patch
//      costs).
//   3. Embedding transfer through the stack (router, encoder and language
//      processes on the demo model, shm profile): video requests one at a
//      time, the encoder's transfer bytes over its transfer seconds.
// A human table, then one JSON line.
//
//   bazel run -c opt //bench:video_bench -- [--reps=5] [--depth=4]
//       [--peer=transformers --python=<tools venv>/bin/python]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/clock.h"
#include "common/file.h"
#include "common/grpc_server.h"
#include "model/cpu/thread_pool.h"
#include "model/model_config.h"
#include "model/video_request.h"
#include "model/vision_tower.h"
#include "tests/stack_harness.h"

ABSL_FLAG(int, reps, 5, "repetitions of each measurement (medians)");
ABSL_FLAG(int, depth, 4,
          "vision tower layers (Qwen2-VL-2B has 32; per-patch ratios do not depend on it)");
ABSL_FLAG(std::string, peer, "", "\"transformers\": also time transformers' processor with PyAV");
ABSL_FLAG(std::string, python, "python3", "the Python of the tools venv (tools/README.md)");
ABSL_FLAG(int, stack_requests, 8, "video requests through the stack (0: skip the stack)");

namespace mmserve::testing {
namespace {

constexpr int64_t kMinPixels = 128 * 28 * 28;  // Qwen2VLVideoProcessor's defaults
constexpr int64_t kMaxPixels = 768 * 28 * 28;
const char* const kClips[] = {"h264_96x64_21f.mp4", "vp9_70x54_16f.mp4", "mpeg4_48x112_9f.avi"};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

std::string ClipPath(const std::string& name) {
  return RunfilesRoot() + "/model/testdata/video/clips/" + name;
}

struct ClipRow {
  std::string name;
  model::MediaGrid grid;
  double mmserve_ms = 0;
  double peer_ms = -1;  // not measured
};

// transformers' medians by clip name; empty with a reason when it cannot run.
std::map<std::string, double> PeerTimes(std::string* why) {
  const char* ws = std::getenv("BUILD_WORKSPACE_DIRECTORY");
  const std::string script =
      std::string(ws != nullptr ? ws : ".") + "/tools/transformers_video_bench.py";
  std::string cmd = absl::StrCat(absl::GetFlag(FLAGS_python), " ", script, " ",
                                 absl::GetFlag(FLAGS_reps), " ", kMinPixels, " ", kMaxPixels);
  for (const char* c : kClips) absl::StrAppend(&cmd, " ", ClipPath(c));
  absl::StrAppend(&cmd, " 2>&1");
  std::map<std::string, double> out;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) {
    *why = "popen failed";
    return out;
  }
  std::string text;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof(buf), p)) text.append(buf, n);
  pclose(p);
  for (const char* c : kClips) {
    const std::string key = absl::StrCat("\"", c, "\": ");
    const size_t at = text.rfind(key);
    double v = 0;
    if (at == std::string::npos ||
        !absl::SimpleAtod(
            text.substr(at + key.size(), text.find_first_of(",}", at) - at - key.size()), &v)) {
      *why = absl::StrCat("the script said: ", text.substr(0, 400));
      return {};
    }
    out[c] = v;
  }
  return out;
}

std::vector<ClipRow> MeasureClips() {
  model::PreprocessorConfig pre;
  pre.min_pixels = kMinPixels;
  pre.max_pixels = kMaxPixels;
  std::vector<ClipRow> rows;
  for (const char* c : kClips) {
    mmserve::v1::Video video;
    video.set_data(ReadFileToString(ClipPath(c)).value());
    ClipRow row{.name = c};
    std::vector<double> ms;
    for (int i = 0; i <= absl::GetFlag(FLAGS_reps); ++i) {  // the first is a warm-up
      Stopwatch w;
      auto p = model::LoadVideo(video, pre, model::VideoLimits(), model::DecodeLimits());
      if (i > 0) ms.push_back(w.ElapsedSeconds() * 1e3);
      if (!p.ok()) {
        std::fprintf(stderr, "%s: %s\n", c, std::string(p.status().message()).c_str());
        std::exit(1);
      }
      row.grid = p->grid;
    }
    row.mmserve_ms = Median(ms);
    rows.push_back(row);
  }
  return rows;
}

struct TowerFigures {
  model::MediaGrid video;
  double video_us_per_patch = 0, image_us_per_patch = 0, t_images_us_per_patch = 0;
  double ratio() const { return image_us_per_patch / video_us_per_patch; }
  double ratio_t_images() const { return t_images_us_per_patch / video_us_per_patch; }
};

// Microseconds per patch of one Forward over `grids`.
double PerPatchUs(const model::VisionTower& tower, const std::vector<model::MediaGrid>& grids,
                  const std::vector<float>& pixels) {
  int64_t patches = 0;
  for (const model::MediaGrid& g : grids) patches += g.num_patches();
  Stopwatch w;
  auto out = tower.Forward(absl::MakeConstSpan(pixels.data(), pixels.size()), grids);
  if (!out.ok()) {
    std::fprintf(stderr, "tower: %s\n", std::string(out.status().message()).c_str());
    std::exit(1);
  }
  return w.ElapsedSeconds() * 1e6 / static_cast<double>(patches);
}

TowerFigures MeasureTower() {
  model::VisionConfig cfg;  // Qwen2-VL-2B's vision tower
  cfg.depth = absl::GetFlag(FLAGS_depth);
  cfg.embed_dim = 1280;
  cfg.num_heads = 16;
  cfg.mlp_ratio = 4;
  cfg.hidden_size = 1536;
  model::cpu::ThreadPool pool(model::cpu::ThreadPool::DefaultThreads());
  model::VisionTowerOptions options;
  options.pool = &pool;
  auto tower = model::VisionTower::CreateRandom(cfg, 1, model::DType::kBF16, options);
  TowerFigures f;
  // 8 temporal patches of 16 x 22 (a 224 x 308 clip of 16 frames): 2816 patches.
  f.video = model::MediaGrid::FromThw(8, 16, 22, 2, model::MediaKind::kVideo);
  const model::MediaGrid image = model::MediaGrid::FromThw(1, 8 * 16, 22);
  const std::vector<model::MediaGrid> t_images(8, model::MediaGrid::FromThw(1, 16, 22));
  std::vector<float> pixels(static_cast<size_t>(f.video.num_patches()) * 3 * 2 * 14 * 14);
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1.8f, 2.1f);
  for (float& v : pixels) v = u(rng);
  PerPatchUs(*tower, {f.video}, pixels);  // warm-up
  std::vector<double> video, one, many;
  for (int i = 0; i < absl::GetFlag(FLAGS_reps); ++i) {
    video.push_back(PerPatchUs(*tower, {f.video}, pixels));
    one.push_back(PerPatchUs(*tower, {image}, pixels));
    many.push_back(PerPatchUs(*tower, t_images, pixels));
  }
  f.video_us_per_patch = Median(video);
  f.image_us_per_patch = Median(one);
  f.t_images_us_per_patch = Median(many);
  return f;
}

struct StackFigures {
  int requests = 0;
  double bytes = 0, seconds = 0;
  double bytes_per_s() const { return seconds > 0 ? bytes / seconds : 0; }
};

// Video requests one at a time (each sampled differently: no cache hits),
// 768 merged tokens a frame pair at most.
StackFigures MeasureStack() {
  StackFigures f;
  f.requests = absl::GetFlag(FLAGS_stack_requests);
  if (f.requests <= 0) return f;
  auto stack = launcher::LocalStack::Start(TestStackOptions(1, "shm"));
  if (!stack.ok()) {
    std::fprintf(stderr, "stack: %s\n", std::string(stack.status().message()).c_str());
    std::exit(1);
  }
  auto stub = mmserve::v1::Inference::NewStub(InternalChannel((*stack)->router_address()));
  const std::string clip = ReadFileToString(ClipPath(kClips[0])).value();
  for (int i = 0; i < f.requests; ++i) {
    mmserve::v1::GenerateRequest req;
    auto* msg = req.mutable_chat()->add_messages();
    msg->set_role("user");
    mmserve::v1::Video* v = msg->add_content()->mutable_video();
    v->set_data(clip);
    v->set_min_pixels(kMinPixels);
    v->set_max_pixels(kMaxPixels);
    v->set_fps(10.0 - 0.25 * i);  // a new cache key each time
    msg->add_content()->set_text("What happens?");
    req.mutable_sampling()->set_temperature(0);
    req.mutable_sampling()->set_max_tokens(1);
    const Answer a = AskGrpc(*stub, req, {});
    if (!a.status.ok()) {
      std::fprintf(stderr, "request %d: %s\n", i, std::string(a.status.message()).c_str());
      std::exit(1);
    }
  }
  const int port = (*stack)->encoder(0).metrics_port();
  f.bytes = ScrapeMetric(port, "mmserve_encoder_transfer_bytes_total");
  f.seconds = ScrapeMetric(port, "mmserve_encoder_transfer_seconds_sum");
  return f;
}

double LoadAverage() {
  double l[1] = {0};
  return getloadavg(l, 1) == 1 ? l[0] : -1;
}

int Main() {
  const bool peer = absl::GetFlag(FLAGS_peer) == "transformers";
  std::vector<ClipRow> clips = MeasureClips();
  std::string why = "not asked (--peer=transformers)";
  if (peer) {
    const std::map<std::string, double> t = PeerTimes(&why);
    for (ClipRow& r : clips) {
      if (t.count(r.name)) r.peer_ms = t.at(r.name);
    }
  }
  std::printf(
      "decode + sample + preprocess per clip (every frame, pixels %lld..%lld), median of %d\n",
      static_cast<long long>(kMinPixels), static_cast<long long>(kMaxPixels),
      absl::GetFlag(FLAGS_reps));
  if (clips[0].peer_ms < 0) std::printf("transformers not measured: %s\n", why.c_str());
  std::printf("%-22s %10s %11s %16s %8s\n", "clip", "grid_thw", "mmserve_ms", "transformers_ms",
              "speedup");
  std::vector<std::string> json_clips;
  for (const ClipRow& r : clips) {
    const std::string thw = absl::StrCat(r.grid.grid_t, "x", r.grid.grid_h, "x", r.grid.grid_w);
    std::printf("%-22s %10s %11.2f %16.2f %8.2f\n", r.name.c_str(), thw.c_str(), r.mmserve_ms,
                r.peer_ms, r.peer_ms > 0 ? r.peer_ms / r.mmserve_ms : 0);
    json_clips.push_back(absl::StrFormat(
        "{\"clip\":\"%s\",\"grid_thw\":\"%s\",\"mmserve_ms\":%.3f,\"transformers_ms\":%.3f}",
        r.name, thw, r.mmserve_ms, r.peer_ms));
  }
  const TowerFigures t = MeasureTower();
  std::printf(
      "\nvision tower (2B dims, depth %d, bf16), per patch: video %dx%dx%d %.2f us, one image of "
      "the same patch count %.2f us (ratio %.3f), %d images of %dx%d %.2f us (ratio %.3f)\n",
      absl::GetFlag(FLAGS_depth), t.video.grid_t, t.video.grid_h, t.video.grid_w,
      t.video_us_per_patch, t.image_us_per_patch, t.ratio(), t.video.grid_t, t.video.grid_h,
      t.video.grid_w, t.t_images_us_per_patch, t.ratio_t_images());
  const StackFigures s = MeasureStack();
  std::printf(
      "stack (demo model, shm): %d video requests, %.0f embedding bytes (%.0f a request) "
      "in %.4f s of transfer: %.1f MB/s\n",
      s.requests, s.bytes, s.bytes / std::max(1, s.requests), s.seconds, s.bytes_per_s() * 1e-6);
  const double load = LoadAverage();
  std::printf(
      "{\"bench\":\"video\",\"reps\":%d,\"clips\":[%s],\"tower_depth\":%d,"
      "\"video_us_per_patch\":%.3f,\"image_us_per_patch\":%.3f,\"video_vs_image_ratio\":%.3f,"
      "\"t_images_us_per_patch\":%.3f,\"video_vs_t_images_ratio\":%.3f,\"stack_requests\":%d,"
      "\"transfer_bytes\":%.0f,\"transfer_bytes_per_s\":%.0f,\"loadavg_1m\":%.2f}\n",
      absl::GetFlag(FLAGS_reps), absl::StrJoin(json_clips, ",").c_str(), absl::GetFlag(FLAGS_depth),
      t.video_us_per_patch, t.image_us_per_patch, t.ratio(), t.t_images_us_per_patch,
      t.ratio_t_images(), s.requests, s.bytes, s.bytes_per_s(), load);
  return t.ratio() > 0 ? 0 : 1;
}

}  // namespace
}  // namespace mmserve::testing

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return mmserve::testing::Main();
}
