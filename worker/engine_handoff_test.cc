// Prefill/decode disaggregation inside two engines: a
// prefill engine computes the prompt and samples the first token, its KV
// blocks move into a decode engine's reservation over UCX (transfer/
// kv_handoff: into the decode cache's shared segment, mapped), and the
// decode engine continues. The tokens must equal
// transformers' greedy goldens and a single engine's seeded sampling; the
// moved blocks must equal the prefill side's byte for byte; nothing leaks.
#include <catch2/catch.hpp>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/file.h"
#include "model/image_decode.h"
#include "transfer/kv_handoff.h"
#include "worker/engine.h"
#include "worker/video_goldens.h"

namespace mmserve::worker {
namespace {

using nlohmann::json;

constexpr char kData[] = "model/testdata/";
constexpr int kBlockSize = 4;

// `connector`: the role (null: both); `placement`: where the KV cache lives
// (unset: the engine's own memory).
std::unique_ptr<LlmEngine> MakeEngine(const std::string& model,
                                      std::unique_ptr<KvConnector> connector = nullptr,
                                      KvCachePlacement placement = nullptr) {
  EngineOptions o;
  o.kv_cache_placement = std::move(placement);
  o.model_dir = std::string(kData) + "models/" + model;
  o.block_size = kBlockSize;
  o.max_num_batched_tokens = 32;
  o.max_num_seqs = 8;
  o.kv_cache_bytes = 8 << 20;
  auto e = LlmEngine::Create(o, std::move(connector));
  INFO(e.status().ToString());
  REQUIRE(e.ok());
  return std::move(*e);
}

struct Collected {
  std::vector<int32_t> tokens;
  std::string text;
  FinishReason finish = FinishReason::kNone;
  std::vector<int32_t> kv_blocks;
  HandoffPrompt handoff;
  absl::Status error;
};

StreamCallback Collect(Collected* c) {
  return [c](const StreamEvent& e) {
    c->tokens.insert(c->tokens.end(), e.token_ids.begin(), e.token_ids.end());
    c->text += e.text;
    if (e.finish_reason != FinishReason::kNone) {
      c->finish = e.finish_reason;
      c->kv_blocks = e.kv_blocks;
      c->handoff = e.handoff;
      c->error = e.error;
    }
  };
}

std::unique_ptr<LlmEngine> MakeDecode(const std::string& model,
                                      absl::Duration commit_timeout = absl::InfiniteDuration(),
                                      KvCachePlacement placement = nullptr) {
  return MakeEngine(model,
                    std::make_unique<DecodeKvConnector>(
                        DecodeKvConnector::Options{.commit_timeout = commit_timeout}),
                    std::move(placement));
}

// A decode engine's reservation for a remote prompt.
absl::StatusOr<RemoteKvBlocks> Reserve(LlmEngine& decode, EngineRequest r, StreamCallback cb) {
  RemoteKvBlocks blocks;
  absl::Status s = decode.AddRequest(std::move(r), std::move(cb), &blocks);
  if (!s.ok()) return s;
  return blocks;
}

void RunToEnd(LlmEngine& e) {
  for (int steps = 0; e.has_unfinished(); ++steps) {
    REQUIRE(steps < 5000);
    REQUIRE(e.Step().ok());
  }
}

bool SameBlock(model::KvCache& a, int32_t ba, model::KvCache& b, int32_t bb) {
  const model::KvCacheShape& s = a.shape();
  const int64_t floats = s.block_size * s.num_kv_heads * s.head_dim;
  for (int64_t l = 0; l < s.num_layers; ++l) {
    if (std::memcmp(a.Key(l) + ba * floats, b.Key(l) + bb * floats, floats * 4) != 0) return false;
    if (std::memcmp(a.Value(l) + ba * floats, b.Value(l) + bb * floats, floats * 4) != 0) {
      return false;
    }
  }
  return true;
}

std::unique_ptr<transfer::UcxContext> ShmContext() {
  auto c = transfer::UcxContext::Create(transfer::TransportProfile::kShm);
  REQUIRE(c.ok());
  return std::move(*c);
}

// A prefill engine, a decode engine and the UCX hand-off between them. The
// decode engine runs over a KV cache it does not own, in its receiver's
// shared segment, as role decode's does: the sender maps it and copies in.
struct Pair {
  explicit Pair(const std::string& model)
      : ctx(ShmContext()),
        prefill(MakeEngine(model, std::make_unique<PrefillKvConnector>())),
        decode(MakeDecode(model, absl::InfiniteDuration(),
                          [this](const model::KvCacheShape& shape)
                              -> absl::StatusOr<std::shared_ptr<model::KvCache>> {
                            auto r = transfer::KvHandoffReceiver::CreateWithCache(
                                *ctx, shape, {.name = "decode"});
                            if (!r.ok()) return r.status();
                            rx = std::move(*r);
                            return std::shared_ptr<model::KvCache>(rx, rx->owned_cache());
                          })) {
    REQUIRE(rx != nullptr);
    REQUIRE(&decode->kv_cache() == rx->owned_cache());
    auto t = transfer::KvHandoffSender::Create(*ctx, prefill->kv_cache(), {.name = "prefill"});
    REQUIRE(t.ok());
    tx = std::move(*t);
  }

