// Videos through the engine (issue 28): chats with one video, a video plus
// an image, and two videos, their embeddings from the vision tower on
// transformers' pixel values (worker/video_goldens.h), batched together,
// must give transformers' greedy tokens; the prefix cache keys a video's
// tokens by its content; a video embedding on an image placeholder (or the
// reverse) is refused without side effects.
#include <catch2/catch.hpp>
#include <map>
#include <string>
#include <vector>

#include "worker/engine.h"
#include "worker/video_goldens.h"

namespace mmserve::worker {
namespace {

constexpr char kData[] = "model/testdata/";

std::unique_ptr<LlmEngine> MakeEngine(const std::string& model) {
  EngineOptions o;
  o.model_dir = std::string(kData) + "models/" + model;
  o.block_size = 4;
  o.max_num_batched_tokens = 32;
  o.max_num_seqs = 8;
  o.kv_cache_bytes = 8 << 20;
  o.load_vision = false;
  auto e = LlmEngine::Create(o);
  INFO(e.status().ToString());
  REQUIRE(e.ok());
  return std::move(*e);
}

struct Collected {
  std::vector<int32_t> tokens;
  int prompt_tokens = 0;
  FinishReason finish = FinishReason::kNone;
};

StreamCallback Collect(Collected* c) {
  return [c](const StreamEvent& e) {
    c->tokens.insert(c->tokens.end(), e.token_ids.begin(), e.token_ids.end());
    c->prompt_tokens = e.prompt_tokens;
    if (e.finish_reason != FinishReason::kNone) c->finish = e.finish_reason;
  };
}

void RunToEnd(LlmEngine& e) {
  for (int steps = 0; e.has_unfinished(); ++steps) {
    REQUIRE(steps < 5000);
    REQUIRE(e.Step().ok());
  }
}

VideoGoldens Load(const std::string& model) {
  auto g = VideoGoldens::Load(model);
  INFO(g.status().ToString());
  REQUIRE(g.ok());
  REQUIRE(g->chats.size() == 3);
  return std::move(*g);
}

TEST_CASE("video chats batched through the engine equal transformers", "[video]") {
  for (const char* name : {"qwen2vl-tiny-mha-tied", "qwen2vl-tiny-gqa2-untied-sharded"}) {
    INFO(name);
    const VideoGoldens g = Load(name);
    auto engine = MakeEngine(name);
    std::map<std::string, Collected> got;
    for (const VideoChat& c : g.chats) {
      auto s = engine->AddRequest(c.Request(c.name), Collect(&got[c.name]));
      INFO(s.ToString());
      REQUIRE(s.ok());
    }
    RunToEnd(*engine);
    for (const VideoChat& c : g.chats) {
      INFO(c.name);
      CHECK(got[c.name].tokens == c.greedy_ids);
      CHECK(got[c.name].prompt_tokens == static_cast<int>(c.input_ids.size()));
      CHECK(got[c.name].finish == FinishReason::kLength);
    }
    CHECK(engine->scheduler().kv_cache().stats().num_used_blocks == 0);
  }
}

TEST_CASE("the prefix cache keys a video's tokens by its content", "[video]") {
  const VideoGoldens g = Load("qwen2vl-tiny-mha-tied");
  const VideoChat& chat = g.chats[0];  // one_video
  REQUIRE(chat.items.size() == 1);
  auto engine = MakeEngine("qwen2vl-tiny-mha-tied");
  // Prompt tokens served from the prefix cache by running `r`.
  auto hit_tokens = [&](EngineRequest r) {
    const int64_t before = engine->scheduler().kv_cache().stats().prefix_hit_tokens;
    Collected c;
    REQUIRE(engine->AddRequest(std::move(r), Collect(&c)).ok());
    RunToEnd(*engine);
    CHECK(c.tokens == chat.greedy_ids);
    return engine->scheduler().kv_cache().stats().prefix_hit_tokens - before;
  };
  CHECK(hit_tokens(chat.Request("a")) == 0);
  // Up to the last full block of the prompt (block size 4).
  CHECK(hit_tokens(chat.Request("b")) >= static_cast<int64_t>(chat.input_ids.size()) - 4);
  // Another key (another clip with the same grid) shares only the text before it.
  EngineRequest other = chat.Request("c");
  other.image_embeddings[0].key = ContentHash{1, 2};
  int first_pad = 0;
  while (chat.input_ids[first_pad] != chat.input_ids[first_pad + 1]) ++first_pad;
  CHECK(hit_tokens(std::move(other)) <= first_pad);
}

TEST_CASE("a video on an image placeholder, or the reverse, is refused", "[video]") {
  const VideoGoldens g = Load("qwen2vl-tiny-mha-tied");
  auto engine = MakeEngine("qwen2vl-tiny-mha-tied");
  Collected c;
  EngineRequest as_image = g.chats[0].Request("x");
  as_image.image_embeddings[0].grid.kind = model::MediaKind::kImage;
  CHECK(engine->AddRequest(std::move(as_image), Collect(&c)).code() ==
        absl::StatusCode::kInvalidArgument);
  EngineRequest swapped = g.chats[1].Request("y");  // video then image
  std::swap(swapped.image_embeddings[0], swapped.image_embeddings[1]);
  CHECK(engine->AddRequest(std::move(swapped), Collect(&c)).code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK_FALSE(engine->has_unfinished());
  CHECK(engine->scheduler().kv_cache().stats().num_used_blocks == 0);
}

}  // namespace
}  // namespace mmserve::worker
