// Roles prefill and decode (issue 12 item 3) through real gRPC servers and
// the UCX KV hand-off, in one process: a decode instance holds each request's
// Decode stream, a prefill instance runs the prompt to its first token, hands
// the KV over (AllocateKv, puts, CommitKv) and ends its stream with
// kv_handed_off. The decode instance runs one rank or two (TP=2: rank 1 is a
// //worker:tp_shard process receiving its own KV heads over UCX). The tokens
// and text must equal a role-both instance's, for text prompts and for image
// prompts (whose embeddings come from an encoder
// stand-in over UCX); the rejections carry their codes; nothing leaks on
// either side.
#include <array>
#include <catch2/catch.hpp>
#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "common/grpc_server.h"
#include "common/grpc_status.h"
#include "common/metrics.h"
#include "common/server_stream.h"
#include "language_service/language_core.h"
#include "language_service/language_service.h"
#include "proto/encoder.grpc.pb.h"
#include "transfer/transfer_engine.h"
#include "worker/fork_ranks.h"
#include "worker/video_goldens.h"

namespace mmserve::language {
namespace {

constexpr char kModel[] = "model/testdata/models/qwen2vl-tiny-mha-tied";

// A language instance of one role behind a gRPC server on a free port.
struct Instance {
  explicit Instance(LanguageRole role, absl::Duration commit_timeout = absl::Seconds(10),
                    int tp = 1) {
    const std::string id = role == LanguageRole::kDecode    ? "decode"
                           : role == LanguageRole::kPrefill ? "prefill"
                           : role == LanguageRole::kElastic ? "elastic"
                                                            : "both";
    auto config = model::LoadModelConfig(kModel);
    REQUIRE(config.ok());
    transfer::TransferEngineOptions topts;
    topts.instance_id = id;
    topts.layout.block_size = 16;
    topts.layout.num_blocks = 8;
    topts.layout.hidden_size = static_cast<uint32_t>(config->text.hidden_size);
    topts.layout.dtype_bytes = sizeof(float);
    auto t = transfer::TransferEngine::Create(topts);
    REQUIRE(t.ok());
    transfer = std::move(*t);
    LanguageCoreOptions o;
    o.instance_id = id;
    o.role.kind = role;
    o.role.kv_commit_timeout = commit_timeout;
    o.engine.model_dir = kModel;
    o.engine.block_size = 4;
    o.engine.kv_cache_bytes = 8 << 20;
    o.engine.max_num_seqs = 8;
    o.engine.max_num_batched_tokens = 64;
    o.engine.num_threads = 1;
    if (tp > 1) {
      o.engine.tp_size = tp;
      o.engine.tp_shard_binary = "worker/tp_shard";
      o.engine.tp_instance_id = worker::UniqueInstanceId("roles-" + id);
    }
    auto c = LanguageCore::Create(o, *transfer, registry);
    INFO(c.status().ToString());
    REQUIRE(c.ok());
    core = std::move(*c);
    service = std::make_unique<LanguageService>(*core, *transfer, registry);
    auto s = StartGrpcServer("127.0.0.1:0", {service.get()});
    REQUIRE(s.ok());
    server = std::move(*s);
    server->SetServing(true);
    address = "127.0.0.1:" + std::to_string(server->port());
    stub = v1::Language::NewStub(InternalChannel(address));
  }
  ~Instance() {
    core->Shutdown();
    server->Shutdown(absl::Seconds(1));
  }

  // Every KV block free again and no request held (the load report lags
  // the loop by a step).
  bool Idle() {
    const Deadline d = Deadline::After(absl::Seconds(10));
    while (!d.Expired()) {
      if (core->num_requests() == 0 &&
          core->Load().kv_blocks_free() == core->Capacity().kv_blocks_total()) {
        return true;
      }
      absl::SleepFor(absl::Milliseconds(10));
    }
    return false;
  }

