// The engine as rank 0 of a TP=2 instance (its shard rank a real
// //worker:tp_shard process) against the same engine on one rank, on the
// demo model: text and image requests batched together must produce the
// same greedy token ids; video chats on a tiny golden model give
// transformers' tokens. And the refusals: a model whose KV heads do not
// split, a missing shard binary, quantization.
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <map>
#include <string>
#include <vector>

#include "worker/engine.h"
#include "worker/shm_communicator.h"
#include "worker/shm_file.h"
#include "worker/step_ring.h"
#include "worker/video_goldens.h"

namespace mmserve::worker {
namespace {

constexpr char kDemo[] = "models/shapes-demo";
constexpr char kShard[] = "worker/tp_shard";

EngineOptions Options(const std::string& dir, int tp) {
  EngineOptions o;
  o.model_dir = dir;
  o.block_size = 4;
  o.max_num_batched_tokens = 48;  // prompts go in chunks, beside decodes
  o.max_num_seqs = 8;
  o.kv_cache_bytes = 4 << 20;
  o.num_threads = 1;
  o.tp_size = tp;
  o.tp_shard_binary = kShard;
  return o;
}

// An 84x84 picture: a gray background and one coloured square.
model::RgbImage Picture(int variant) {
  model::RgbImage img;
  img.width = img.height = 84;
  img.pixels.assign(84 * 84 * 3, 128);
  const uint8_t colour[3] = {static_cast<uint8_t>(200 * (variant % 2)), 60,
                             static_cast<uint8_t>(220 - 50 * variant)};
  for (int y = 10 + 8 * variant; y < 40 + 8 * variant; ++y) {
    for (int x = 20; x < 50; ++x) {
      for (int c = 0; c < 3; ++c) img.pixels[(y * 84 + x) * 3 + c] = colour[c];
    }
  }
  return img;
}

std::string Chat(const std::string& user) {
  return "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n" + user +
         "<|im_end|>\n<|im_start|>assistant\n";
}

// Runs the same mixed workload; token ids by request id.
std::map<std::string, std::vector<int32_t>> RunWorkload(LlmEngine& e) {
  std::map<std::string, std::vector<int32_t>> out;
  auto add = [&](const std::string& id, const std::string& prompt,
                 std::vector<model::RgbImage> images) {
    EngineRequest r;
    r.id = id;
    r.prompt = prompt;
    r.images = std::move(images);
    r.sampling.temperature = 0;
    r.sampling.max_tokens = 12;
    r.sampling.min_tokens = 12;  // past the answer: a longer comparison
    std::vector<int32_t>* tokens = &out[id];
    REQUIRE(e.AddRequest(std::move(r), [tokens](const StreamEvent& ev) {
               tokens->insert(tokens->end(), ev.token_ids.begin(), ev.token_ids.end());
             }).ok());
  };
  const std::string image = "<|vision_start|><|image_pad|><|vision_end|>";
  add("count", Chat(image + "How many shapes are there?"), {Picture(0)});
  add("text", Chat("What color is the star?"), {});
  add("color", Chat(image + "What color is the shape at the top left?"), {Picture(1)});
  add("where", Chat(image + "Where is the blue circle?"), {Picture(2)});
  for (int steps = 0; e.has_unfinished(); ++steps) {
    REQUIRE(steps < 2000);
    absl::Status s = e.Step();
    INFO(s.ToString());
    REQUIRE(s.ok());
  }
  return out;
}

TEST_CASE("a TP=2 engine generates the same token ids as one rank, images included",
          "[engine][tp]") {
  std::map<std::string, std::vector<int32_t>> one, two;
  {
    auto e = LlmEngine::Create(Options(kDemo, 1));
    INFO(e.status().ToString());
    REQUIRE(e.ok());
    one = RunWorkload(**e);
  }
  EngineOptions o = Options(kDemo, 2);
  o.tp_instance_id = "engine-tp-test-" + std::to_string(getpid());
  {
    auto e = LlmEngine::Create(o);
    INFO(e.status().ToString());
    REQUIRE(e.ok());
    two = RunWorkload(**e);
  }  // the shard rank is stopped and reaped here
  for (const auto& [id, tokens] : one) {
    INFO(id);
    CHECK(tokens.size() == 12);
    CHECK(two[id] == tokens);
  }
  CHECK(access(("/dev/shm" + ShmSegmentName(o.tp_instance_id)).c_str(), F_OK) != 0);
  CHECK(access(("/dev/shm" + StepRingName(o.tp_instance_id)).c_str(), F_OK) != 0);
  // No shard rank outlives the engine.
  CHECK(waitpid(-1, nullptr, WNOHANG) < 0);
}

// Seed 000: image embeddings given as rows in memory both ranks map
// (EngineOptions::shared_input) reach the shard as descriptors and give the
// token ids of the same rows sent inline.
TEST_CASE("TP=2 image rows in the shared input travel as descriptors, with the inline ids",
          "[engine][tp]") {
  constexpr int kImages = 3;
  constexpr int kTokens = 4;  // a 4x4 patch grid, 2x2 merged
  constexpr int kHidden = 128;
  auto shared = ShmFile::Create("engine-tp-test", size_t{kImages} * kTokens * kHidden * 4);
  REQUIRE(shared.ok());
  float* rows = reinterpret_cast<float*>((*shared)->data());
  for (int i = 0; i < kImages * kTokens * kHidden; ++i) rows[i] = 0.05f * ((i * 37) % 23 - 11);
  const std::string image = "<|vision_start|><|image_pad|><|vision_end|>";
  auto run = [&](LlmEngine& e, bool in_shared) {
    std::map<std::string, std::vector<int32_t>> out;
    for (int k = 0; k < kImages; ++k) {
      EngineRequest r;
      r.id = "image" + std::to_string(k);
      r.prompt = Chat(image + "What is in the picture?");
      MediaEmbedding emb;
      emb.grid = model::MediaGrid::FromThw(1, 4, 4, 2);
      emb.key = ContentHash{1, static_cast<uint64_t>(k + 1)};
      const float* first = rows + static_cast<size_t>(k) * kTokens * kHidden;
      if (in_shared) {
        emb.shared_values = first;
      } else {
        emb.values.assign(first, first + kTokens * kHidden);
      }
      r.image_embeddings.push_back(std::move(emb));
      r.sampling.temperature = 0;
      r.sampling.max_tokens = 6;
      r.sampling.min_tokens = 6;
      std::vector<int32_t>* tokens = &out[r.id];
      REQUIRE(e.AddRequest(std::move(r), [tokens](const StreamEvent& ev) {
                 tokens->insert(tokens->end(), ev.token_ids.begin(), ev.token_ids.end());
               }).ok());
    }
    for (int steps = 0; e.has_unfinished(); ++steps) {
      REQUIRE(steps < 1000);
      REQUIRE(e.Step().ok());
    }
    return out;
  };
  EngineOptions o = Options(kDemo, 2);
  o.load_vision = false;
  o.tp_instance_id = "engine-tp-shared-" + std::to_string(getpid());
  std::map<std::string, std::vector<int32_t>> in_line, by_descriptor;
  {
    auto e = LlmEngine::Create(o);
    REQUIRE(e.ok());
    in_line = run(**e, false);
    CHECK((*e)->embedding_rows_inline() == kImages * kTokens);
    CHECK((*e)->embedding_rows_by_descriptor() == 0);
  }
  o.shared_input_fd = (*shared)->fd();
  o.shared_input = (*shared)->data();
  o.shared_input_bytes = (*shared)->size();
  {
    auto e = LlmEngine::Create(o);
    REQUIRE(e.ok());
    by_descriptor = run(**e, true);
    CHECK((*e)->embedding_rows_by_descriptor() == kImages * kTokens);
    CHECK((*e)->embedding_rows_inline() == 0);
  }
  REQUIRE(in_line.size() == kImages);
  for (const auto& [id, tokens] : in_line) {
    INFO(id);
    CHECK(tokens.size() == 6);
    CHECK(by_descriptor[id] == tokens);
  }
  // A shared row without a key is refused.
  {
    auto e = LlmEngine::Create(o);
    REQUIRE(e.ok());
    EngineRequest r;
    r.id = "nokey";
    r.prompt = Chat(image + "?");
    MediaEmbedding emb;
    emb.grid = model::MediaGrid::FromThw(1, 4, 4, 2);
    emb.shared_values = rows;
    r.image_embeddings.push_back(std::move(emb));
    CHECK(absl::IsInvalidArgument((*e)->AddRequest(std::move(r), [](const StreamEvent&) {})));
  }
  CHECK(waitpid(-1, nullptr, WNOHANG) < 0);
}

// Videos: M-RoPE positions of video runs are rank 0's, the rows
// travel as for images; the tokens are transformers'.
TEST_CASE("a TP=2 engine gives transformers' greedy tokens on video chats", "[engine][tp][video]") {
  auto goldens = VideoGoldens::Load("qwen2vl-tiny-mha-tied");
  INFO(goldens.status().ToString());
  REQUIRE(goldens.ok());
  EngineOptions o = Options("model/testdata/models/qwen2vl-tiny-mha-tied", 2);
  o.load_vision = false;
  o.tp_instance_id = "engine-tp-video-" + std::to_string(getpid());
  std::map<std::string, std::vector<int32_t>> got;
  {
    auto e = LlmEngine::Create(o);
    INFO(e.status().ToString());
    REQUIRE(e.ok());
    for (const VideoChat& c : goldens->chats) {
      std::vector<int32_t>* tokens = &got[c.name];
      REQUIRE((*e)->AddRequest(c.Request(c.name),
                               [tokens](const StreamEvent& ev) {
                                 tokens->insert(tokens->end(), ev.token_ids.begin(),
                                                ev.token_ids.end());
                               })
                  .ok());
    }
    for (int steps = 0; (*e)->has_unfinished(); ++steps) {
      REQUIRE(steps < 1000);
      REQUIRE((*e)->Step().ok());
    }
  }
  for (const VideoChat& c : goldens->chats) {
    INFO(c.name);
    CHECK(got[c.name] == c.greedy_ids);
  }
  CHECK(waitpid(-1, nullptr, WNOHANG) < 0);
}

TEST_CASE("tensor-parallel engines that cannot work are refused before any rank starts",
          "[engine][tp]") {
  // 1 KV head does not split over 2 ranks.
  auto mqa = LlmEngine::Create(Options("model/testdata/models/qwen2vl-tiny-mqa-bf16", 2));
  CHECK(absl::IsInvalidArgument(mqa.status()));
  CHECK(mqa.status().message().find("num_key_value_heads 1") != std::string::npos);
  EngineOptions o = Options(kDemo, 2);
  o.tp_shard_binary = "/nonexistent/tp_shard";
  CHECK(absl::IsInvalidArgument(LlmEngine::Create(o).status()));
  o = Options(kDemo, 2);
  o.quantize = "int8";
  CHECK(absl::IsInvalidArgument(LlmEngine::Create(o).status()));
  o = Options(kDemo, 0);
  CHECK(absl::IsInvalidArgument(LlmEngine::Create(o).status()));
  CHECK(waitpid(-1, nullptr, WNOHANG) < 0);  // nothing was started
}

}  // namespace
}  // namespace mmserve::worker