  // Send into the decode engine's cache, which this side maps.
  absl::StatusOr<uint32_t> Send(const std::vector<int32_t>& src, const std::vector<int32_t>& dst) {
    transfer::KvHandoffPath path = transfer::KvHandoffPath::kRendezvous;
    auto crc = tx->Send(rx->target(), src, dst, Deadline::After(absl::Seconds(10)), 0, &path);
    CHECK(path == transfer::KvHandoffPath::kMapped);
    return crc;
  }

  // What the router and the two services do for one request: reserve on
  // decode, prefill (alone: its blocks are read before the next step), move
  // the blocks not cached on decode, check them, commit. Returns the prefill
  // side's events; the decode side's go to `decoded`.
  Collected Handoff(const std::string& id, const std::vector<int32_t>& prompt,
                    const model::SamplingParams& sampling, Collected* decoded,
                    int* cached_tokens = nullptr) {
    EngineRequest d;
    d.id = id;
    d.prompt_token_ids = prompt;
    d.sampling = sampling;
    auto reserved = Reserve(*decode, std::move(d), Collect(decoded));
    INFO(reserved.status().ToString());
    REQUIRE(reserved.ok());
    if (cached_tokens != nullptr) *cached_tokens = reserved->num_cached_tokens;
    Collected pre;
    EngineRequest p;
    p.id = id;
    p.prompt_token_ids = prompt;
    p.sampling = sampling;
    REQUIRE(prefill->AddRequest(std::move(p), Collect(&pre)).ok());
    RunToEnd(*prefill);
    REQUIRE(pre.finish == FinishReason::kHandoff);
    REQUIRE(pre.tokens.size() == 1);
    const size_t skip = reserved->num_cached_tokens / kBlockSize;
    REQUIRE(pre.kv_blocks.size() == skip + reserved->blocks.size());
    std::vector<int32_t> src(pre.kv_blocks.begin() + skip, pre.kv_blocks.end());
    auto crc = Send(src, reserved->blocks);
    REQUIRE(crc.ok());
    REQUIRE(rx->AwaitLandedWrites().ok());
    CHECK(*crc == transfer::KvBlocksCrc(decode->kv_cache(), reserved->blocks));
    for (size_t i = 0; i < src.size(); ++i) {
      CHECK(SameBlock(prefill->kv_cache(), src[i], decode->kv_cache(), reserved->blocks[i]));
    }
    REQUIRE(decode->CommitRemoteKv(id, pre.tokens[0]).ok());
    REQUIRE(prefill->ReleaseSpan(id).ok());  // the hand-off is over
    return pre;
  }

