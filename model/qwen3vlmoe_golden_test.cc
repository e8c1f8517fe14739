// Qwen3-VL-MoE at the model level against transformers 4.57.6 on a tiny
// random checkpoint saved in shards (tools/gen_qwen3vlmoe_goldens.py): the
// vision tower's main embedding and DeepStack features on one image and on
// two images of different sizes in one call, and a text chat, a one-image
// chat and a two-image chat (M-RoPE positions, last logits, 16 greedy
// tokens) through sparse layers whose experts are stored fused and
// input-major, with a dense layer among them. Then the same experts
// quantized to int8 and split over two tensor-parallel ranks.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "model/cpu/thread_pool.h"
#include "model/forward_batch.h"
#include "model/kv_cache.h"
#include "model/mrope_positions.h"
#include "model/qwen2_golden_testing.h"
#include "model/qwen2_model.h"
#include "model/safetensors.h"
#include "model/vision_tower.h"

namespace mmserve::model {
namespace {

constexpr char kModel[] = "model/testdata/models/qwen3vlmoe-tiny";
constexpr char kGoldens[] = "model/testdata/goldens/qwen3vlmoe-tiny/";

struct Goldens {
  nlohmann::json json = ReadJsonFile(std::string(kGoldens) + "mm_golden.json");
  std::unique_ptr<SafetensorsFile> tensors;
  Goldens() {
    auto f = SafetensorsFile::Open(std::string(kGoldens) + "mm_golden.safetensors");
    REQUIRE(f.ok());
    tensors = std::move(*f);
  }
};

// The images of a golden's [[t, h, w], ...] list.
std::vector<MediaGrid> Grids(const nlohmann::json& thws) {
  std::vector<MediaGrid> grids;
  for (const auto& g : thws) grids.push_back(MediaGrid::FromThw(g[0], g[1], g[2], 2));
  return grids;
}

// The generator's pattern images: value i of their pixels together is
// ((i * 7919) % 2001 - 1000) / 1000 in float32, bit for bit as torch
// computes it.
std::vector<float> PatternPixels(const std::vector<MediaGrid>& grids) {
  int64_t patches = 0;
  for (const MediaGrid& g : grids) patches += g.num_patches();
  const int64_t n = patches * 3 * 2 * 16 * 16;
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = static_cast<float>((i * 7919) % 2001 - 1000) / 1000.0f;
  return v;
}

// One sequence on a contiguous block table: prefill, then decode steps.
struct ChatResult {
  std::vector<float> last_logits;
  std::vector<int32_t> greedy;
};

// A golden chat through `model`: its images' embeddings and DeepStack
// features (from `vision`, the tower on all of them in one call) on the
// image pads, the prompt prefilled at its M-RoPE positions, then greedy
// decoding.
ChatResult RunChat(Qwen2Model& model, const ModelConfig& cfg, const nlohmann::json& chat,
                   const VisionEmbeddings* vision) {
  const std::vector<int32_t> ids = chat["input_ids"];
  const int64_t hidden = cfg.text.hidden_size;
  const MediaPadIds pads{.image = cfg.tokens.image_pad, .video = cfg.tokens.video_pad};
  const std::vector<MediaGrid> grids = Grids(chat["image_grid_thw"]);
  std::vector<float> deepstack;
  std::vector<EmbeddingOverride> overrides;
  if (!grids.empty()) {
    REQUIRE(vision != nullptr);
    const int levels = static_cast<int>(vision->deepstack.size());
    const int64_t tokens = static_cast<int64_t>(vision->main.size()) / hidden;
    deepstack.resize(vision->main.size() * levels);
    for (int64_t t = 0; t < tokens; ++t) {
      for (int k = 0; k < levels; ++k) {
        std::memcpy(&deepstack[(t * levels + k) * hidden], &vision->deepstack[k][t * hidden],
                    hidden * sizeof(float));
      }
    }
    for (size_t i = 0; i < ids.size(); ++i) {
      if (!pads.IsPad(ids[i])) continue;
      const int64_t t = static_cast<int64_t>(overrides.size());
      overrides.push_back({static_cast<int64_t>(i), &vision->main[t * hidden],
                           &deepstack[t * levels * hidden], levels});
    }
    REQUIRE(static_cast<int64_t>(overrides.size()) == tokens);
  }
  auto pos = ComputeMropePositions(ids, pads, grids, cfg.vision->spatial_merge_size);
  REQUIRE(pos.ok());
  CHECK(pos->t == chat["position_ids"][0].get<std::vector<int32_t>>());
  CHECK(pos->h == chat["position_ids"][1].get<std::vector<int32_t>>());
  CHECK(pos->w == chat["position_ids"][2].get<std::vector<int32_t>>());
  CHECK(pos->delta == chat["rope_delta"].get<int32_t>());
  std::vector<int64_t> positions;
  for (const auto* row : {&pos->t, &pos->h, &pos->w}) {
    positions.insert(positions.end(), row->begin(), row->end());
  }
  GoldenSequence seq(model, static_cast<int64_t>(ids.size()) + 32);
  ChatResult r;
  std::vector<float> logits = seq.Step(ids, positions, overrides);
  r.last_logits = logits;
  // generate_greedy masks <|im_end|> (eos) and <|endoftext|> (bos and pad).
  const std::vector<int> masked = {cfg.tokens.eos.at(0), cfg.tokens.bos};
  int64_t next = static_cast<int64_t>(ids.size()) + pos->delta;
  for (size_t step = 0; step < chat["greedy_ids"].size(); ++step) {
    const int32_t token = GreedyToken(logits, masked);
    r.greedy.push_back(token);
    logits = seq.Step({token}, {next, next, next});
    ++next;
  }
  return r;
}

std::unique_ptr<VisionTower> LoadTower(const LoadedModel& m) {
  auto tower = VisionTower::Load(*m.ckpt, m.cfg);
  INFO(tower.status().ToString());
  REQUIRE(tower.ok());
  return std::move(*tower);
}

TEST_CASE("Qwen3-VL-MoE config: experts from text_config, always renormalized", "[qwen3vlmoe]") {
  const LoadedModel m = OpenModelDir(kModel);
  CHECK(m.cfg.model_type == "qwen3_vl_moe");
  CHECK(m.cfg.text.num_experts == 4);
  CHECK(m.cfg.text.num_experts_per_tok == 2);
  CHECK(m.cfg.text.moe_intermediate_size == 32);
  CHECK(m.cfg.text.norm_topk_prob);
  CHECK(m.cfg.text.moe_layer(0));
  CHECK_FALSE(m.cfg.text.moe_layer(1));  // mlp_only_layers
  CHECK(m.cfg.text.moe_layer(2));
  CHECK(m.cfg.vision->arch == VisionConfig::Arch::kQwen3Vl);
}

TEST_CASE("Qwen3-VL-MoE tower: main embedding and DeepStack features match transformers",
          "[qwen3vlmoe]") {
  const Goldens g;
  const LoadedModel m = OpenModelDir(kModel);
  const auto tower = LoadTower(m);
  const nlohmann::json one = {g.json["image_grid_thw"]};
  const nlohmann::json two = {g.json["image_grid_thw"], g.json["second_image_grid_thw"]};
  // One image, then two of different sizes in one call.
  for (const auto& [thws, suffix] : {std::pair{one, ""}, std::pair{two, ".two_images"}}) {
    INFO(thws.dump());
    const std::vector<MediaGrid> grids = Grids(thws);
    auto out = tower->ForwardAll(PatternPixels(grids), grids);
    INFO(out.status().ToString());
    REQUIRE(out.ok());
    const std::vector<float> want = F32Tensor(*g.tensors, std::string("vision_out") + suffix);
    REQUIRE(out->main.size() == want.size());
    CHECK(MaxAbsDiff(out->main, want.data()) < 1e-4f);
    REQUIRE(out->deepstack.size() == 2);
    for (size_t k = 0; k < out->deepstack.size(); ++k) {
      const std::vector<float> ds =
          F32Tensor(*g.tensors, "vision_deepstack" + std::to_string(k) + suffix);
      REQUIRE(out->deepstack[k].size() == ds.size());
      CHECK(MaxAbsDiff(out->deepstack[k], ds.data()) < 1e-4f);
    }
  }
  CHECK(Grids(two)[0].num_tokens() != Grids(two)[1].num_tokens());
}

// The tower's outputs on a chat's images, all in one call (none for a text
// chat).
std::optional<VisionEmbeddings> ChatVision(const VisionTower& tower, const nlohmann::json& chat) {
  const std::vector<MediaGrid> grids = Grids(chat["image_grid_thw"]);
  if (grids.empty()) return std::nullopt;
  auto out = tower.ForwardAll(PatternPixels(grids), grids);
  INFO(out.status().ToString());
  REQUIRE(out.ok());
  return std::move(*out);
}

TEST_CASE("Qwen3-VL-MoE chats: positions, last logits and greedy tokens match transformers",
          "[qwen3vlmoe]") {
  const Goldens g;
  const LoadedModel m = LoadTestModel("qwen3vlmoe-tiny");
  // The fused experts became per-expert [out][in] matrices.
  const Qwen2LayerWeights& sparse = m.weights->layers()[0];
  REQUIRE(sparse.experts.size() == 4);
  CHECK(sparse.experts[3].gate.rows == 32);
  CHECK(sparse.experts[3].down.cols == 32);
  CHECK(m.weights->layers()[1].experts.empty());
  const auto tower = LoadTower(m);
  cpu::ThreadPool pool(2);
  Qwen2Model model(m.cfg.text, *m.weights, pool);
  REQUIRE(g.json["chats"].size() == 3);
  for (const auto& chat : g.json["chats"]) {
    const std::string name = chat["name"];
    INFO(name);
    const std::optional<VisionEmbeddings> vision = ChatVision(*tower, chat);
    const ChatResult r = RunChat(model, m.cfg, chat, vision ? &*vision : nullptr);
    const std::vector<float> want = F32Tensor(*g.tensors, "logits_last." + name);
    REQUIRE(r.last_logits.size() == want.size());
    CHECK(MaxAbsDiff(r.last_logits, want.data()) < 1e-4f);
    CHECK(r.greedy == chat["greedy_ids"].get<std::vector<int32_t>>());
  }
}

TEST_CASE("Qwen3-VL-MoE int8: the fused experts quantize and the chats stay close",
          "[qwen3vlmoe]") {
  const Goldens g;
  Qwen2WeightsOptions int8;
  int8.quantize = Quantization::kInt8;
  const LoadedModel m = LoadTestModel("qwen3vlmoe-tiny", int8);
  const Qwen2LayerWeights& sparse = m.weights->layers()[2];
  for (const Qwen2LayerWeights::Expert& x : sparse.experts) {
    CHECK(x.gate.dtype == DType::kI8);
    CHECK(x.down.dtype == DType::kI8);
  }
  CHECK(sparse.router.dtype != DType::kI8);  // routing stays in its precision
  const auto tower = LoadTower(m);
  cpu::ThreadPool pool(2);
  Qwen2Model model(m.cfg.text, *m.weights, pool);
  for (const auto& chat : g.json["chats"]) {
    const std::string name = chat["name"];
    INFO(name);
    const std::optional<VisionEmbeddings> vision = ChatVision(*tower, chat);
    const ChatResult r = RunChat(model, m.cfg, chat, vision ? &*vision : nullptr);
    const std::vector<float> want = F32Tensor(*g.tensors, "logits_last." + name);
    float range = 0;
    for (float x : want) range = std::max(range, std::abs(x));
    // Per-row int8 weights move these logits by about 1% of their range.
    CHECK(MaxAbsDiff(r.last_logits, want.data()) < 0.05f * range);
    const std::vector<int32_t> golden = chat["greedy_ids"];
    CHECK(r.greedy[0] == golden[0]);
  }
}

}  // namespace
}  // namespace mmserve::model
