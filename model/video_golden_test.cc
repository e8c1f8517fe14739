// Videos on the language side against transformers 4.57.6
// (tools/gen_video_lm_goldens.py): the vision tower on video pixel values
// (grid_t > 1: rotary positions per (h, w) repeated per temporal patch,
// attention inside each temporal patch), and placeholder expansion with
// M-RoPE positions for chats holding videos and images.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/file.h"
#include "model/model_config.h"
#include "model/mrope_positions.h"
#include "model/safetensors.h"
#include "model/vision_tower.h"

namespace mmserve::model {
namespace {

using json = nlohmann::json;
constexpr char kData[] = "model/testdata/";
constexpr const char* kModels[] = {"qwen2vl-tiny-mha-tied", "qwen2vl-tiny-gqa2-untied-sharded"};

json Golden() {
  auto text = ReadFileToString(std::string(kData) + "video_goldens/video_lm.json");
  REQUIRE(text.ok());
  return json::parse(*text);
}

std::vector<float> Floats(const SafetensorsFile& f, const std::string& name) {
  const TensorView* t = f.Find(name);
  INFO(name);
  REQUIRE(t != nullptr);
  REQUIRE(t->dtype == DType::kF32);
  std::vector<float> v(t->numel());
  std::memcpy(v.data(), t->data, t->nbytes);
  return v;
}

ImageGrid GridOf(const json& thw, MediaKind kind) {
  return ImageGrid::FromThw(thw[0], thw[1], thw[2], 2, kind);
}

TEST_CASE("vision tower matches transformers on two videos in one call", "[video]") {
  const json g = Golden();
  auto pixels_file =
      SafetensorsFile::Open(std::string(kData) + "video_goldens/video_pixels.safetensors");
  REQUIRE(pixels_file.ok());
  std::vector<float> pixels;
  std::vector<ImageGrid> grids;
  std::string key = "vision_out.";
  for (const json& v : g["videos"]) {
    const std::string name = v["name"];
    std::vector<float> p = Floats(**pixels_file, "pixel_values_videos." + name);
    pixels.insert(pixels.end(), p.begin(), p.end());
    grids.push_back(GridOf(v["grid_thw"], MediaKind::kVideo));
    key += (grids.size() > 1 ? "+" : "") + name;
  }
  REQUIRE(grids.size() == 2);
  CHECK(grids[0].grid_t == 2);
  CHECK(grids[1].grid_t == 3);  // 5 frames: the last repeated
  for (const char* name : kModels) {
    INFO(name);
    const std::string dir = std::string(kData) + "models/" + name;
    auto cfg = LoadModelConfig(dir);
    REQUIRE(cfg.ok());
    auto ckpt = SafetensorsCheckpoint::Open(dir);
    REQUIRE(ckpt.ok());
    auto tower = VisionTower::Load(**ckpt, *cfg);
    REQUIRE(tower.ok());
    auto out = (*tower)->Forward(pixels, grids);
    REQUIRE(out.ok());
    auto golden = SafetensorsFile::Open(std::string(kData) + "video_goldens/" + name +
                                        "/video_lm.safetensors");
    REQUIRE(golden.ok());
    const std::vector<float> want = Floats(**golden, key);
    REQUIRE(out->size() == want.size());
    float worst = 0;
    for (size_t i = 0; i < want.size(); ++i)
      worst = std::max(worst, std::fabs((*out)[i] - want[i]));
    CHECK(worst < 1e-4f);
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
  auto cfg = LoadModelConfig(std::string(kData) + "models/" + kModels[0]);
  REQUIRE(cfg.ok());
  const MediaPadIds pads{.image = cfg->tokens.image_pad, .video = cfg->tokens.video_pad};
  REQUIRE(pads.video >= 0);
  int chats = 0;
  for (const json& c : g["models"][kModels[0]]) {
    INFO(c["name"].get<std::string>());
    const std::vector<int32_t> ids = c["input_ids"];
    // Grids in order of appearance: the rendered text says which comes first.
    std::vector<ImageGrid> grids;
    size_t video = 0, image = 0;
    for (size_t i = 0; i < ids.size(); ++i) {
      if (!pads.IsPad(ids[i]) || (i > 0 && ids[i - 1] == ids[i])) continue;
      grids.push_back(ids[i] == pads.video
                          ? GridOf(c["video_grid_thw"][video++], MediaKind::kVideo)
                          : GridOf(c["image_grid_thw"][image++], MediaKind::kImage));
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
  CHECK(chats == 3);
}

}  // namespace
}  // namespace mmserve::model