  // The same for a request with images (`request`):
  // the prefill runs first, and the decode engine reserves the expanded
  // prompt it hands over (HandoffPrompt), as the prefill service does.
  Collected HandoffAfterPrefill(EngineRequest request, Collected* decoded,
                                RemoteKvBlocks* reservation = nullptr) {
    const std::string id = request.id;
    const model::SamplingParams sampling = request.sampling;
    Collected pre;
    REQUIRE(prefill->AddRequest(std::move(request), Collect(&pre)).ok());
    RunToEnd(*prefill);
    REQUIRE(pre.finish == FinishReason::kHandoff);
    REQUIRE(pre.tokens.size() == 1);
    EngineRequest d;
    d.id = id;
    d.prompt_token_ids = pre.handoff.token_ids;
    d.handoff_images = pre.handoff.images;
    d.sampling = sampling;
    auto reserved = Reserve(*decode, std::move(d), Collect(decoded));
    INFO(reserved.status().ToString());
    REQUIRE(reserved.ok());
    if (reservation != nullptr) *reservation = *reserved;
    CHECK(reserved->mrope_position_delta == pre.handoff.mrope_position_delta);
    const size_t skip = reserved->num_cached_tokens / kBlockSize;
    REQUIRE(pre.kv_blocks.size() == skip + reserved->blocks.size());
    std::vector<int32_t> src(pre.kv_blocks.begin() + skip, pre.kv_blocks.end());
    auto crc = Send(src, reserved->blocks);
    REQUIRE(crc.ok());
    REQUIRE(rx->AwaitLandedWrites().ok());
    for (size_t i = 0; i < src.size(); ++i) {
      CHECK(SameBlock(prefill->kv_cache(), src[i], decode->kv_cache(), reserved->blocks[i]));
    }
    REQUIRE(decode->CommitRemoteKv(id, pre.tokens[0]).ok());
    REQUIRE(prefill->ReleaseSpan(id).ok());  // the hand-off is over
    return pre;
  }

