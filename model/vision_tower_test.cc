// Vision tower parity with transformers 4.57.6 (model.visual in fp32) on two
// images in one forward, for every golden model: patch embedding, the first
// block's output and the merged embeddings. Videos
// (tools/gen_video_lm_goldens.py): the tower on video pixel values (grid_t >
// 1: rotary positions per (h, w) repeated per temporal patch, attention
// inside each temporal patch), and placeholder expansion with M-RoPE
// positions for chats holding videos and images.
#include "model/vision_tower.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "model/model_config.h"
#include "model/mrope_positions.h"
#include "model/qwen2_golden_testing.h"
#include "model/safetensors.h"

namespace mmserve::model {
namespace {

constexpr char kData[] = "model/testdata/";

float MaxAbsDiff(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  float worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::fabs(a[i] - b[i]));
  return worst;
}

// A golden model's tower with its weights as stored (the checkpoint it maps).
struct LoadedTower {
  LoadedModel model;  // config and checkpoint
  std::unique_ptr<VisionTower> tower;
};

LoadedTower LoadTower(const std::string& name) {
  LoadedTower t{OpenModelDir(std::string(kData) + "models/" + name), nullptr};
  auto tower = VisionTower::Load(*t.model.ckpt, t.model.cfg);
  INFO(tower.status().ToString());
  REQUIRE(tower.ok());
  t.tower = std::move(*tower);
  return t;
}

TEST_CASE("vision tower matches transformers on two images in one batch", "[vision]") {
  auto pixels_file =
      SafetensorsFile::Open(std::string(kData) + "goldens/image_processor.safetensors");
  REQUIRE(pixels_file.ok());
  std::vector<float> pixels = F32Tensor(**pixels_file, "pixel_values.square56");
  std::vector<float> second = F32Tensor(**pixels_file, "pixel_values.rect300x200");
  pixels.insert(pixels.end(), second.begin(), second.end());
  const std::vector<MediaGrid> grids = {MediaGrid::FromThw(1, 4, 4), MediaGrid::FromThw(1, 6, 8)};

  // qwen25vl-tiny: Qwen2.5-VL's tower (RMSNorm, gated MLP, windows of 2x2
  // merge groups with padded windows on both images, full attention in
  // blocks 1 and 3); its block0 golden is in patch order.
  for (const char* name :
       {"qwen2vl-tiny-mha-tied", "qwen2vl-tiny-gqa2-untied-sharded", "qwen2vl-tiny-mqa-bf16",
        "qwen2vl-tiny-gqa8-padvocab-nested", "qwen25vl-tiny"}) {
    INFO(name);
    const LoadedTower t = LoadTower(name);
    VisionTrace trace;
    auto out = t.tower->Forward(pixels, grids, &trace);
    REQUIRE(out.ok());
    CHECK(out->size() == (4u + 12u) * t.model.cfg.text.hidden_size);

    auto golden =
        SafetensorsFile::Open(std::string(kData) + "goldens/" + name + "/mm_golden.safetensors");
    REQUIRE(golden.ok());
    const std::string suffix = ".fp32.square56+rect300x200";
    // fp32 on both sides; only summation order differs.
    CHECK(MaxAbsDiff(trace.patch_embed, F32Tensor(**golden, "vision_patch_embed" + suffix)) <
          1e-4f);
    CHECK(MaxAbsDiff(trace.block0, F32Tensor(**golden, "vision_block0" + suffix)) < 1e-4f);
    CHECK(MaxAbsDiff(*out, F32Tensor(**golden, "vision_out" + suffix)) < 1e-4f);
  }
}

TEST_CASE("int8 vision tower matches transformers on the same dequantized weights", "[vision]") {
  auto pixels_file =
      SafetensorsFile::Open(std::string(kData) + "goldens/image_processor.safetensors");
  REQUIRE(pixels_file.ok());
  std::vector<float> pixels = F32Tensor(**pixels_file, "pixel_values.square56");
  std::vector<float> second = F32Tensor(**pixels_file, "pixel_values.rect300x200");
  pixels.insert(pixels.end(), second.begin(), second.end());
  const std::vector<MediaGrid> grids = {MediaGrid::FromThw(1, 4, 4), MediaGrid::FromThw(1, 6, 8)};
  for (const char* name : {"qwen2vl-tiny-mqa-bf16", "qwen2vl-tiny-gqa2-untied-sharded"}) {
    for (const char* scheme : {"int8", "int8_g32"}) {
      INFO(name << " " << scheme);
      const std::string dir = std::string(kData) + "models/" + name;
      auto cfg = LoadModelConfig(dir);
      REQUIRE(cfg.ok());
      auto ckpt = SafetensorsCheckpoint::Open(dir);
      REQUIRE(ckpt.ok());
      VisionTowerOptions options;
      auto group = VisionInt8Group(scheme);
      REQUIRE(group.ok());
      options.int8_group = *group;
      auto tower = VisionTower::Load(**ckpt, *cfg, options);
      INFO(tower.status().ToString());
      REQUIRE(tower.ok());
      auto plain = VisionTower::Load(**ckpt, *cfg);
      REQUIRE(plain.ok());
      // int8 panels (plus scales) against the bf16 or fp32 weights as stored.
      CHECK((*tower)->weight_bytes() < (*plain)->weight_bytes() / 1.5);
      auto out = (*tower)->Forward(pixels, grids);
      REQUIRE(out.ok());
      auto golden = SafetensorsFile::Open(std::string(kData) + "int8_goldens/" + name + "/vision_" +
                                          scheme + ".safetensors");
      REQUIRE(golden.ok());
      // The same dequantized weights on both sides (q * s). mmserve also
      // rounds each activation row to int16 (linear.h), a step 2^8 finer
      // than the weights' on the same products, so it moves the outputs by
      // about 2^-8 of what the weight rounding does: 0.03-0.05 here (the
      // goldens' metadata), so ~2e-4; the bound is 2.5x that (measured
      // 1.1e-4 to 1.4e-4).
      const std::vector<float> want = F32Tensor(**golden, std::string("vision_out.") + scheme);
      CHECK(MaxAbsDiff(*out, want) < 5e-4f);
      // int8 activations (one scale per 32 columns) round as coarsely as
      // the weights, so they move the outputs about as much again as the
      // weights' 0.03-0.05: the bound is 0.06 (measured 0.020-0.031).
      options.int8_activations = true;
      auto int8_tower = VisionTower::Load(**ckpt, *cfg, options);
      REQUIRE(int8_tower.ok());
      auto int8_out = (*int8_tower)->Forward(pixels, grids);
      REQUIRE(int8_out.ok());
      const float int8_diff = MaxAbsDiff(*int8_out, want);
      std::printf("int8 vision %s %s: int8 activations max|diff| %.3g\n", name, scheme, int8_diff);
      CHECK(int8_diff < 0.06f);
      CHECK(*int8_out != *out);  // the option reached the kernels
    }
  }
}

TEST_CASE("the --activation_dtype names and the pairs refused", "[vision]") {
  CHECK(*ParseActivationDtype("", "") == ActivationDtype::kF32);
  CHECK(*ParseActivationDtype("f32", "int8") == ActivationDtype::kF32);
  CHECK(*ParseActivationDtype("bf16", "none") == ActivationDtype::kBf16);
  CHECK(*ParseActivationDtype("int8", "int8") == ActivationDtype::kInt8);
  CHECK(*ParseActivationDtype("int8", "int8_g32") == ActivationDtype::kInt8);
  for (auto [dtype, quantize] : std::vector<std::pair<const char*, const char*>>{
           {"bf16", "int8"}, {"int8", ""}, {"int8", "none"}, {"INT8", "int8"}, {"fp8", ""}}) {
    INFO(dtype << " with --quantize=" << quantize);
    const absl::Status s = ParseActivationDtype(dtype, quantize).status();
    CHECK(s.code() == absl::StatusCode::kInvalidArgument);
    CHECK(s.message().find("--activation_dtype") != std::string::npos);
  }
}

TEST_CASE("the vision --quantize names", "[vision]") {
  CHECK(*VisionInt8Group("") == -1);
  CHECK(*VisionInt8Group("none") == -1);
  CHECK(*VisionInt8Group("int8") == 0);
  CHECK(*VisionInt8Group("int8_g32") == 32);
  for (const char* bad : {"int4", "INT8", "int8_g", "fp8"}) {
    INFO(bad);
    CHECK(VisionInt8Group(bad).status().code() == absl::StatusCode::kInvalidArgument);
  }
  // The language model's 4-bit schemes: refused with the reason.
  const absl::Status int4 = VisionInt8Group("int4_g32").status();
  CHECK(int4.code() == absl::StatusCode::kInvalidArgument);
  CHECK(int4.message().find("--quantize=int4_g32") != std::string::npos);
  CHECK(int4.message().find("language model") != std::string::npos);
}

// A random two-block tower small enough for quick batching tests.
VisionConfig SmallVisionConfig() {
  VisionConfig c;
  c.depth = 2;
  c.embed_dim = 64;
  c.num_heads = 4;
  c.mlp_ratio = 4;
  c.hidden_size = 32;
  return c;
}

TEST_CASE("images of different sizes in one call give each image its own embeddings", "[vision]") {
  // bf16 and int8 weights run on the panel kernel, whose rows do not depend
  // on the batch, so batched and one-at-a-time results are identical. The
  // first image (26 x 24 patches) spans several attention tiles and row
  // chunks.
  const int64_t group = GENERATE(-1, 0, 32);
  INFO("int8_group " << group);
  VisionTowerOptions options;
  options.int8_group = group;
  auto tower = VisionTower::CreateRandom(SmallVisionConfig(), 7, DType::kBF16, options);
  REQUIRE(tower->weight_bytes() > 0);
  const std::vector<MediaGrid> grids = {MediaGrid::FromThw(1, 26, 24), MediaGrid::FromThw(1, 4, 6),
                                        MediaGrid::FromThw(1, 2, 2)};
  const int patch_dim = 3 * 2 * 14 * 14;
  std::vector<std::vector<float>> pixels;
  std::vector<float> all;
  uint32_t s = 12345;
  for (const MediaGrid& g : grids) {
    std::vector<float> p(static_cast<size_t>(g.num_patches()) * patch_dim);
    for (float& v : p)
      v = static_cast<float>((s = s * 1664525u + 1013904223u) >> 8) / (1 << 24) - 0.5f;
    all.insert(all.end(), p.begin(), p.end());
    pixels.push_back(std::move(p));
  }
  auto batched = tower->Forward(all, grids);
  REQUIRE(batched.ok());
  size_t at = 0;
  for (size_t i = 0; i < grids.size(); ++i) {
    INFO("image " << i);
    const std::vector<MediaGrid> one = {grids[i]};
    auto alone = tower->Forward(pixels[i], one);
    REQUIRE(alone.ok());
    REQUIRE(at + alone->size() <= batched->size());
    CHECK(std::equal(alone->begin(), alone->end(), batched->begin() + at));
    at += alone->size();
  }
  CHECK(at == batched->size());
}

TEST_CASE("pixel counts that disagree with the grids are rejected", "[vision]") {
  const std::string dir = std::string(kData) + "models/qwen2vl-tiny-mha-tied";
  auto cfg = LoadModelConfig(dir);
  auto ckpt = SafetensorsCheckpoint::Open(dir);
  REQUIRE(ckpt.ok());
  auto tower = VisionTower::Load(**ckpt, *cfg);
  REQUIRE(tower.ok());
  std::vector<float> pixels(15 * 1176);
  const std::vector<MediaGrid> grids = {MediaGrid::FromThw(1, 4, 4)};
  CHECK((*tower)->Forward(pixels, grids).status().code() == absl::StatusCode::kInvalidArgument);
  const std::vector<MediaGrid> odd = {MediaGrid::FromThw(1, 3, 5)};
  std::vector<float> odd_pixels(15 * 1176);
  CHECK((*tower)->Forward(odd_pixels, odd).status().code() == absl::StatusCode::kInvalidArgument);
}

using json = nlohmann::json;
constexpr const char* kModels[] = {"qwen2vl-tiny-mha-tied", "qwen2vl-tiny-gqa2-untied-sharded",
                                   "qwen25vl-tiny"};

json Golden() { return ReadJsonFile(std::string(kData) + "video_goldens/video_lm.json"); }

MediaGrid GridOf(const json& thw, MediaKind kind) {
  return MediaGrid::FromThw(thw[0], thw[1], thw[2], 2, kind);
}

TEST_CASE("vision tower matches transformers on two videos in one call", "[video]") {
  const json g = Golden();
  auto pixels_file =
      SafetensorsFile::Open(std::string(kData) + "video_goldens/video_pixels.safetensors");
  REQUIRE(pixels_file.ok());
  std::vector<float> pixels;
  std::vector<MediaGrid> grids;
  std::string key = "vision_out.";
  for (const json& v : g["videos"]) {
    const std::string name = v["name"];
    std::vector<float> p = F32Tensor(**pixels_file, "pixel_values_videos." + name);
    pixels.insert(pixels.end(), p.begin(), p.end());
    grids.push_back(GridOf(v["grid_thw"], MediaKind::kVideo));
    key += (grids.size() > 1 ? "+" : "") + name;
  }
  REQUIRE(grids.size() == 2);
  CHECK(grids[0].grid_t == 2);
  CHECK(grids[1].grid_t == 3);  // 5 frames: the last repeated
  for (const char* name : kModels) {
    INFO(name);
    auto out = LoadTower(name).tower->Forward(pixels, grids);
    REQUIRE(out.ok());
    auto golden = SafetensorsFile::Open(std::string(kData) + "video_goldens/" + name +
                                        "/video_lm.safetensors");
    REQUIRE(golden.ok());
    CHECK(MaxAbsDiff(*out, F32Tensor(**golden, key)) < 1e-4f);
  }
}

// The chat's ids with each run of pads collapsed to one placeholder.
std::vector<int32_t> Collapse(const std::vector<int32_t>& ids, const MediaPadIds& pads) {
  std::vector<int32_t> out;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (pads.IsPad(ids[i]) && i > 0 && ids[i - 1] == ids[i]) continue;
    out.push_back(ids[i]);
  }
  return out;
}

