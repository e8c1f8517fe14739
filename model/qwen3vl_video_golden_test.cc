// Qwen3-VL videos against transformers 4.57.6 on qwen3vl-tiny and
// qwen3vlmoe-tiny (tools/gen_qwen3vl_video_goldens.py): Qwen3VLVideoProcessor's
// sampled frame indices, per-temporal-patch timestamps, grid and pixel values
// (to 1e-4) of a 21-frame 10 fps clip whose pixels are a formula;
// Qwen3VLProcessor's prompt with "<t seconds>" before each temporal patch;
// the M-RoPE positions of get_rope_index; and 16 greedy tokens for a video
// chat and an image-then-video chat, the pixels all preprocessed here. The
// MoE checkpoint has no video processor of its own (the services refuse its
// videos); its goldens carry the one they were made with.
#include <catch2/catch.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "common/file.h"
#include "model/cpu/thread_pool.h"
#include "model/forward_batch.h"
#include "model/image_decode.h"
#include "model/image_preprocess.h"
#include "model/model_config.h"
#include "model/mrope_positions.h"
#include "model/qwen2_golden_testing.h"
#include "model/qwen2_model.h"
#include "model/qwen2_test_runner.h"
#include "model/qwen3vl_video.h"
#include "model/safetensors.h"
#include "model/tokenizer.h"
#include "model/vision_tower.h"

