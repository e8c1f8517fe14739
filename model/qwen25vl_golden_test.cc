// Qwen2.5-VL's language model at the model level against transformers
// 4.57.6 on the tiny random checkpoint (tools/gen_qwen25vl_goldens.py): a
// text chat and a one-image chat, their M-RoPE positions
// (Qwen2_5_VLModel.get_rope_index), last logits and 16 greedy tokens. The
// image chat's embedding rows are transformers' own tower output, so this
// checks the decoder alone; //model:vision_tower_test checks the tower and
// //worker:engine_test the chats from the image files.
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "model/cpu/thread_pool.h"
#include "model/forward_batch.h"
#include "model/mrope_positions.h"
#include "model/qwen2_golden_testing.h"
#include "model/qwen2_model.h"
#include "model/qwen2_test_runner.h"
#include "model/safetensors.h"

namespace mmserve::model {
namespace {

constexpr char kGoldens[] = "model/testdata/goldens/qwen25vl-tiny/";

struct Goldens {
  nlohmann::json json = ReadJsonFile(std::string(kGoldens) + "mm_golden.json");
  std::unique_ptr<SafetensorsFile> tensors;
  Goldens() {
    auto f = SafetensorsFile::Open(std::string(kGoldens) + "mm_golden.safetensors");
    REQUIRE(f.ok());
    tensors = std::move(*f);
  }
  const nlohmann::json& Chat(const std::string& name) const {
    for (const auto& c : json["chats"]) {
      if (c["name"] == name) return c;
    }
    FAIL("no chat " << name);
    return json;
  }
};

// The rows of `image` in transformers' tower output on the vision batch
// (both images in one call, in patch order).
std::vector<float> TowerRows(const Goldens& g, const std::string& image, int64_t hidden) {
  const nlohmann::json& batch = g.json["vision_batch"];
  std::string key = "vision_out.fp32";
  for (size_t i = 0; i < batch.size(); ++i) key += (i ? "+" : ".") + batch[i].get<std::string>();
  const std::vector<float> all = F32Tensor(*g.tensors, key);
  int64_t row = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    const auto& thw = g.json["vision_batch_grid_thw"][i];
    const int64_t tokens = MediaGrid::FromThw(thw[0], thw[1], thw[2], 2).num_tokens();
    if (batch[i] == image) {
      return {all.begin() + row * hidden, all.begin() + (row + tokens) * hidden};
    }
    row += tokens;
  }
  FAIL("image " << image << " is not in the vision batch");
  return {};
}

struct ChatResult {
  std::vector<float> last_logits;
  std::vector<int32_t> greedy;
};

// A golden chat through `model`: `rows` on its image pads (none for a text
// chat), the prompt prefilled at its M-RoPE positions, then greedy decoding
// with eos and bos masked as generate_greedy masks them.
ChatResult RunChat(Qwen2Model& model, const ModelConfig& cfg, const nlohmann::json& chat,
                   const std::vector<float>& rows) {
  const std::vector<int32_t> ids = chat["input_ids"];
  const int64_t hidden = cfg.text.hidden_size;
  const MediaPadIds pads{.image = cfg.tokens.image_pad, .video = cfg.tokens.video_pad};
  std::vector<MediaGrid> grids;
  for (const auto& thw : chat["image_grid_thw"]) {
    grids.push_back(MediaGrid::FromThw(thw[0], thw[1], thw[2], cfg.vision->spatial_merge_size));
  }
  std::vector<EmbeddingOverride> overrides;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (!pads.IsPad(ids[i])) continue;
    const int64_t t = static_cast<int64_t>(overrides.size());
    overrides.push_back({static_cast<int64_t>(i), &rows[t * hidden]});
  }
  REQUIRE(static_cast<int64_t>(overrides.size() * hidden) == static_cast<int64_t>(rows.size()));
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

TEST_CASE(
    "Qwen2.5-VL text and image chats: positions, last logits and greedy tokens match "
    "transformers",
    "[qwen25vl]") {
  const Goldens g;
  const LoadedModel m = LoadTestModel("qwen25vl-tiny");
  REQUIRE(m.cfg.model_type == "qwen2_5_vl");
  cpu::ThreadPool pool(2);
  Qwen2Model model(m.cfg.text, *m.weights, pool);
  const int64_t hidden = m.cfg.text.hidden_size;
  struct Want {
    const char* chat;
    const char* image;  // nullptr: a text chat
  };
  for (const Want& w : {Want{"text", nullptr}, Want{"one_image", "rect300x200"}}) {
    INFO(w.chat);
    const nlohmann::json& chat = g.Chat(w.chat);
    REQUIRE(chat["images"].size() == (w.image ? 1u : 0u));
    const std::vector<float> rows = w.image ? TowerRows(g, w.image, hidden) : std::vector<float>{};
    const ChatResult r = RunChat(model, m.cfg, chat, rows);
    const std::vector<float> want =
        F32Tensor(*g.tensors, std::string("logits_last.fp32.") + w.chat);
    REQUIRE(r.last_logits.size() == want.size());
    CHECK(MaxAbsDiff(r.last_logits, want.data()) < 1e-4f);
    CHECK(r.greedy == chat["greedy_ids"].get<std::vector<int32_t>>());
  }
}

}  // namespace
}  // namespace mmserve::model