TEST_CASE("video placeholders expand and get get_rope_index's positions", "[video]") {
  const json g = Golden();
  // Qwen2-VL's, and Qwen2.5-VL's with the time axis scaled by each chat's
  // fps (second_per_grid_ts and tokens_per_second).
  for (const char* name : {kModels[0], kModels[2]}) {
    INFO(name);
    auto cfg = LoadModelConfig(std::string(kData) + "models/" + name);
    REQUIRE(cfg.ok());
    const MediaPadIds pads{.image = cfg->tokens.image_pad, .video = cfg->tokens.video_pad};
    REQUIRE(pads.video >= 0);
    int chats = 0, scaled = 0;
    for (const json& c : g["models"][name]) {
      INFO(c["name"].get<std::string>());
      const std::vector<int32_t> ids = c["input_ids"];
      std::optional<double> fps;
      if (c.contains("fps") && !c["fps"].is_null()) fps = c["fps"].get<double>();
      const int time_step = cfg->VideoTimeStep(fps);
      scaled += time_step != 1;
      // Grids in order of appearance: the rendered text says which comes first.
      std::vector<MediaGrid> grids;
      size_t video = 0, image = 0;
      for (size_t i = 0; i < ids.size(); ++i) {
        if (!pads.IsPad(ids[i]) || (i > 0 && ids[i - 1] == ids[i])) continue;
        grids.push_back(ids[i] == pads.video
                            ? GridOf(c["video_grid_thw"][video++], MediaKind::kVideo)
                            : GridOf(c["image_grid_thw"][image++], MediaKind::kImage));
        if (ids[i] == pads.video) grids.back().time_step = time_step;
      }
      auto expanded = ExpandImagePlaceholders(Collapse(ids, pads), pads, grids);
      REQUIRE(expanded.ok());
      CHECK(*expanded == ids);
      auto p = ComputeMropePositions(ids, pads, grids, 2);
      REQUIRE(p.ok());
      CHECK(p->t == c["position_ids"][0].get<std::vector<int32_t>>());
      CHECK(p->h == c["position_ids"][1].get<std::vector<int32_t>>());
      CHECK(p->w == c["position_ids"][2].get<std::vector<int32_t>>());
      CHECK(p->delta == c["rope_delta"].get<int32_t>());
      ++chats;
    }
    if (name == kModels[0]) {
      CHECK(chats == 3);
      CHECK(scaled == 0);
    } else {
      // tokens_per_second 2: 2 at the default 2 fps, 4 at 1 fps, 0 at 4 fps.
      CHECK(chats == 5);
      CHECK(scaled == 5);
      CHECK(cfg->VideoTimeStep(std::nullopt) == 2);
      CHECK(cfg->VideoTimeStep(1.0) == 4);
      CHECK(cfg->VideoTimeStep(4.0) == 0);
    }
  }
}