  metrics::Registry registry;
  std::unique_ptr<transfer::TransferEngine> transfer;
  std::unique_ptr<LanguageCore> core;
  std::unique_ptr<LanguageService> service;
  std::unique_ptr<GrpcServer> server;
  std::string address;
  std::unique_ptr<v1::Language::Stub> stub;
};

// A stand-in for the encoder service, for image prompts without a vision
// tower: a real TransferEngine (UCX, shm) offers images whose four sections
// the test writes as the encoder service does (deterministic embeddings of
// a chosen grid, fill ids, M-RoPE positions within the image, aux), and a
// gRPC Encoder service answers Connect and CancelTransfer as the encoder's
// does. Each published image serves one transfer.
class FakeEncoder final : public v1::Encoder::CallbackService {
 public:
  explicit FakeEncoder(uint32_t hidden) : hidden_(hidden) {
    transfer::TransferEngineOptions topts;
    topts.instance_id = "encoder";
    topts.layout.block_size = 16;
    topts.layout.num_blocks = 32;
    topts.layout.hidden_size = hidden;
    topts.layout.dtype_bytes = sizeof(float);
    auto t = transfer::TransferEngine::Create(topts);
    REQUIRE(t.ok());
    engine_ = std::move(*t);
    auto s = StartGrpcServer("127.0.0.1:0", {this});
    REQUIRE(s.ok());
    server_ = std::move(*s);
    server_->SetServing(true);
    address = "127.0.0.1:" + std::to_string(server_->port());
  }
  ~FakeEncoder() override { server_->Shutdown(absl::Seconds(1)); }

  // Offers image `index` of transfer `transfer_id`: a grid of t x h x w
  // patches whose embedding rows derive from `seed`, or are `rows` when
  // given. Returns its PromptImage (of `kind`).
  v1::PromptImage Publish(const std::string& transfer_id, uint32_t index, int t, int h, int w,
                          uint64_t seed, v1::MediaKind kind = v1::MEDIA_KIND_IMAGE,
                          const std::vector<float>* rows = nullptr) {
    const model::ImageGrid grid = model::ImageGrid::FromThw(t, h, w);
    const uint32_t n = static_cast<uint32_t>(grid.num_tokens());
    auto blocks = engine_->allocator().Alloc(n, transfer_id);
    REQUIRE(blocks.ok());
    transfer::EmbeddingBuffer& buffer = engine_->buffer();
    const transfer::ChunkRanges r = buffer.layout().ChunkInfo(*blocks, 0, n);
    uint8_t* base = buffer.data();
    auto* emb = reinterpret_cast<float*>(base + r[transfer::kEmbedding].offset);
    for (size_t i = 0; i < size_t{n} * hidden_; ++i) {
      emb[i] = rows != nullptr
                   ? (*rows)[i]
                   : 0.5f * static_cast<float>(std::sin(0.37 * static_cast<double>(i) + seed));
    }
    const int cols = w / 2, per_t = (h / 2) * cols;
    auto* fill = reinterpret_cast<int32_t*>(base + r[transfer::kFillId].offset);
    auto* mrope = reinterpret_cast<int32_t*>(base + r[transfer::kMrope].offset);
    auto* aux = reinterpret_cast<transfer::AuxRecord*>(base + r[transfer::kAux].offset);
    for (uint32_t k = 0; k < n; ++k) {
      const int i = static_cast<int>(k);
      fill[k] = static_cast<int32_t>(seed & 0x7fffffff);
      mrope[3 * k] = i / per_t;
      mrope[3 * k + 1] = (i % per_t) / cols;
      mrope[3 * k + 2] = i % cols;
      aux[k] = {static_cast<int32_t>(n), static_cast<int32_t>(index), 0};
    }
    engine_->Publish({.request_id = transfer_id, .image_index = index, .blocks = *blocks},
                     [](absl::Status) {});
    v1::PromptImage p;
    p.set_image_index(index);
    p.mutable_content_hash()->set_high(seed);
    p.mutable_content_hash()->set_low(seed * 31 + 7);
    p.set_num_tokens(n);
    p.set_grid_t(static_cast<uint32_t>(t));
    p.set_grid_h(static_cast<uint32_t>(h));
    p.set_grid_w(static_cast<uint32_t>(w));
    p.set_encoder_id("encoder");
    p.set_encoder_address(address);
    p.set_transfer_id(transfer_id);
    p.set_kind(kind);
    return p;
  }

