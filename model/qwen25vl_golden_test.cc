// Qwen2.5-VL's language model at the model level against transformers
// 4.57.6 on the tiny random checkpoint (tools/gen_qwen25vl_goldens.py): a
// text chat, a one-image chat and a chat with two images of different
// sizes, their M-RoPE positions (Qwen2_5_VLModel.get_rope_index), last
// logits and 16 greedy tokens. The image rows are transformers' own tower
// output, so this checks the decoder alone; //model:vision_tower_test
// checks the tower and //worker:engine_test the chats from the image files.
#include <algorithm>
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
};

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
  int text = 0, images = 0;
  for (const auto& chat : g.json["chats"]) {
    const std::string name = chat["name"];
    INFO(name);
    // Transformers' tower on the chat's images in one call: the rows its
    // image pads get.
    const bool has_images = !chat["images"].empty();
    const std::vector<float> rows =
        has_images ? F32Tensor(*g.tensors, "vision_out.fp32." + name) : std::vector<float>{};
    const ChatResult r = RunChat(model, m.cfg, chat, rows);
    const std::vector<float> want = F32Tensor(*g.tensors, "logits_last.fp32." + name);
    REQUIRE(r.last_logits.size() == want.size());
    CHECK(MaxAbsDiff(r.last_logits, want.data()) < 1e-4f);
    CHECK(r.greedy == chat["greedy_ids"].get<std::vector<int32_t>>());
    text += !has_images;
    images = std::max(images, static_cast<int>(chat["images"].size()));
  }
  CHECK(text == 1);
  CHECK(images == 2);  // a chat with two images of different sizes
}

}  // namespace
}  // namespace mmserve::model
