// Qwen3-VL at the model level against transformers 4.57.6 on a tiny random
// checkpoint (tools/gen_qwen3vl_goldens.py): the vision tower's main
// embedding and DeepStack features on two images of different sizes in one
// call, the chats' M-RoPE positions (Qwen3VLModel.get_rope_index), and the
// chats' last logits and 16 greedy tokens with the image (or video)
// embeddings and their DeepStack features fed to the decoder (interleaved
// M-RoPE), a text chat's and an image-then-video chat's. The videos show
// each temporal patch after its timestamp, as Qwen3VLProcessor writes the
// prompt.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "model/cpu/thread_pool.h"
#include "model/forward_batch.h"
#include "model/kv_cache.h"
#include "model/mrope_positions.h"
#include "model/qwen2_golden_testing.h"
#include "model/qwen2_model.h"
#include "model/qwen2_test_runner.h"
#include "model/safetensors.h"
#include "model/vision_tower.h"

namespace mmserve::model {
namespace {

constexpr char kModel[] = "model/testdata/models/qwen3vl-tiny";
constexpr char kGoldens[] = "model/testdata/goldens/qwen3vl-tiny/";
constexpr char kBatch[] = "fp32.square56+rect300x200";

std::vector<MediaGrid> Grids(const nlohmann::json& thw, MediaKind kind = MediaKind::kImage) {
  std::vector<MediaGrid> grids;
  for (const auto& g : thw) grids.push_back(MediaGrid::FromThw(g[0], g[1], g[2], 2, kind));
  return grids;
}

// A chat's images, then its video (the golden chats put images first).
std::vector<MediaGrid> ChatGrids(const nlohmann::json& chat) {
  std::vector<MediaGrid> grids = Grids(chat["image_grid_thw"]);
  if (chat.contains("video_grid_thw")) {
    for (const MediaGrid& g : Grids(chat["video_grid_thw"], MediaKind::kVideo)) grids.push_back(g);
  }
  return grids;
}

struct Goldens {
  nlohmann::json json = ReadJsonFile(std::string(kGoldens) + "mm_golden.json");
  std::unique_ptr<SafetensorsFile> tensors;
  Goldens() {
    auto f = SafetensorsFile::Open(std::string(kGoldens) + "mm_golden.safetensors");
    REQUIRE(f.ok());
    tensors = std::move(*f);
  }
};

std::unique_ptr<VisionTower> LoadTower(const LoadedModel& m) {
  auto tower = VisionTower::Load(*m.ckpt, m.cfg);
  INFO(tower.status().ToString());
  REQUIRE(tower.ok());
  return std::move(*tower);
}

// The pixel rows of `image` within the vision batch (each image is
// preprocessed on its own, so a chat's pixels are these rows in order).
std::vector<float> ImagePixels(const Goldens& g, const std::string& image) {
  const std::vector<float> all = F32Tensor(*g.tensors, std::string("pixel_values.") + kBatch);
  const std::vector<MediaGrid> grids = Grids(g.json["vision_batch_grid_thw"]);
  const size_t row = all.size() / (grids[0].num_patches() + grids[1].num_patches());
  const size_t first = grids[0].num_patches() * row;
  if (image == g.json["vision_batch"][0]) return {all.begin(), all.begin() + first};
  REQUIRE(image == g.json["vision_batch"][1]);
  return {all.begin() + first, all.end()};
}

TEST_CASE("Qwen3-VL tower: main embedding and DeepStack features match transformers", "[qwen3vl]") {
  const Goldens g;
  const LoadedModel m = OpenModelDir(kModel);
  REQUIRE(m.cfg.vision->arch == VisionConfig::Arch::kQwen3Vl);
  const auto tower = LoadTower(m);
  auto out = tower->ForwardAll(F32Tensor(*g.tensors, std::string("pixel_values.") + kBatch),
                               Grids(g.json["vision_batch_grid_thw"]));
  INFO(out.status().ToString());
  REQUIRE(out.ok());
  const std::vector<float> want = F32Tensor(*g.tensors, std::string("vision_out.") + kBatch);
  REQUIRE(out->main.size() == want.size());
  CHECK(MaxAbsDiff(out->main, want.data()) < 1e-4f);
  auto main_only = tower->Forward(F32Tensor(*g.tensors, std::string("pixel_values.") + kBatch),
                                  Grids(g.json["vision_batch_grid_thw"]));
  REQUIRE(main_only.ok());
  CHECK(*main_only == out->main);
  REQUIRE(out->deepstack.size() == 2);
  for (size_t k = 0; k < out->deepstack.size(); ++k) {
    INFO("deepstack " << k);
    const std::vector<float> ds =
        F32Tensor(*g.tensors, "vision_deepstack" + std::to_string(k) + "." + kBatch);
    REQUIRE(out->deepstack[k].size() == ds.size());
    CHECK(MaxAbsDiff(out->deepstack[k], ds.data()) < 1e-4f);
  }
}

TEST_CASE("Qwen3-VL chats: positions equal get_rope_index's", "[qwen3vl]") {
  const Goldens g;
  const LoadedModel m = OpenModelDir(kModel);
  const MediaPadIds pads{.image = m.cfg.tokens.image_pad, .video = m.cfg.tokens.video_pad};
  for (const auto& chat : g.json["chats"]) {
    INFO(chat["name"].get<std::string>());
    const std::vector<int32_t> ids = chat["input_ids"];
    const std::vector<MediaGrid> grids = SplitVideoFrames(ChatGrids(chat));
    // The prompt with one placeholder per image (per video frame) expands to
    // the golden ids.
    std::vector<int32_t> collapsed;
    for (size_t i = 0; i < ids.size(); ++i) {
      if (!pads.IsPad(ids[i]) || i == 0 || ids[i - 1] != ids[i]) collapsed.push_back(ids[i]);
    }
    auto expanded = ExpandImagePlaceholders(collapsed, pads, grids);
    REQUIRE(expanded.ok());
    CHECK(*expanded == ids);
    auto pos = ComputeMropePositions(ids, pads, grids, m.cfg.vision->spatial_merge_size);
    REQUIRE(pos.ok());
    CHECK(pos->t == chat["position_ids"][0].get<std::vector<int32_t>>());
    CHECK(pos->h == chat["position_ids"][1].get<std::vector<int32_t>>());
    CHECK(pos->w == chat["position_ids"][2].get<std::vector<int32_t>>());
    CHECK(pos->delta == chat["rope_delta"].get<int32_t>());
  }
}

// One sequence on a contiguous block table: prefill, then decode steps.
TEST_CASE("Qwen3-VL chats: last logits and greedy tokens match transformers, with DeepStack",
          "[qwen3vl]") {
  const Goldens g;
  const LoadedModel m = LoadTestModel("qwen3vl-tiny");
  const auto tower = LoadTower(m);
  cpu::ThreadPool pool(2);
  Qwen2Model model(m.cfg.text, *m.weights, pool);
  const int64_t hidden = m.cfg.text.hidden_size;
  const MediaPadIds pads{.image = m.cfg.tokens.image_pad, .video = m.cfg.tokens.video_pad};
  // generate_greedy masks <|im_end|> (eos) and <|endoftext|> (bos and pad).
  const std::vector<int> masked = {m.cfg.tokens.eos.at(0), m.cfg.tokens.bos};
  // One image, two images, a video, text, an image then a video.
  REQUIRE(g.json["chats"].size() == 5);
  for (const auto& chat : g.json["chats"]) {
    const std::string name = chat["name"];
    INFO(name);
    const std::vector<int32_t> ids = chat["input_ids"];
    const std::vector<MediaGrid> grids = ChatGrids(chat);
    std::vector<float> pixels;
    for (const auto& image : chat["images"]) {
      const std::vector<float> p = ImagePixels(g, image);
      pixels.insert(pixels.end(), p.begin(), p.end());
    }
    if (chat.contains("video_grid_thw")) {
      const std::vector<float> video = F32Tensor(*g.tensors, "pixel_values_videos." + name);
      pixels.insert(pixels.end(), video.begin(), video.end());
    }
    VisionEmbeddings none;
    none.deepstack.resize(m.cfg.vision->deepstack_visual_indexes.size());
    auto vision =
        grids.empty() ? absl::StatusOr<VisionEmbeddings>(none) : tower->ForwardAll(pixels, grids);
    REQUIRE(vision.ok());
    const int levels = static_cast<int>(vision->deepstack.size());
    // Each image token's DeepStack features, [token][level][hidden].
    std::vector<float> deepstack(vision->main.size() * levels);
    const int64_t tokens = static_cast<int64_t>(vision->main.size()) / hidden;
    for (int64_t t = 0; t < tokens; ++t) {
      for (int k = 0; k < levels; ++k) {
        std::memcpy(&deepstack[(t * levels + k) * hidden], &vision->deepstack[k][t * hidden],
                    hidden * sizeof(float));
      }
    }
    std::vector<EmbeddingOverride> overrides;
    for (size_t i = 0; i < ids.size(); ++i) {
      if (!pads.IsPad(ids[i])) continue;
      const int64_t t = static_cast<int64_t>(overrides.size());
      overrides.push_back({static_cast<int64_t>(i), &vision->main[t * hidden],
                           &deepstack[t * levels * hidden], levels});
    }
    REQUIRE(static_cast<int64_t>(overrides.size()) == tokens);
    auto pos =
        ComputeMropePositions(ids, pads, SplitVideoFrames(grids), m.cfg.vision->spatial_merge_size);
    REQUIRE(pos.ok());
    std::vector<int64_t> positions;
    for (const auto* row : {&pos->t, &pos->h, &pos->w})
      positions.insert(positions.end(), row->begin(), row->end());

    GoldenSequence seq(model, static_cast<int64_t>(ids.size()) + 32);
    std::vector<float> logits = seq.Step(ids, positions, overrides);
    const std::vector<float> want = F32Tensor(*g.tensors, "logits_last.fp32." + name);
    REQUIRE(logits.size() == want.size());
    CHECK(MaxAbsDiff(logits, want.data()) < 1e-4f);

    std::vector<int32_t> greedy;
    int64_t next = static_cast<int64_t>(ids.size()) + pos->delta;
    for (size_t step = 0; step < chat["greedy_ids"].size(); ++step) {
      const int32_t token = GreedyToken(logits, masked);
      greedy.push_back(token);
      logits = seq.Step({token}, {next, next, next});
      ++next;
    }
    CHECK(greedy == chat["greedy_ids"].get<std::vector<int32_t>>());
  }
}

TEST_CASE("Qwen3-VL: more DeepStack features than layers are refused before any work",
          "[qwen3vl]") {
  const LoadedModel m = LoadTestModel("qwen3vl-tiny");
  cpu::ThreadPool pool(1);
  Qwen2Model model(m.cfg.text, *m.weights, pool);
  auto kv = KvCache::Create(model.KvShape(1, 16));
  REQUIRE(kv.ok());
  const int64_t hidden = m.cfg.text.hidden_size;
  const std::vector<float> embedding(hidden, 0.5f), features(4 * hidden, 0.25f);
  ForwardBatch b;
  b.token_ids = {1, m.cfg.tokens.image_pad};
  b.positions = {0, 1, 0, 1, 0, 1};
  b.slot_mapping = {0, 1};
  b.sequences.push_back({0, 2, 2, {0}});
  b.logits_rows = {1};
  b.embedding_overrides.push_back({1, embedding.data(), features.data(), 4});
  std::vector<float> logits;
  const absl::Status s = model.Forward(b, **kv, &logits);
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(s.message() == "row 1 has 4 DeepStack features for a model of 3 layers");
  b.embedding_overrides[0] = {1, embedding.data(), nullptr, 2};
  CHECK(model.Forward(b, **kv, &logits).code() == absl::StatusCode::kInvalidArgument);
  b.embedding_overrides[0] = {1, embedding.data(), features.data(), 3};
  CHECK(model.Forward(b, **kv, &logits).ok());
}

}  // namespace
}  // namespace mmserve::model