TEST_CASE("a video's temporal patches run in pieces give the whole's rows", "[vision]") {
  // The encoder splits a video over the patch budget across tower batches
  // by whole temporal patches: attention stays within a temporal patch, so
  // the pieces must give exactly the rows of one call (bf16 panel kernel:
  // rows do not depend on the batch).
  auto tower =
      VisionTower::CreateRandom(SmallVisionConfig(), 11, DType::kBF16, VisionTowerOptions());
  const MediaGrid whole = MediaGrid::FromThw(3, 4, 6);
  const size_t per_t = 4 * 6 * 3 * 2 * 14 * 14;
  std::vector<float> pixels(3 * per_t);
  uint32_t s = 777;
  for (float& v : pixels) v = static_cast<float>((s = s * 1664525u + 1013904223u) >> 8) / (1 << 24);
  auto all = tower->Forward(pixels, std::vector<MediaGrid>{whole});
  REQUIRE(all.ok());
  const std::vector<float> first(pixels.begin(), pixels.begin() + per_t);
  const std::vector<float> rest(pixels.begin() + per_t, pixels.end());
  auto a = tower->Forward(first, std::vector<MediaGrid>{MediaGrid::FromThw(1, 4, 6)});
  auto b = tower->Forward(rest, std::vector<MediaGrid>{MediaGrid::FromThw(2, 4, 6)});
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  std::vector<float> joined = *a;
  joined.insert(joined.end(), b->begin(), b->end());
  CHECK(joined == *all);
}

}  // namespace
}  // namespace mmserve::model
