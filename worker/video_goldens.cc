#include "worker/video_goldens.h"

#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>

#include "absl/strings/str_cat.h"
#include "common/file.h"
#include "common/status_macros.h"
#include "model/model_config.h"
#include "model/mrope_positions.h"
#include "model/safetensors.h"
#include "model/vision_tower.h"

namespace mmserve::worker {
namespace {

using nlohmann::json;
constexpr char kData[] = "model/testdata/";

absl::StatusOr<std::vector<float>> Floats(const model::SafetensorsFile& f,
                                          const std::string& name) {
  const model::TensorView* t = f.Find(name);
  if (t == nullptr || t->dtype != model::DType::kF32) {
    return absl::NotFoundError(absl::StrCat("no fp32 tensor ", name));
  }
  std::vector<float> v(t->numel());
  std::memcpy(v.data(), t->data, t->nbytes);
  return v;
}

// The items of a chat in order of appearance (from its expanded ids), with
// their pixel values; rows not yet computed.
absl::StatusOr<std::vector<std::pair<VideoGoldenItem, std::vector<float>>>> ItemsOf(
    const json& c, const model::ModelConfig& config, const model::SafetensorsFile& video_pixels,
    const model::SafetensorsFile& image_pixels) {
  const model::MediaPadIds pads{.image = config.tokens.image_pad, .video = config.tokens.video_pad};
  // Qwen2.5-VL's chats name the processor's fps (null: its default).
  std::optional<double> fps;
  if (c.contains("fps") && !c["fps"].is_null()) fps = c["fps"].get<double>();
  std::vector<std::pair<VideoGoldenItem, std::vector<float>>> out;
  const std::vector<int32_t> ids = c["input_ids"];
  size_t video = 0, image = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (!pads.IsPad(ids[i]) || (i > 0 && ids[i - 1] == ids[i])) continue;
    const bool is_video = ids[i] == pads.video;
    const json& thw = is_video ? c["video_grid_thw"][video] : c["image_grid_thw"][image];
    VideoGoldenItem item;
    item.name = is_video ? c["videos"][video++] : c["images"][image++];
    item.grid = model::MediaGrid::FromThw(
        thw[0], thw[1], thw[2], 2, is_video ? model::MediaKind::kVideo : model::MediaKind::kImage);
    if (is_video) item.grid.time_step = config.VideoTimeStep(fps);
    item.key = HashBytes(absl::StrCat(is_video ? "video:" : "image:", item.name));
    ASSIGN_OR_RETURN(std::vector<float> pixels,
                     is_video ? Floats(video_pixels, "pixel_values_videos." + item.name)
                              : Floats(image_pixels, "pixel_values." + item.name));
    out.emplace_back(std::move(item), std::move(pixels));
  }
  return out;
}

}  // namespace

EngineRequest VideoChat::Request(const std::string& id, int max_tokens) const {
  EngineRequest r;
  r.id = id;
  r.prompt = rendered;
  for (const VideoGoldenItem& item : items) {
    r.image_embeddings.push_back({.grid = item.grid, .values = item.rows, .key = item.key});
  }
  const int n = max_tokens >= 0 ? max_tokens : static_cast<int>(greedy_ids.size());
  r.sampling.temperature = 0;
  r.sampling.max_tokens = n;
  r.sampling.min_tokens = n;  // the goldens mask EOS for all n tokens
  return r;
}

absl::StatusOr<VideoGoldens> VideoGoldens::Load(const std::string& model) {
  ASSIGN_OR_RETURN(std::string text,
                   ReadFileToString(std::string(kData) + "video_goldens/video_lm.json"));
  const json g = json::parse(text);
  if (!g["models"].contains(model)) return absl::NotFoundError("no video goldens for " + model);
  const std::string dir = std::string(kData) + "models/" + model;
  ASSIGN_OR_RETURN(model::ModelConfig config, model::LoadModelConfig(dir));
  ASSIGN_OR_RETURN(auto checkpoint, model::SafetensorsCheckpoint::Open(dir));
  ASSIGN_OR_RETURN(auto tower, model::VisionTower::Load(*checkpoint, config));
  ASSIGN_OR_RETURN(
      auto video_pixels,
      model::SafetensorsFile::Open(std::string(kData) + "video_goldens/video_pixels.safetensors"));
  ASSIGN_OR_RETURN(
      auto image_pixels,
      model::SafetensorsFile::Open(std::string(kData) + "goldens/image_processor.safetensors"));
  VideoGoldens out;
  for (const json& c : g["models"][model]) {
    VideoChat chat;
    chat.name = c["name"];
    chat.rendered = c["rendered"];
    chat.input_ids = c["input_ids"].get<std::vector<int32_t>>();
    chat.greedy_ids = c["greedy_ids"].get<std::vector<int32_t>>();
    chat.rope_delta = c["rope_delta"];
    ASSIGN_OR_RETURN(auto items, ItemsOf(c, config, *video_pixels, *image_pixels));
    for (auto& [item, pixels] : items) {
      const std::vector<model::MediaGrid> one = {item.grid};
      ASSIGN_OR_RETURN(item.rows, tower->Forward(pixels, one));
      chat.items.push_back(std::move(item));
    }
    out.chats.push_back(std::move(chat));
  }
  return out;
}

}  // namespace mmserve::worker