  grpc::ServerUnaryReactor* Connect(grpc::CallbackServerContext* ctx,
                                    const v1::ConnectRequest* request,
                                    v1::ConnectResponse* response) override {
    absl::Status s = engine_->Connect(*request);
    if (s.ok()) {
      response->set_instance_id("encoder");
      *response->mutable_ucx() = engine_->local_info().ucx();
      *response->mutable_embedding_buffer() = engine_->local_info().embedding_buffer();
    }
    return FinishUnary(ctx, ToGrpcStatus(s));
  }
  grpc::ServerUnaryReactor* CancelTransfer(grpc::CallbackServerContext* ctx,
                                           const v1::EmbeddingTransferCancel*,
                                           v1::TransferAck* response) override {
    response->set_accepted(true);
    return FinishUnary(ctx, grpc::Status::OK);
  }

  // Blocks still lent to transfers.
  uint32_t blocks_used() {
    return engine_->allocator().num_blocks() - engine_->allocator().free_blocks();
  }

  std::string address;

 private:
  const uint32_t hidden_;
  std::unique_ptr<transfer::TransferEngine> engine_;
  std::unique_ptr<GrpcServer> server_;
};

struct Output {
  std::vector<uint32_t> tokens;
  std::string text;
  bool handed_off = false;
  mmserve::v1::FinishReason finish = mmserve::v1::FINISH_REASON_UNSPECIFIED;
  grpc::Status status;
};

template <typename Reader>
void Drain(Reader& reader, Output* out) {
  v1::TokenBatch b;
  while (reader->Read(&b)) {
    out->tokens.insert(out->tokens.end(), b.token_ids().begin(), b.token_ids().end());
    out->text += b.text();
    out->handed_off |= b.kv_handed_off();
    if (b.finish_reason() != mmserve::v1::FINISH_REASON_UNSPECIFIED)
      out->finish = b.finish_reason();
  }
  out->status = reader->Finish();
}

v1::PrefillRequest Request(const std::string& id, const std::string& text,
                           const mmserve::v1::SamplingParams& sampling) {
  v1::PrefillRequest r;
  r.set_request_id(id);
  r.mutable_raw()->set_text(text);
  *r.mutable_sampling() = sampling;
  return r;
}

Output RunBoth(Instance& both, const v1::PrefillRequest& request) {
  grpc::ClientContext ctx;
  auto reader = both.stub->Prefill(&ctx, request);
  Output out;
  Drain(reader, &out);
  return out;
}

// What the router does for one request: open the Decode stream, wait until
// the decode instance holds it, then Prefill naming it. Returns the prefill
// stream's output; the decode stream's goes to `decoded`.
Output RunSplit(Instance& prefill, Instance& decode, v1::PrefillRequest request, Output* decoded) {
  v1::DecodeRequest d;
  d.set_request_id(request.request_id());
  *d.mutable_sampling() = request.sampling();
  const size_t held = decode.core->num_requests();
  grpc::ClientContext dctx;
  auto dreader = decode.stub->Decode(&dctx, d);
  const Deadline registered = Deadline::After(absl::Seconds(10));
  while (decode.core->num_requests() == held && !registered.Expired()) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  request.mutable_decode()->set_instance_id("decode");
  request.mutable_decode()->set_address(decode.address);
  Output pre;
  grpc::ClientContext pctx;
  auto preader = prefill.stub->Prefill(&pctx, request);
  Drain(preader, &pre);
  if (!pre.status.ok()) dctx.TryCancel();
  Drain(dreader, decoded);
  return pre;
}

// RunSplit joined: prefill's tokens and text then decode's, decode's finish,
// once both streams ended well and the prefill stream handed the KV off
// after one token.
Output RunSplitJoined(Instance& prefill, Instance& decode, v1::PrefillRequest request) {
  Output decoded;
  Output pre = RunSplit(prefill, decode, std::move(request), &decoded);
  INFO(pre.status.error_message() << " / " << decoded.status.error_message());
  REQUIRE(pre.status.ok());
  REQUIRE(decoded.status.ok());
  CHECK(pre.handed_off);
  CHECK(pre.tokens.size() == 1);
  pre.tokens.insert(pre.tokens.end(), decoded.tokens.begin(), decoded.tokens.end());
  pre.text += decoded.text;
  pre.finish = decoded.finish;
  return pre;
}

mmserve::v1::SamplingParams Greedy(uint32_t n) {
  mmserve::v1::SamplingParams s;
  s.set_temperature(0);
  s.set_max_tokens(n);
  s.set_ignore_eos(true);
  return s;
}

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
  int n = 0;
  for (int round = 0; round < 2; ++round) {  // the second round hits decode's prefix cache
    for (const std::string& text : prompts) {
      for (bool seeded : {false, true}) {
        const std::string id = "r" + std::to_string(n++);
        INFO(id << ": " << text);
        mmserve::v1::SamplingParams s = Greedy(12);
        if (seeded) {
          s.set_temperature(0.9f);
          s.set_top_p(0.95f);
          s.set_seed(1234 + n);
        }
        const Output want = RunBoth(both, Request(id, text, s));
        INFO(want.status.error_message());
        REQUIRE(want.status.ok());
        const Output got = RunSplitJoined(prefill, decode, Request(id, text, s));
        CHECK(got.tokens == want.tokens);
        CHECK(got.text == want.text);
        CHECK(got.finish == want.finish);
      }
    }
  }
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
  auto span = elastic.core->HoldSpan("esp-0", 10);  // blocks of 4
  REQUIRE(span.ok());
  CHECK(span->size() == 3);
  CHECK(elastic.core->HoldSpan("esp-0", 4).status().code() == absl::StatusCode::kAlreadyExists);
  CHECK(both.core->HoldSpan("esp-0", 4).status().code() == absl::StatusCode::kFailedPrecondition);
  const Deadline d = Deadline::After(absl::Seconds(10));
  while (elastic.core->Load().kv_blocks_free() + 3 != elastic.core->Capacity().kv_blocks_total() &&
         !d.Expired()) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  CHECK(elastic.core->Load().kv_blocks_free() + 3 == elastic.core->Capacity().kv_blocks_total());
  elastic.core->Abort("esp-0", "the group ended");
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
TEST_CASE("prefill + a TP=2 decode instance give role both's tokens and text", "[roles][tp]") {
  Instance both(LanguageRole::kBoth), prefill(LanguageRole::kPrefill),
      decode(LanguageRole::kDecode, absl::Seconds(10), 2);
  const std::vector<std::string> prompts = {
      "The quick brown fox jumps over the lazy dog",
      "Hi",
      "A much longer prompt that spans several KV blocks of four tokens each, so that the "
      "hand-off moves more than a handful of blocks and every layer's keys and values",
  };
  int n = 0;
  for (int round = 0; round < 2; ++round) {  // the second round hits decode's prefix cache
    for (const std::string& text : prompts) {
      for (bool seeded : {false, true}) {
        const std::string id = "t" + std::to_string(n++);
        INFO(id << ": " << text);
        mmserve::v1::SamplingParams s = Greedy(10);
        if (seeded) {
          s.set_temperature(0.9f);
          s.set_top_p(0.95f);
          s.set_seed(77 + n);
        }
        const Output want = RunBoth(both, Request(id, text, s));
        INFO(want.status.error_message());
        REQUIRE(want.status.ok());
        const Output got = RunSplitJoined(prefill, decode, Request(id, text, s));
        CHECK(got.tokens == want.tokens);
        CHECK(got.text == want.text);
      }
    }
  }
  SECTION("AllocateKv names both ranks; a commit needs a CRC per rank, each checked") {
    v1::DecodeRequest d;
    d.set_request_id("crc2");
    *d.mutable_sampling() = Greedy(4);
    grpc::ClientContext dctx;
    auto reader = decode.stub->Decode(&dctx, d);
    const Deadline registered = Deadline::After(absl::Seconds(10));
    while (decode.core->num_requests() == 0 && !registered.Expired()) {
      absl::SleepFor(absl::Milliseconds(1));
    }
    v1::KvAllocateRequest alloc;
    alloc.set_request_id("crc2");
    for (uint32_t t : {5, 6, 7, 8, 9}) alloc.add_prompt_token_ids(t);
    grpc::ClientContext c1, c2, c3;
    v1::KvAllocation a;
    REQUIRE(decode.stub->AllocateKv(&c1, alloc, &a).ok());
    REQUIRE(a.ranks_size() == 2);
    for (int i = 0; i < 2; ++i) {
      CHECK(a.ranks(i).layout().tp_rank() == static_cast<uint32_t>(i));
      CHECK(a.ranks(i).layout().tp_size() == 2);
      CHECK(a.ranks(i).layout().num_kv_heads() == 2);
      CHECK(a.ranks(i).block_ids_size() == 2);
    }
    CHECK(a.ranks(0).peer().worker_address() != a.ranks(1).peer().worker_address());
    v1::KvCommit commit;
    commit.set_request_id("crc2");
    commit.set_first_token_id(7);
    commit.add_rank_crc32c(0);
    v1::KvCommitAck ack;
    CHECK(decode.stub->CommitKv(&c2, commit, &ack).error_code() ==
          grpc::StatusCode::INVALID_ARGUMENT);
    commit.add_rank_crc32c(0xdeadbeef);
    CHECK(decode.stub->CommitKv(&c3, commit, &ack).error_code() == grpc::StatusCode::DATA_LOSS);
    Output out;
    Drain(reader, &out);
    CHECK(out.status.error_code() == grpc::StatusCode::DATA_LOSS);
  }
  CHECK(prefill.Idle());
  CHECK(decode.Idle());
  CHECK(both.Idle());
}

// A transfer engine with a small receive buffer, for a core that never
// receives an image.
std::unique_ptr<transfer::TransferEngine> SmallTransfer(const std::string& id) {
  transfer::TransferEngineOptions topts;
  topts.instance_id = id;
  topts.layout.block_size = 16;
  topts.layout.num_blocks = 8;
  topts.layout.hidden_size = 64;
  topts.layout.dtype_bytes = sizeof(float);
  auto t = transfer::TransferEngine::Create(topts);
  REQUIRE(t.ok());
  return *std::move(t);
}

TEST_CASE("role prefill refuses tensor parallelism with UNIMPLEMENTED", "[roles][tp]") {
  metrics::Registry registry;
  auto t = SmallTransfer("prefill-tp");
  LanguageCoreOptions o;
  o.instance_id = "prefill-tp";
  o.role.kind = LanguageRole::kPrefill;
  o.engine.model_dir = kModel;
  o.engine.tp_size = 2;
  o.engine.tp_shard_binary = "worker/tp_shard";
  auto c = LanguageCore::Create(o, *t, registry);
  CHECK(c.status().code() == absl::StatusCode::kUnimplemented);
}

TEST_CASE("a core whose engine cannot load fails Create cleanly, in every role", "[roles]") {
  for (const LanguageRole role :
       {LanguageRole::kBoth, LanguageRole::kPrefill, LanguageRole::kDecode}) {
    metrics::Registry registry;
    auto t = SmallTransfer("no-model");
    LanguageCoreOptions o;
    o.instance_id = "no-model";
    o.role.kind = role;
    o.engine.model_dir = "model/testdata/models/no-such-model";
    auto c = LanguageCore::Create(o, *t, registry);
    CHECK(!c.ok());
  }
}

TEST_CASE("hand-off rejections carry their codes and leak nothing", "[roles]") {
  Instance prefill(LanguageRole::kPrefill), decode(LanguageRole::kDecode, absl::Seconds(1));
  Instance both(LanguageRole::kBoth);
  v1::KvAllocateRequest alloc;
  alloc.set_request_id("nobody");
  alloc.add_prompt_token_ids(5);
  alloc.add_prompt_token_ids(6);
  SECTION("role both refuses the decode RPCs") {
    grpc::ClientContext c1, c2;
    v1::KvAllocation a;
    CHECK(both.stub->AllocateKv(&c1, alloc, &a).error_code() == grpc::StatusCode::UNIMPLEMENTED);
    v1::DecodeRequest d;
    d.set_request_id("x");
    auto reader = both.stub->Decode(&c2, d);
    Output out;
    Drain(reader, &out);
    CHECK(out.status.error_code() == grpc::StatusCode::UNIMPLEMENTED);
  }
  SECTION("AllocateKv without an open Decode call") {
    grpc::ClientContext c;
    v1::KvAllocation a;
    CHECK(decode.stub->AllocateKv(&c, alloc, &a).error_code() ==
          grpc::StatusCode::FAILED_PRECONDITION);
  }
  SECTION("role prefill needs a decode target; role decode takes no Prefill") {
    Output out = RunBoth(prefill, Request("p", "hello", Greedy(4)));
    CHECK(out.status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
    out = RunBoth(decode, Request("d", "hello", Greedy(4)));
    CHECK(out.status.error_code() == grpc::StatusCode::FAILED_PRECONDITION);
  }
  SECTION("a commit with the wrong CRC ends the decode stream with DATA_LOSS") {
    v1::DecodeRequest d;
    d.set_request_id("crc");
    *d.mutable_sampling() = Greedy(4);
    grpc::ClientContext dctx;
    auto reader = decode.stub->Decode(&dctx, d);
    const Deadline registered = Deadline::After(absl::Seconds(10));
    while (decode.core->num_requests() == 0 && !registered.Expired()) {
      absl::SleepFor(absl::Milliseconds(1));
    }
    alloc.set_request_id("crc");
    grpc::ClientContext c1, c2;
    v1::KvAllocation a;
    REQUIRE(decode.stub->AllocateKv(&c1, alloc, &a).ok());
    REQUIRE(a.ranks_size() == 1);
    CHECK(a.ranks(0).block_ids_size() == 1);
    v1::KvCommit commit;
    commit.set_request_id("crc");
    commit.set_first_token_id(7);
    commit.add_rank_crc32c(0xdeadbeef);
    v1::KvCommitAck ack;
    CHECK(decode.stub->CommitKv(&c2, commit, &ack).error_code() == grpc::StatusCode::DATA_LOSS);
    Output out;
    Drain(reader, &out);
    CHECK(out.status.error_code() == grpc::StatusCode::DATA_LOSS);
  }
  SECTION("image spans and M-RoPE deltas that disagree are INVALID_ARGUMENT") {
    const int32_t pad = decode.core->config().tokens.image_pad;
    REQUIRE(pad >= 0);
    v1::DecodeRequest d;
    d.set_request_id("img");
    *d.mutable_sampling() = Greedy(4);
    grpc::ClientContext dctx;
    auto reader = decode.stub->Decode(&dctx, d);
    const Deadline registered = Deadline::After(absl::Seconds(10));
    while (decode.core->num_requests() == 0 && !registered.Expired()) {
      absl::SleepFor(absl::Milliseconds(1));
    }
    // Two text tokens, a grid of 1x4x6 patches (6 merged tokens), one more.
    v1::KvAllocateRequest img;
    img.set_request_id("img");
    for (int32_t t : {5, 6, pad, pad, pad, pad, pad, pad, 7}) {
      img.add_prompt_token_ids(static_cast<uint32_t>(t));
    }
    v1::KvImageSpan* span = img.add_images();
    span->set_offset(2);
    span->set_grid_t(1);
    span->set_grid_h(4);
    span->set_grid_w(6);
    span->mutable_content_hash()->set_low(42);
    img.set_mrope_position_delta(-3);  // next position 6 at index 9
    auto allocate = [&](const v1::KvAllocateRequest& r) {
      grpc::ClientContext c;
      v1::KvAllocation a;
      return decode.stub->AllocateKv(&c, r, &a).error_code();
    };
    for (auto edit : std::vector<std::function<void(v1::KvAllocateRequest&)>>{
             [](v1::KvAllocateRequest& r) { r.mutable_images(0)->set_offset(3); },
             [](v1::KvAllocateRequest& r) { r.mutable_images(0)->set_offset(1u << 31); },
             [](v1::KvAllocateRequest& r) { r.mutable_images(0)->set_grid_w(8); },
             [](v1::KvAllocateRequest& r) { r.mutable_images(0)->set_grid_h(0); },
             [](v1::KvAllocateRequest& r) { r.mutable_images(0)->set_grid_t(0xffffffffu); },
             [](v1::KvAllocateRequest& r) { r.clear_images(); },
         }) {
      v1::KvAllocateRequest bad = img;
      edit(bad);
      CHECK(allocate(bad) == grpc::StatusCode::INVALID_ARGUMENT);
    }
    CHECK(decode.core->num_requests() == 1);  // still registered, nothing reserved
    SECTION("at AllocateKv the request ends") {
      v1::KvAllocateRequest bad = img;
      bad.set_mrope_position_delta(0);
      CHECK(allocate(bad) == grpc::StatusCode::INVALID_ARGUMENT);
    }
    SECTION("at CommitKv the request ends") {
      CHECK(allocate(img) == grpc::StatusCode::OK);
      v1::KvCommit commit;
      commit.set_request_id("img");
      commit.set_first_token_id(7);
      commit.add_rank_crc32c(0);
      commit.set_mrope_position_delta(-2);
      grpc::ClientContext c;
      v1::KvCommitAck ack;
      CHECK(decode.stub->CommitKv(&c, commit, &ack).error_code() ==
            grpc::StatusCode::INVALID_ARGUMENT);
    }
    Output out;
    Drain(reader, &out);
    CHECK(out.status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  }
  SECTION("a reservation never committed ends at its deadline") {
    v1::DecodeRequest d;
    d.set_request_id("late");
    *d.mutable_sampling() = Greedy(4);
    grpc::ClientContext dctx;
    auto reader = decode.stub->Decode(&dctx, d);
    const Deadline registered = Deadline::After(absl::Seconds(10));
    while (decode.core->num_requests() == 0 && !registered.Expired()) {
      absl::SleepFor(absl::Milliseconds(1));
    }
    alloc.set_request_id("late");
    grpc::ClientContext c1;
    v1::KvAllocation a;
    const grpc::Status allocated = decode.stub->AllocateKv(&c1, alloc, &a);
    INFO(allocated.error_message());
    REQUIRE(allocated.ok());
    Output out;
    Drain(reader, &out);
    CHECK(out.status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED);
  }
  SECTION("a decode instance that is gone: the prefill stream ends UNAVAILABLE") {
    v1::PrefillRequest r = Request("gone", "hello there", Greedy(4));
    r.mutable_decode()->set_instance_id("decode-gone");
    r.mutable_decode()->set_address("127.0.0.1:1");
    Output out = RunBoth(prefill, r);
    CHECK(out.status.error_code() == grpc::StatusCode::UNAVAILABLE);
    CHECK(out.tokens.size() <= 1);
  }
  CHECK(prefill.Idle());
  CHECK(decode.Idle());
  CHECK(both.Idle());
}

}  // namespace
}  // namespace mmserve::language