namespace mmserve::model {
namespace {

constexpr char kDense[] = "qwen3vl-tiny";
constexpr char kMoe[] = "qwen3vlmoe-tiny";

std::string ModelDir(const std::string& model) { return "model/testdata/models/" + model; }
std::string Goldens(const std::string& model) { return "model/testdata/goldens/" + model + "/"; }

// The video processor the goldens of `model` were made with: the
// checkpoint's, or for the MoE the one beside its goldens.
Qwen3VideoConfig VideoConfigFor(const std::string& model) {
  if (model != kMoe) {
    auto cfg = LoadQwen3VideoConfig(ModelDir(model));
    INFO(cfg.status().ToString());
    REQUIRE(cfg.ok());
    return *cfg;
  }
  REQUIRE(!LoadQwen3VideoConfig(ModelDir(model)).ok());
  ModelConfig config = LoadModelConfig(ModelDir(model)).value();
  const std::string path = Goldens(model) + "video_preprocessor_config.json";
  auto video = ParseQwen3VideoSettings(ReadFileToString(path).value(), path, *config.preprocessor);
  INFO(video.status().ToString());
  REQUIRE(video.ok());
  REQUIRE(video->has_value());
  config.preprocessor->qwen3_video = **video;
  return Qwen3VideoConfigOf(*config.preprocessor);
}

// Frame t of the clip, as the generator writes it.
RgbImage ClipFrame(const nlohmann::json& clip, int64_t t) {
  RgbImage f;
  f.width = clip["width"];
  f.height = clip["height"];
  f.pixels.resize(static_cast<size_t>(f.width) * f.height * 3);
  for (int64_t y = 0; y < f.height; ++y) {
    for (int64_t x = 0; x < f.width; ++x) {
      for (int64_t c = 0; c < 3; ++c) {
        const int64_t v = 3 * (c + 1) * x + 2 * (3 - c) * y + 11 * t + 60 * (((x + 2 * t) / 5) % 2);
        f.pixels[(y * f.width + x) * 3 + c] = static_cast<uint8_t>(v % 256);
      }
    }
  }
  return f;
}

struct Video {
  std::vector<int64_t> indices;
  std::vector<double> timestamps;
  ImagePatches patches;
};

Video SampleAndPreprocess(const nlohmann::json& g, const Qwen3VideoConfig& cfg) {
  Video v;
  auto idx = Qwen3SampleFrameIndices(g["total_num_frames"], g["video_fps"], {}, cfg);
  REQUIRE(idx.ok());
  v.indices = *idx;
  v.timestamps = Qwen3FrameTimestamps(v.indices, g["video_fps"], cfg.base.merge_size);
  std::vector<RgbImage> frames;
  for (int64_t i : v.indices) frames.push_back(ClipFrame(g["clip"], i));
  auto p = Qwen3PreprocessVideo(frames, cfg);
  INFO(p.status().ToString());
  REQUIRE(p.ok());
  v.patches = *std::move(p);
  return v;
}

TEST_CASE(
    "Qwen3-VL and Qwen3-VL-MoE video: sampling, timestamps, grid and pixels match the processor",
    "[qwen3vl]") {
  const std::string model = GENERATE(as<std::string>(), kDense, kMoe);
  INFO(model);
  const nlohmann::json g = ReadJsonFile(Goldens(model) + "video_golden.json");
  const Qwen3VideoConfig cfg = VideoConfigFor(model);
  CHECK(cfg.fps == 2.0);
  CHECK(cfg.base.max_pixels == 16384);
  const Video v = SampleAndPreprocess(g, cfg);
  CHECK(v.indices == g["indices"].get<std::vector<int64_t>>());
  CHECK(v.timestamps == g["timestamps"].get<std::vector<double>>());
  const std::vector<int> thw = g["video_grid_thw"];
  CHECK(v.patches.grid.grid_t == thw[0]);
  CHECK(v.patches.grid.grid_h == thw[1]);
  CHECK(v.patches.grid.grid_w == thw[2]);
  auto f = SafetensorsFile::Open(Goldens(model) + "video_golden.safetensors");
  REQUIRE(f.ok());
  const std::vector<float> want = F32Tensor(**f, "pixel_values_videos");
  REQUIRE(v.patches.values.size() == want.size());
  CHECK(MaxAbsDiff(v.patches.values, want.data()) < 1e-4f);
}

TEST_CASE("Qwen3-VL video: sampling and resize follow the processor's rules", "[qwen3vl]") {
  Qwen3VideoConfig cfg;
  cfg.base.patch_size = 16;
  // int(30 / 30 * 2) = 2 frames, raised to min_frames 4: linspace(0, 29, 4)
  // = 0, 9.67, 19.33, 29.
  CHECK(*Qwen3SampleFrameIndices(30, 30.0, {}, cfg) == std::vector<int64_t>{0, 10, 19, 29});
  // Fewer frames than min_frames: all of them.
  CHECK(*Qwen3SampleFrameIndices(3, 30.0, {}, cfg) == std::vector<int64_t>{0, 1, 2});
  // num_frames is taken as is; linspace(0, 4, 3) = 0, 2, 4; 0.5 steps round
  // half to even: linspace(0, 3, 3) = 0, 1.5, 3 -> 0, 2, 3.
  CHECK(*Qwen3SampleFrameIndices(5, 30.0, {.num_frames = 3}, cfg) == std::vector<int64_t>{0, 2, 4});
  CHECK(*Qwen3SampleFrameIndices(4, 30.0, {.num_frames = 3}, cfg) == std::vector<int64_t>{0, 2, 3});
  CHECK(Qwen3SampleFrameIndices(30, 30.0, {.fps = 1.0, .num_frames = 3}, cfg).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(Qwen3SampleFrameIndices(0, 30.0, {}, cfg).status().code() ==
        absl::StatusCode::kInvalidArgument);
  // The budget covers every frame: 8 frames of 64 x 64 in 16384 pixels
  // shrink to 32 x 32 (beta = sqrt(8 * 4096 / 16384)).
  cfg.base.min_pixels = 1024;
  cfg.base.max_pixels = 16384;
  auto g = Qwen3VideoGrid(8, 64, 64, cfg);
  REQUIRE(g.ok());
  CHECK(g->grid_t == 4);
  CHECK(g->resized_width == 32);
  CHECK(g->resized_height == 32);
  CHECK(Qwen3VideoGrid(1, 64, 64, cfg).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(Qwen3VideoGrid(4, 31, 64, cfg).status().code() == absl::StatusCode::kInvalidArgument);
  // Timestamps: pairs averaged, the last index repeated to fill a pair.
  CHECK(Qwen3FrameTimestamps(std::vector<int64_t>{0, 5, 10}, 10.0, 2) ==
        std::vector<double>{0.25, 1.0});
}

TEST_CASE("Qwen3-VL video prompt: one timestamp per temporal patch, placeholders counted",
          "[qwen3vl]") {
  const std::vector<Qwen3VideoPrompt> one = {{{0.25, 1.65}, 2}};
  auto p = ExpandQwen3VideoPrompt("a<|vision_start|><|video_pad|><|vision_end|>b", one);
  REQUIRE(p.ok());
  // "%.1f" of the binary values, as Python's format: 0.25 -> 0.2, 1.65 -> 1.6.
  CHECK(*p ==
        "a<0.2 seconds><|vision_start|><|video_pad|><|video_pad|><|vision_end|>"
        "<1.6 seconds><|vision_start|><|video_pad|><|video_pad|><|vision_end|>b");
  // A bare pad (no vision_start / vision_end around it) is replaced alone.
  CHECK(*ExpandQwen3VideoPrompt("<|video_pad|>", {{{3.0}, 1}}) ==
        "<3.0 seconds><|vision_start|><|video_pad|><|vision_end|>");
  CHECK(ExpandQwen3VideoPrompt("no video", one).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(ExpandQwen3VideoPrompt("<|video_pad|><|video_pad|>", one).status().code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE(
    "Qwen3-VL and Qwen3-VL-MoE video chats: ids, positions and greedy tokens match transformers",
    "[qwen3vl]") {
  const std::string name = GENERATE(as<std::string>(), kDense, kMoe);
  INFO(name);
  const nlohmann::json g = ReadJsonFile(Goldens(name) + "video_golden.json");
  const LoadedModel m = LoadTestModel(name);
  const Video video = SampleAndPreprocess(g, VideoConfigFor(name));
  auto tok = Tokenizer::FromFile(ModelDir(name) + "/tokenizer.json");
  REQUIRE(tok.ok());
  auto tower = VisionTower::Load(*m.ckpt, m.cfg);
  REQUIRE(tower.ok());
  cpu::ThreadPool pool(2);
  Qwen2Model model(m.cfg.text, *m.weights, pool);
  const int64_t hidden = m.cfg.text.hidden_size;
  const int levels = m.cfg.DeepstackLevels();
  const MediaPadIds pads{.image = m.cfg.tokens.image_pad, .video = m.cfg.tokens.video_pad};
  const std::vector<int> masked = {m.cfg.tokens.eos.at(0), m.cfg.tokens.bos};
  REQUIRE(g["chats"].size() == 2);
  for (const auto& chat : g["chats"]) {
    INFO(chat["name"].get<std::string>());
    // Images and the video in prompt order, each preprocessed here.
    std::vector<ImagePatches> media;
    for (const auto& name : chat["images"]) {
      auto bytes =
          ReadFileToString("model/testdata/goldens/images/" + name.get<std::string>() + ".png");
      REQUIRE(bytes.ok());
      media.push_back(
          PreprocessImage(*DecodeImage(*bytes, DecodeLimits()), *m.cfg.preprocessor).value());
    }
    media.push_back(video.patches);
    // The prompt as the engine builds it: one pad per temporal patch,
    // expanded after tokenizing.
    auto text = ExpandQwen3VideoPrompt(chat["rendered"], {{video.timestamps, 1}});
    REQUIRE(text.ok());
    auto collapsed = (*tok)->Encode(*text);
    REQUIRE(collapsed.ok());
    std::vector<MediaGrid> grids;
    for (const ImagePatches& p : media) grids.push_back(p.grid);
    const std::vector<MediaGrid> split = SplitVideoFrames(grids);
    auto ids = ExpandImagePlaceholders(*collapsed, pads, split);
    REQUIRE(ids.ok());
    CHECK(*ids == chat["input_ids"].get<std::vector<int32_t>>());
    auto pos = ComputeMropePositions(*ids, pads, split, m.cfg.vision->spatial_merge_size);
    REQUIRE(pos.ok());
    CHECK(pos->t == chat["position_ids"][0].get<std::vector<int32_t>>());
    CHECK(pos->h == chat["position_ids"][1].get<std::vector<int32_t>>());
    CHECK(pos->w == chat["position_ids"][2].get<std::vector<int32_t>>());
    CHECK(pos->delta == chat["rope_delta"].get<int32_t>());

    // The tower's rows (main embedding, then the DeepStack features) on the
    // media's pads in order, then greedy decoding.
    std::vector<float> rows;
    for (const ImagePatches& p : media) {
      auto all = (*tower)->ForwardAll(p.values, std::vector<MediaGrid>{p.grid});
      REQUIRE(all.ok());
      const std::vector<float> r = TokenRows(*std::move(all), hidden);
      rows.insert(rows.end(), r.begin(), r.end());
    }
    const int64_t width = hidden * (1 + levels);
    std::vector<EmbeddingOverride> overrides;
    for (size_t i = 0; i < ids->size(); ++i) {
      if (!pads.IsPad((*ids)[i])) continue;
      const float* row = &rows[overrides.size() * width];
      overrides.push_back({static_cast<int64_t>(i), row, row + hidden, levels});
    }
    REQUIRE(static_cast<int64_t>(overrides.size()) * width == static_cast<int64_t>(rows.size()));
    std::vector<int64_t> positions;
    for (const auto* axis : {&pos->t, &pos->h, &pos->w})
      positions.insert(positions.end(), axis->begin(), axis->end());
    GoldenSequence seq(model, static_cast<int64_t>(ids->size()) + 32);
    std::vector<float> logits = seq.Step(*ids, positions, overrides);
    std::vector<int32_t> greedy;
    int64_t next = static_cast<int64_t>(ids->size()) + pos->delta;
    for (size_t step = 0; step < chat["greedy_ids"].size(); ++step) {
      greedy.push_back(GreedyToken(logits, masked));
      logits = seq.Step({greedy.back()}, {next, next, next});
      ++next;
    }
    CHECK(greedy == chat["greedy_ids"].get<std::vector<int32_t>>());
  }
}

}  // namespace
}  // namespace mmserve::model