  // In this order: the receiver (shared with the decode engine, which
  // holds its cache) goes after both engines, before the context.
  std::unique_ptr<transfer::UcxContext> ctx;
  std::shared_ptr<transfer::KvHandoffReceiver> rx;
  std::unique_ptr<LlmEngine> prefill;
  std::unique_ptr<LlmEngine> decode;
  std::unique_ptr<transfer::KvHandoffSender> tx;
};

model::SamplingParams Greedy(int n) {
  model::SamplingParams p;
  p.temperature = 0;
  p.max_tokens = n;
  p.min_tokens = n;  // the goldens mask EOS for all n tokens
  return p;
}

TEST_CASE("prefill + KV hand-off + decode gives transformers' greedy tokens", "[handoff]") {
  for (const char* name : {"qwen2vl-tiny-mha-tied", "qwen2vl-tiny-gqa2-untied-sharded"}) {
    INFO(name);
    Pair pair(name);
    auto text = ReadFileToString(std::string(kData) + "goldens/" + name + "/lm_golden.json");
    REQUIRE(text.ok());
    const json g = json::parse(*text);
    std::map<std::string, Collected> decoded;
    std::map<std::string, std::vector<int32_t>> want, first;
    for (const json& p : g["prompts"]) {
      if (p["compute_dtype"] != "fp32") continue;
      const std::string id = p["name"];
      want[id] = p["greedy_ids"].get<std::vector<int32_t>>();
      Collected pre =
          pair.Handoff(id, p["input_ids"].get<std::vector<int32_t>>(), Greedy(32), &decoded[id]);
      first[id] = pre.tokens;
    }
    REQUIRE(want.size() >= 7);
    // The decode engine batches all the handed-off requests.
    RunToEnd(*pair.decode);
    for (const auto& [id, tokens] : want) {
      INFO(id);
      std::vector<int32_t> got = first[id];
      got.insert(got.end(), decoded[id].tokens.begin(), decoded[id].tokens.end());
      CHECK(got == tokens);
      CHECK(decoded[id].finish == FinishReason::kLength);
    }
    CHECK(pair.prefill->scheduler().kv_cache().stats().num_used_blocks == 0);
    CHECK(pair.decode->scheduler().kv_cache().stats().num_used_blocks == 0);
  }
}

TEST_CASE("image chats hand off (M-RoPE delta, image spans) and give transformers' tokens",
          "[handoff]") {
  for (const char* name : {"qwen2vl-tiny-mha-tied", "qwen2vl-tiny-gqa2-untied-sharded"}) {
    INFO(name);
    Pair pair(name);
    auto text = ReadFileToString(std::string(kData) + "goldens/" + name + "/mm_golden.json");
    REQUIRE(text.ok());
    const json g = json::parse(*text);
    int chats = 0;
    for (int round = 0; round < 2; ++round) {  // the second round hits decode's prefix cache
      for (const json& c : g["chats"]) {
        if (c["compute_dtype"] != "fp32") continue;
        const std::string id = c["name"].get<std::string>() + "/" + std::to_string(round);
        INFO(id);
        EngineRequest r;
        r.id = id;
        r.prompt = c["rendered"];
        for (const json& img : c["images"]) {
          auto bytes = ReadFileToString(std::string(kData) + "goldens/images/" +
                                        img.get<std::string>() + ".png");
          REQUIRE(bytes.ok());
          auto rgb = model::DecodeImage(*bytes, model::DecodeLimits());
          REQUIRE(rgb.ok());
          r.images.push_back(std::move(*rgb));
        }
        const size_t num_images = r.images.size();
        const auto want = c["greedy_ids"].get<std::vector<int32_t>>();
        r.sampling = Greedy(static_cast<int>(want.size()));
        Collected decoded;
        RemoteKvBlocks reserved;
        Collected pre = pair.HandoffAfterPrefill(std::move(r), &decoded, &reserved);
        CHECK(pre.handoff.images.size() == num_images);
        if (num_images > 0) CHECK(pre.handoff.mrope_position_delta < 0);
        if (round == 1) CHECK(reserved.num_cached_tokens > 0);
        RunToEnd(*pair.decode);
        std::vector<int32_t> got = pre.tokens;
        got.insert(got.end(), decoded.tokens.begin(), decoded.tokens.end());
        CHECK(got == want);
        CHECK(decoded.finish == FinishReason::kLength);
        chats += num_images > 0;
      }
    }
    REQUIRE(chats >= 4);
    CHECK(pair.prefill->scheduler().kv_cache().stats().num_used_blocks == 0);
    CHECK(pair.decode->scheduler().kv_cache().stats().num_used_blocks == 0);
  }
}

TEST_CASE("video chats hand off (video spans keep their kind) and give transformers' tokens",
          "[handoff]") {
  for (const char* name : {"qwen2vl-tiny-mha-tied", "qwen2vl-tiny-gqa2-untied-sharded"}) {
    INFO(name);
    auto g = VideoGoldens::Load(name);
    INFO(g.status().ToString());
    REQUIRE(g.ok());
    Pair pair(name);
    for (int round = 0; round < 2; ++round) {  // the second round hits decode's prefix cache
      for (const VideoChat& c : g->chats) {
        const std::string id = c.name + "/" + std::to_string(round);
        INFO(id);
        Collected decoded;
        RemoteKvBlocks reserved;
        Collected pre = pair.HandoffAfterPrefill(c.Request(id), &decoded, &reserved);
        REQUIRE(pre.handoff.images.size() == c.items.size());
        for (size_t i = 0; i < c.items.size(); ++i) {
          CHECK(pre.handoff.images[i].grid.kind == c.items[i].grid.kind);
          CHECK(pre.handoff.images[i].key == c.items[i].key);
        }
        CHECK(pre.handoff.mrope_position_delta == c.rope_delta);
        CHECK(pre.handoff.token_ids == c.input_ids);
        if (round == 1) CHECK(reserved.num_cached_tokens > 0);
        RunToEnd(*pair.decode);
        std::vector<int32_t> got = pre.tokens;
        got.insert(got.end(), decoded.tokens.begin(), decoded.tokens.end());
        CHECK(got == c.greedy_ids);
        CHECK(decoded.finish == FinishReason::kLength);
      }
    }
    // A video span handed over as an image does not fit the prompt's pads.
    const VideoChat& c = g->chats[0];
    Collected pre, decoded;
    pre = pair.HandoffAfterPrefill(c.Request("kind"), &decoded);
    RunToEnd(*pair.decode);
    EngineRequest d;
    d.id = "kind/decode";
    d.prompt_token_ids = pre.handoff.token_ids;
    d.handoff_images = pre.handoff.images;
    d.handoff_images[0].grid.kind = model::MediaKind::kImage;
    d.sampling = c.Request("").sampling;
    CHECK(Reserve(*pair.decode, std::move(d), Collect(&decoded)).status().code() ==
          absl::StatusCode::kInvalidArgument);
    CHECK(pair.prefill->scheduler().kv_cache().stats().num_used_blocks == 0);
    CHECK(pair.decode->scheduler().kv_cache().stats().num_used_blocks == 0);
  }
}

TEST_CASE("hand-off image spans that disagree with the prompt are refused without a leak",
          "[handoff]") {
  auto decode = MakeDecode("qwen2vl-tiny-mha-tied");
  const int free_before = decode->scheduler().kv_cache().num_free_blocks();
  const int32_t pad = decode->config().tokens.image_pad >= 0
                          ? decode->config().tokens.image_pad
                          : decode->tokenizer().TokenToId("<|image_pad|>");
  REQUIRE(pad >= 0);
  // Two text tokens, a 2x3 run of merged patches (grid 1x4x6), a text token.
  EngineRequest good;
  good.id = "img";
  good.prompt_token_ids = {5, 6, pad, pad, pad, pad, pad, pad, 7};
  good.handoff_images = {{2, model::MediaGrid::FromThw(1, 4, 6), ContentHash{1, 2}}};
  good.sampling = Greedy(4);
  Collected c;
  auto bad = [&](std::function<void(EngineRequest&)> edit) {
    EngineRequest r = good;
    edit(r);
    return Reserve(*decode, std::move(r), Collect(&c)).status().code();
  };
  const auto kInvalid = absl::StatusCode::kInvalidArgument;
  CHECK(bad([](EngineRequest& r) { r.handoff_images[0].offset = 1; }) == kInvalid);
  CHECK(bad([](EngineRequest& r) { r.handoff_images[0].offset = -4; }) == kInvalid);
  CHECK(bad([](EngineRequest& r) {
          r.handoff_images[0].grid = model::MediaGrid::FromThw(1, 4, 8);
        }) == kInvalid);  // a run of 8
  CHECK(bad([](EngineRequest& r) {
          r.handoff_images[0].grid = model::MediaGrid::FromThw(1, 2, 2);
        }) == kInvalid);  // pads left outside the span
  CHECK(bad([](EngineRequest& r) {
          r.handoff_images[0].grid = model::MediaGrid::FromThw(1, 3, 8);
        }) == kInvalid);  // not a multiple of the merge size
  CHECK(bad([](EngineRequest& r) {
          r.handoff_images[0].grid = model::MediaGrid::FromThw(0, 4, 6);
        }) == kInvalid);
  CHECK(bad([](EngineRequest& r) {
          r.handoff_images[0].grid = model::MediaGrid::FromThw(1 << 30, 1 << 30, 1 << 30);
        }) == kInvalid);
  CHECK(bad([](EngineRequest& r) { r.handoff_images.push_back(r.handoff_images[0]); }) ==
        kInvalid);                                                             // overlapping
  CHECK(bad([](EngineRequest& r) { r.handoff_images.clear(); }) == kInvalid);  // pads, no image
  CHECK(bad([](EngineRequest& r) { r.images.push_back(model::RgbImage()); }) == kInvalid);
  CHECK(decode->scheduler().kv_cache().num_free_blocks() == free_before);
  CHECK_FALSE(decode->has_unfinished());
  // A hand-off image in a local prompt would run without its embedding; a
  // remote prompt needs somewhere to return its blocks.
  CHECK(MakeEngine("qwen2vl-tiny-mha-tied")->AddRequest(good, Collect(&c)).code() == kInvalid);
  CHECK(decode->AddRequest(good, Collect(&c)).code() == kInvalid);
  auto ok = Reserve(*decode, good, Collect(&c));
  REQUIRE(ok.ok());
  // Text 0, 1; image t 2, h 2..3, w 2..4; text 5: next position 6 at index 9.
  CHECK(ok->mrope_position_delta == 6 - 9);
  REQUIRE(decode->Abort("img").ok());
  CHECK(decode->scheduler().kv_cache().num_free_blocks() == free_before);
  REQUIRE(decode->scheduler().CheckInvariants().ok());
}

TEST_CASE("a handed-off image request preempted on decode is aborted, not recomputed",
          "[handoff]") {
  // 8 blocks of 4 tokens: a text request (5 + 12 tokens) and an image one
  // (9 + 12) fit alone but not together; the image one, reserved last, is
  // the newest and the preemption victim. Without its embeddings it cannot
  // be recomputed, so the engine ends it with ResourceExhausted.
  auto probe = MakeEngine("qwen2vl-tiny-mha-tied");
  const int64_t block_bytes =
      static_cast<int64_t>(probe->sizing().kv_bytes) / probe->sizing().num_kv_blocks;
  const int32_t pad = probe->config().tokens.image_pad;
  REQUIRE(pad >= 0);
  probe.reset();
  EngineOptions o;
  o.model_dir = std::string(kData) + "models/qwen2vl-tiny-mha-tied";
  o.block_size = kBlockSize;
  o.max_num_seqs = 8;
  o.kv_cache_bytes = 8 * block_bytes;
  auto created = LlmEngine::Create(o, std::make_unique<DecodeKvConnector>());
  REQUIRE(created.ok());
  LlmEngine& decode = **created;
  REQUIRE(decode.sizing().num_kv_blocks == 8);
  Collected text, image;
  EngineRequest t;
  t.id = "text";
  t.prompt_token_ids = {5, 6, 7, 8, 9};
  t.sampling = Greedy(12);
  REQUIRE(Reserve(decode, std::move(t), Collect(&text)).ok());
  EngineRequest i;
  i.id = "image";
  i.prompt_token_ids = {5, 6, pad, pad, pad, pad, pad, pad, 7};
  i.handoff_images = {{2, model::MediaGrid::FromThw(1, 4, 6), ContentHash{1, 2}}};
  i.sampling = Greedy(12);
  REQUIRE(Reserve(decode, std::move(i), Collect(&image)).ok());
  REQUIRE(decode.CommitRemoteKv("text", 11).ok());
  REQUIRE(decode.CommitRemoteKv("image", 12).ok());
  RunToEnd(decode);
  CHECK(image.finish == FinishReason::kAbort);
  CHECK(image.error.code() == absl::StatusCode::kResourceExhausted);
  CHECK(text.finish == FinishReason::kLength);
  CHECK(text.tokens.size() == 11);  // the first came from the prefill side
  CHECK(decode.scheduler().num_preemptions() >= 1);
  CHECK(decode.scheduler().kv_cache().stats().num_used_blocks == 0);
  REQUIRE(decode.scheduler().CheckInvariants().ok());
}

TEST_CASE("seeded sampling and text continue across the hand-off as in one engine", "[handoff]") {
  Pair pair("qwen2vl-tiny-gqa2-untied-sharded");
  auto both = MakeEngine("qwen2vl-tiny-gqa2-untied-sharded");
  auto ids = both->tokenizer().Encode("The quick brown fox jumps over the lazy dog, and then");
  REQUIRE(ids.ok());
  model::SamplingParams s;
  s.temperature = 0.9f;
  s.top_p = 0.95f;
  s.seed = 1234;
  s.max_tokens = 20;
  s.ignore_eos = true;
  Collected one;
  EngineRequest r;
  r.id = "one";
  r.prompt_token_ids = *ids;
  r.sampling = s;
  REQUIRE(both->AddRequest(std::move(r), Collect(&one)).ok());
  RunToEnd(*both);

  Collected decoded;
  Collected pre = pair.Handoff("split", *ids, s, &decoded);
  RunToEnd(*pair.decode);
  std::vector<int32_t> got = pre.tokens;
  got.insert(got.end(), decoded.tokens.begin(), decoded.tokens.end());
  CHECK(got == one.tokens);
  CHECK(pre.text + decoded.text == one.text);
  CHECK(decoded.finish == FinishReason::kLength);
}

TEST_CASE("a decode-side prefix hit moves only the blocks after it", "[handoff]") {
  Pair pair("qwen2vl-tiny-mha-tied");
  std::vector<int32_t> prompt;
  for (int i = 0; i < 23; ++i) prompt.push_back(100 + 7 * i);
  Collected d1, d2;
  int cached1 = -1, cached2 = -1;
  Collected p1 = pair.Handoff("a", prompt, Greedy(8), &d1, &cached1);
  RunToEnd(*pair.decode);
  Collected p2 = pair.Handoff("b", prompt, Greedy(8), &d2, &cached2);
  RunToEnd(*pair.decode);
  CHECK(cached1 == 0);
  CHECK(cached2 == 20);  // 5 full blocks of 4; the last token is always computed
  CHECK(p1.tokens == p2.tokens);
  CHECK(d1.tokens == d2.tokens);
  CHECK(pair.decode->scheduler().kv_cache().stats().num_used_blocks == 0);
}

TEST_CASE("a handed-off prompt's blocks stay held while later prompts run, until released",
          "[handoff]") {
  auto prefill = MakeEngine("qwen2vl-tiny-mha-tied", std::make_unique<PrefillKvConnector>());
  auto used = [&] { return prefill->scheduler().kv_cache().stats().num_used_blocks; };
  Collected a, b, one;
  auto add = [&](const std::string& id, int first, int max_tokens, Collected* c) {
    EngineRequest r;
    r.id = id;
    for (int i = 0; i < 10; ++i) r.prompt_token_ids.push_back(first + 3 * i);
    r.sampling = Greedy(max_tokens);
    REQUIRE(prefill->AddRequest(std::move(r), Collect(c)).ok());
    RunToEnd(*prefill);
  };
  add("a", 100, 8, &a);
  REQUIRE(a.finish == FinishReason::kHandoff);
  CHECK(used() == 3);
  add("b", 400, 8, &b);  // no prefix hit: its own blocks
  REQUIRE(b.finish == FinishReason::kHandoff);
  for (int32_t block : b.kv_blocks) {
    CHECK(std::find(a.kv_blocks.begin(), a.kv_blocks.end(), block) == a.kv_blocks.end());
  }
  add("one", 700, 1, &one);  // its first token ends it: nothing stays held
  CHECK(one.finish == FinishReason::kLength);
  CHECK(used() == 6);
  CHECK(prefill->AddRequest(EngineRequest{.id = "a"}, Collect(&one)).code() ==
        absl::StatusCode::kInvalidArgument);  // its id is in use while held
  REQUIRE(prefill->ReleaseSpan("a").ok());
  REQUIRE(prefill->Abort("b").ok());  // an aborted hand-off frees them as well
  CHECK(used() == 0);
  REQUIRE(prefill->scheduler().CheckInvariants().ok());
}

TEST_CASE("bad reservations and commits are refused; abort frees a reservation once", "[handoff]") {
  auto decode = MakeDecode("qwen2vl-tiny-mha-tied");
  const int free_before = decode->scheduler().kv_cache().num_free_blocks();
  Collected c;
  EngineRequest r;
  r.id = "x";
  r.prompt_token_ids = {5, 6, 7, 8, 9};
  r.sampling = Greedy(4);
  EngineRequest text = r;
  text.prompt_token_ids.clear();
  text.prompt = "hello";
  CHECK(Reserve(*decode, text, Collect(&c)).status().code() == absl::StatusCode::kInvalidArgument);
  EngineRequest huge = r;
  huge.sampling.max_tokens = 1 << 20;
  huge.sampling.min_tokens = 0;
  CHECK(Reserve(*decode, huge, Collect(&c)).status().code() == absl::StatusCode::kInvalidArgument);
  REQUIRE(Reserve(*decode, r, Collect(&c)).ok());
  CHECK(Reserve(*decode, r, Collect(&c)).status().code() ==
        absl::StatusCode::kInvalidArgument);  // duplicate id
  CHECK(decode->CommitRemoteKv("nope", 1).code() == absl::StatusCode::kNotFound);
  CHECK(decode->CommitRemoteKv("x", -3).code() == absl::StatusCode::kInvalidArgument);
  CHECK(decode->scheduler().kv_cache().num_free_blocks() == free_before - 2);
  // The prefill side never committed (died, deadline): abort frees it.
  REQUIRE(decode->Abort("x").ok());
  CHECK(c.finish == FinishReason::kAbort);
  CHECK(decode->Abort("x").code() == absl::StatusCode::kNotFound);
  CHECK(decode->scheduler().kv_cache().num_free_blocks() == free_before);
  REQUIRE(decode->scheduler().CheckInvariants().ok());
}

TEST_CASE("a reservation whose prefill never commits is freed at its deadline", "[handoff]") {
  auto decode = MakeDecode("qwen2vl-tiny-mha-tied", absl::Milliseconds(1000));
  const int free_before = decode->scheduler().kv_cache().num_free_blocks();
  Collected c;
  EngineRequest r;
  r.id = "orphan";
  r.prompt_token_ids = {5, 6, 7, 8, 9, 10, 11, 12, 13};
  r.sampling = Greedy(4);
  REQUIRE(Reserve(*decode, r, Collect(&c)).ok());
  REQUIRE(decode->Step().ok());  // before the deadline (1 s: loaded CI machines): still held
  CHECK(decode->num_pending_commits() == 1);
  CHECK(decode->scheduler().kv_cache().num_free_blocks() == free_before - 3);
  absl::SleepFor(absl::Milliseconds(1100));
  REQUIRE(decode->Step().ok());
  CHECK(c.finish == FinishReason::kAbort);
  CHECK(decode->num_pending_commits() == 0);
  CHECK_FALSE(decode->has_unfinished());
  CHECK(decode->scheduler().kv_cache().num_free_blocks() == free_before);
  // A commit that arrives late is refused, and frees nothing twice.
  CHECK(decode->CommitRemoteKv("orphan", 1).code() == absl::StatusCode::kNotFound);
  CHECK(decode->scheduler().kv_cache().num_free_blocks() == free_before);
  REQUIRE(decode->scheduler().CheckInvariants().ok());
}

}  // namespace
}  // namespace mmserve::worker
