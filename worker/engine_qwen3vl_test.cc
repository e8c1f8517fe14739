// Qwen3-VL image and text chats through the in-process engine against transformers
// 4.57.6 (model/testdata/goldens/qwen3vl-tiny, tools/gen_qwen3vl_goldens.py):
// the golden images preprocessed here at patch 16 / merge 2 give
// transformers' pixel values, the tower's rows (main embedding and DeepStack
// features side by side, as the encoder sends them) go in as image
// embeddings, and the engine's greedy tokens are transformers'. Without the
// DeepStack features the answer differs, so the features are what makes it
// match.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "common/file.h"
#include "model/image_decode.h"
#include "model/image_preprocess.h"
#include "model/model_config.h"
#include "model/safetensors.h"
#include "model/vision_tower.h"
#include "nlohmann/json.hpp"
#include "worker/engine.h"

namespace mmserve::worker {
namespace {

constexpr char kModel[] = "model/testdata/models/qwen3vl-tiny";
constexpr char kGoldens[] = "model/testdata/goldens/qwen3vl-tiny/";
constexpr char kImages[] = "model/testdata/goldens/images/";

std::vector<float> Floats(const model::SafetensorsFile& f, const std::string& name) {
  const model::TensorView* t = f.Find(name);
  INFO(name);
  REQUIRE(t != nullptr);
  std::vector<float> v(t->numel());
  std::memcpy(v.data(), t->data, t->nbytes);
  return v;
}

model::ImagePatches Preprocess(const model::ModelConfig& config, const std::string& name) {
  auto bytes = ReadFileToString(std::string(kImages) + name + ".png");
  REQUIRE(bytes.ok());
  auto rgb = model::DecodeImage(*bytes, model::DecodeLimits());
  REQUIRE(rgb.ok());
  auto p = model::PreprocessImage(*rgb, *config.preprocessor);
  REQUIRE(p.ok());
  return std::move(*p);
}

std::vector<int32_t> Generate(const model::ModelConfig& config, std::vector<int32_t> ids,
                              std::vector<MediaEmbedding> images, size_t n) {
  EngineRequest req;
  req.id = "golden";
  req.prompt_token_ids = std::move(ids);
  req.image_embeddings = std::move(images);
  req.sampling.temperature = 0;
  req.sampling.max_tokens = static_cast<int>(n);
  req.sampling.ignore_eos = true;
  // transformers' generate_greedy masks <|im_end|> and <|endoftext|>.
  for (int token : {config.tokens.bos, config.tokens.eos.at(0)}) {
    req.sampling.logit_bias.push_back({token, -100.0f});
  }
  std::sort(req.sampling.logit_bias.begin(), req.sampling.logit_bias.end(),
            [](const model::TokenBias& a, const model::TokenBias& b) { return a.token < b.token; });
  EngineOptions o;
  o.model_dir = kModel;
  o.kv_cache_bytes = int64_t{16} << 20;
  auto engine = LlmEngine::Create(o);
  REQUIRE(engine.ok());
  std::vector<int32_t> out;
  const absl::Status added = (*engine)->AddRequest(std::move(req), [&out](const StreamEvent& e) {
    out.insert(out.end(), e.token_ids.begin(), e.token_ids.end());
  });
  INFO(added.ToString());
  REQUIRE(added.ok());
  while ((*engine)->has_unfinished()) REQUIRE((*engine)->Step().ok());
  return out;
}

TEST_CASE("Qwen3-VL chats: the engine's greedy tokens are transformers', with DeepStack",
          "[qwen3vl]") {
  const nlohmann::json g =
      nlohmann::json::parse(ReadFileToString(std::string(kGoldens) + "mm_golden.json").value());
  auto tensors = model::SafetensorsFile::Open(std::string(kGoldens) + "mm_golden.safetensors");
  REQUIRE(tensors.ok());
  const model::ModelConfig config = model::LoadModelConfig(kModel).value();
  auto ckpt = model::SafetensorsCheckpoint::Open(kModel).value();
  auto tower = model::VisionTower::Load(*ckpt, config).value();
  const int64_t hidden = config.text.hidden_size;
  // The vision batch's images preprocessed here, in its order, give
  // transformers' pixel values.
  const std::string batch =
      g["vision_batch"][0].get<std::string>() + "+" + g["vision_batch"][1].get<std::string>();
  const std::vector<float> golden_pixels = Floats(**tensors, "pixel_values.fp32." + batch);
  std::vector<float> pixels;
  for (const auto& image : g["vision_batch"]) {
    auto p = Preprocess(config, image.get<std::string>());
    pixels.insert(pixels.end(), p.values.begin(), p.values.end());
  }
  REQUIRE(pixels.size() == golden_pixels.size());
  float worst = 0;
  for (size_t i = 0; i < pixels.size(); ++i) {
    worst = std::max(worst, std::fabs(pixels[i] - golden_pixels[i]));
  }
  CHECK(worst < 1e-5f);
  int chats = 0;
  for (const auto& chat : g["chats"]) {
    // Video chats: //model:qwen3vl_video_golden_test, //tests:stack_qwen3vl_test.
    if (chat.contains("video_grid_thw")) continue;
    const std::string name = chat["name"];
    INFO(name);
    ++chats;
    std::vector<MediaEmbedding> images, plain;
    for (const auto& image : chat["images"]) {
      const model::ImagePatches p = Preprocess(config, image.get<std::string>());
      auto all = tower->ForwardAll(p.values, std::vector<model::MediaGrid>{p.grid});
      REQUIRE(all.ok());
      MediaEmbedding e{.grid = p.grid};
      e.values = model::TokenRows(*all, hidden);
      images.push_back(e);
      // The same rows with every DeepStack feature zero.
      for (size_t r = 0; r < e.values.size(); r += 3 * hidden) {
        std::fill(e.values.begin() + r + hidden, e.values.begin() + r + 3 * hidden, 0.0f);
      }
      plain.push_back(std::move(e));
    }
    // One pad per image: the engine expands each to its grid's tokens.
    std::vector<int32_t> ids;
    const std::vector<int32_t> expanded = chat["input_ids"];
    for (size_t i = 0; i < expanded.size(); ++i) {
      if (expanded[i] != config.tokens.image_pad || i == 0 || expanded[i - 1] != expanded[i]) {
        ids.push_back(expanded[i]);
      }
    }
    const std::vector<int32_t> want = chat["greedy_ids"];
    CHECK(Generate(config, ids, images, want.size()) == want);
    if (!images.empty()) CHECK(Generate(config, ids, plain, want.size()) != want);
  }
  CHECK(chats == 3);  // one image, two images, text
}

}  // namespace
}  // namespace mmserve::worker
