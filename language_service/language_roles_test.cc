// Roles prefill and decode through real gRPC servers and
// the UCX KV hand-off, in one process: a decode instance holds each request's
// Decode stream, a prefill instance runs the prompt to its first token, hands
// the KV over (AllocateKv, puts, CommitKv) and ends its stream with
// kv_handed_off. The decode instance runs one rank or two (TP=2: rank 1 is a
// //worker:tp_shard process receiving its own KV heads over UCX). The tokens
// and text must equal a role-both instance's, for text prompts and for image
// prompts (whose embeddings come from an encoder
// stand-in over UCX); the rejections carry their codes; nothing leaks on
// either side.
#include <catch2/catch.hpp>

#include "language_service/roles_testing.h"

namespace mmserve::language {
namespace {

using namespace testing;  // NOLINT: the roles test support

TEST_CASE("prefill + decode instances give role both's tokens and text", "[roles]") {
  Instance both(LanguageRole::kBoth), prefill(LanguageRole::kPrefill),
      decode(LanguageRole::kDecode);
  const std::vector<std::string> prompts = {
      "The quick brown fox jumps over the lazy dog",
      "What is the color of the sky?",
      "one two three four five six seven eight nine ten eleven twelve",
      "Hi",
      "A much longer prompt that spans several KV blocks of four tokens each, so that the "
      "hand-off moves more than a handful of blocks and every layer's keys and values",
  };
  SplitEqualsBoth(both, prefill, decode, prompts,
                  {.id_prefix = "r", .max_tokens = 12, .seed_base = 1234, .check_finish = true});
  CHECK(prefill.Idle());
  CHECK(decode.Idle());
  CHECK(both.Idle());
}

TEST_CASE("role elastic serves a request alone as role both and reports its load", "[roles]") {
  Instance both(LanguageRole::kBoth), elastic(LanguageRole::kElastic);
  const std::string text = "one two three four five six seven eight nine ten eleven twelve";
  const Output want = RunBoth(both, Request("e0", text, Greedy(12)));
  REQUIRE(want.status.ok());
  const Output got = RunBoth(elastic, Request("e0", text, Greedy(12)));
  CHECK(got.tokens == want.tokens);
  CHECK(got.text == want.text);
  CHECK(got.finish == want.finish);
  CHECK(elastic.Idle());
  const v1::LoadReport load = elastic.core->Load();
  CHECK(load.kv_token_slots_free() ==
        uint64_t{load.kv_blocks_free()} * elastic.core->Capacity().kv_block_size());
  CHECK(load.step_time_us() > 0);
  // A decode instance named: refused, as on role both.
  v1::PrefillRequest handed = Request("e1", text, Greedy(4));
  handed.mutable_decode()->set_instance_id("decode-0");
  const Output refused = RunBoth(elastic, handed);
  CHECK(refused.status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK(elastic.Idle());
  // A span held for a group prefill: its blocks are taken until Abort.
  ElasticCalls* calls = elastic.core->role().elastic_calls();
  REQUIRE(calls != nullptr);
  auto span = calls->HoldSpan("elastic-0", 10);  // blocks of 4
  REQUIRE(span.ok());
  CHECK(span->size() == 3);
  CHECK(calls->HoldSpan("elastic-0", 4).status().code() == absl::StatusCode::kAlreadyExists);
  CHECK(both.core->role().elastic_calls() == nullptr);  // role both holds no spans
  const Deadline d = Deadline::After(absl::Seconds(10));
  while (elastic.core->Load().kv_blocks_free() + 3 != elastic.core->Capacity().kv_blocks_total() &&
         !d.Expired()) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  CHECK(elastic.core->Load().kv_blocks_free() + 3 == elastic.core->Capacity().kv_blocks_total());
  elastic.core->Abort("elastic-0", "the group ended");
  CHECK(elastic.Idle());
}

TEST_CASE("image prompts: prefill + decode instances give role both's tokens and text", "[roles]") {
  Instance both(LanguageRole::kBoth), prefill(LanguageRole::kPrefill),
      decode(LanguageRole::kDecode);
  FakeEncoder encoder(static_cast<uint32_t>(both.core->config().text.hidden_size));
  const std::string kImage = "<|vision_start|><|image_pad|><|vision_end|>";
  struct Case {
    std::string text;
    std::vector<std::array<int, 3>> grids;  // (t, h, w) patches per image
  };
  const std::vector<Case> cases = {
      {kImage + "What is in this picture?", {{1, 4, 6}}},
      {"Compare " + kImage + " with " + kImage + ", please.", {{1, 8, 4}, {1, 2, 2}}},
      {kImage + kImage + "Two images back to back, then a longer question about both of them",
       {{1, 6, 6}, {1, 4, 10}}},
  };
  int n = 0;
  for (int round = 0; round < 2; ++round) {  // the second round hits decode's prefix cache
    for (size_t ci = 0; ci < cases.size(); ++ci) {
      const Case& c = cases[ci];
      for (bool seeded : {false, true}) {
        const std::string id = "img" + std::to_string(n++);
        INFO(id << ": " << c.text);
        mmserve::v1::SamplingParams s = Greedy(12);
        if (seeded) {
          s.set_temperature(0.9f);
          s.set_top_p(0.95f);
          s.set_seed(99 + n);
        }
        // Each run receives its images under its own transfer id.
        auto request = [&](const std::string& tag) {
          v1::PrefillRequest r = Request(id, c.text, s);
          for (size_t k = 0; k < c.grids.size(); ++k) {
            const auto& g = c.grids[k];
            *r.add_images() = encoder.Publish(id + "@" + tag, static_cast<uint32_t>(k), g[0], g[1],
                                              g[2], 1000 * (ci + 1) + k);
          }
          return r;
        };
        const Output want = RunBoth(both, request("both"));
        INFO(want.status.error_message());
        REQUIRE(want.status.ok());
        REQUIRE(want.tokens.size() == 12);
        const Output got = RunSplitJoined(prefill, decode, request("split"));
        CHECK(got.tokens == want.tokens);
        CHECK(got.text == want.text);
        CHECK(got.finish == want.finish);
      }
    }
  }
  CHECK(prefill.Idle());
  CHECK(decode.Idle());
  CHECK(both.Idle());
  const Deadline d = Deadline::After(absl::Seconds(10));
  while (encoder.blocks_used() > 0 && !d.Expired()) absl::SleepFor(absl::Milliseconds(10));
  CHECK(encoder.blocks_used() == 0);
}

// Video chats (tools/gen_video_lm_goldens.py) with embeddings from the
// vision tower on transformers' pixel values, sent by the encoder stand-in as
// PromptImages of kind video: role both and prefill + decode (KvImageSpan
// kinds in the hand-off) give transformers' greedy tokens.
TEST_CASE("video prompts in every role give transformers' greedy tokens", "[roles][video]") {
  Instance both(LanguageRole::kBoth), prefill(LanguageRole::kPrefill),
      decode(LanguageRole::kDecode);
  FakeEncoder encoder(static_cast<uint32_t>(both.core->config().text.hidden_size));
  auto goldens = worker::VideoGoldens::Load("qwen2vl-tiny-mha-tied");
  INFO(goldens.status().ToString());
  REQUIRE(goldens.ok());
  uint64_t seed = 1;
  for (const worker::VideoChat& c : goldens->chats) {
    INFO(c.name);
    mmserve::v1::SamplingParams s = Greedy(static_cast<uint32_t>(c.greedy_ids.size()));
    s.set_ignore_eos(false);
    s.set_min_tokens(static_cast<uint32_t>(c.greedy_ids.size()));  // the goldens mask EOS
    auto request = [&](const std::string& id) {
      v1::PrefillRequest r = Request(id, c.rendered, s);
      for (size_t k = 0; k < c.items.size(); ++k) {
        const worker::VideoGoldenItem& item = c.items[k];
        const bool video = item.grid.kind == model::MediaKind::kVideo;
        *r.add_images() = encoder.Publish(
            id, static_cast<uint32_t>(k), item.grid.grid_t, item.grid.grid_h, item.grid.grid_w,
            seed++, video ? v1::MEDIA_KIND_VIDEO : v1::MEDIA_KIND_IMAGE, &item.rows);
      }
      return r;
    };
    const std::vector<uint32_t> want(c.greedy_ids.begin(), c.greedy_ids.end());
    const Output alone = RunBoth(both, request(c.name + "@both"));
    INFO(alone.status.error_message());
    REQUIRE(alone.status.ok());
    CHECK(alone.tokens == want);
    CHECK(RunSplitJoined(prefill, decode, request(c.name + "@split")).tokens == want);
  }
  // A video part described as an image is refused before any transfer.
  const worker::VideoChat& c = goldens->chats[0];
  v1::PrefillRequest wrong = Request("wrong", c.rendered, Greedy(4));
  const worker::VideoGoldenItem& item = c.items[0];
  *wrong.add_images() = encoder.Publish("wrong", 0, item.grid.grid_t, item.grid.grid_h,
                                        item.grid.grid_w, 5, v1::MEDIA_KIND_IMAGE, &item.rows);
  const Output refused = RunBoth(both, wrong);
  CHECK(refused.status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK(prefill.Idle());
  CHECK(decode.Idle());
  CHECK(both.Idle());
}

// Each decode rank receives only its own KV heads (2 of the model's 4) from
// the prefill instance; decoding then runs on both ranks.
}  // namespace
}  // namespace mmserve::language

namespace mmserve::language {
namespace {

TEST_CASE("a TP prefill core whose shard ranks cannot start fails Create cleanly", "[roles]") {
  metrics::Registry registry;
  transfer::TransferEngineOptions topts;
  topts.instance_id = "prefill-tp";
  topts.layout.block_size = 16;
  topts.layout.num_blocks = 8;
  topts.layout.hidden_size = 64;
  topts.layout.dtype_bytes = sizeof(float);
  auto transfer = transfer::TransferEngine::Create(topts);
  REQUIRE(transfer.ok());
  LanguageCoreOptions o;
  o.instance_id = "prefill-tp";
  o.role.kind = LanguageRole::kPrefill;
  o.engine.model_dir = testing::kModel;
  o.engine.tp_size = 2;
  o.engine.tp_shard_binary = "/nonexistent/tp_shard";  // never started
  auto core = LanguageCore::Create(o, **transfer, registry);
  CHECK(core.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(core.status().message()).find("shard binary") != std::string::npos);
}

}  // namespace
}  // namespace mmserve::language
