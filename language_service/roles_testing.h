// Test support for the language roles tests: language instances of each
// role behind gRPC servers on free ports, an encoder stand-in over UCX, and
// helpers that run a request through role both or through prefill + decode.
// Test-only; each test binary includes it once.
#ifndef MMSERVE_LANGUAGE_SERVICE_ROLES_TESTING_H_
#define MMSERVE_LANGUAGE_SERVICE_ROLES_TESTING_H_

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

namespace mmserve::language::testing {

constexpr char kModel[] = "model/testdata/models/qwen2vl-tiny-mha-tied";

// What an instance may change beside its role (elastic tests: several elastic
// instances, each with its own id, UCX profile and KV pool).
struct InstanceOptions {
  std::string id;  // empty: the role's name
  transfer::TransportProfile profile = transfer::TransportProfile::kShm;
  int64_t kv_cache_bytes = 8 << 20;
  // Changes to the role's options (the layer-wise hand-off's, test delays).
  std::function<void(RoleOptions&)> adjust_role;
};

// A language instance of one role behind a gRPC server on a free port.
struct Instance {
  explicit Instance(LanguageRole role, absl::Duration commit_timeout = absl::Seconds(10),
                    int tp = 1, const InstanceOptions& io = {}) {
    const std::string id = !io.id.empty()                   ? io.id
                           : role == LanguageRole::kDecode  ? "decode"
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
    o.role.kv_profile = io.profile;
    if (io.adjust_role) io.adjust_role(o.role);
    o.engine.model_dir = kModel;
    o.engine.block_size = 4;
    o.engine.kv_cache_bytes = io.kv_cache_bytes;
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
    const model::MediaGrid grid = model::MediaGrid::FromThw(t, h, w);
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
inline void Drain(Reader& reader, Output* out) {
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

inline Output RunBoth(Instance& both, const v1::PrefillRequest& request) {
  grpc::ClientContext ctx;
  auto reader = both.stub->Prefill(&ctx, request);
  Output out;
  Drain(reader, &out);
  return out;
}

// What the router does for one request: open the Decode stream, wait until
// the decode instance holds it, then Prefill naming it. Returns the prefill
// stream's output; the decode stream's goes to `decoded`.
inline Output RunSplit(Instance& prefill, Instance& decode, v1::PrefillRequest request,
                       Output* decoded) {
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
inline Output RunSplitJoined(Instance& prefill, Instance& decode, v1::PrefillRequest request) {
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

inline mmserve::v1::SamplingParams Greedy(uint32_t n) {
  mmserve::v1::SamplingParams s;
  s.set_temperature(0);
  s.set_max_tokens(n);
  s.set_ignore_eos(true);
  return s;
}

// Options of SplitEqualsBoth.
struct SplitCheck {
  std::string id_prefix;  // request ids are id_prefix + a counter
  uint32_t max_tokens = 12;
  uint64_t seed_base = 1234;  // seeded requests use seed_base + the counter
  bool check_finish = false;  // also compare the finish reasons
};

// Each prompt, greedy and seeded, in two rounds (the second hits decode's
// prefix cache): prefill + decode give role both's tokens and text.
inline void SplitEqualsBoth(Instance& both, Instance& prefill, Instance& decode,
                            const std::vector<std::string>& prompts, const SplitCheck& check) {
  int n = 0;
  for (int round = 0; round < 2; ++round) {
    for (const std::string& text : prompts) {
      for (bool seeded : {false, true}) {
        const std::string id = check.id_prefix + std::to_string(n++);
        INFO(id << ": " << text);
        mmserve::v1::SamplingParams s = Greedy(check.max_tokens);
        if (seeded) {
          s.set_temperature(0.9f);
          s.set_top_p(0.95f);
          s.set_seed(check.seed_base + n);
        }
        const Output want = RunBoth(both, Request(id, text, s));
        INFO(want.status.error_message());
        REQUIRE(want.status.ok());
        const Output got = RunSplitJoined(prefill, decode, Request(id, text, s));
        CHECK(got.tokens == want.tokens);
        CHECK(got.text == want.text);
        if (check.check_finish) CHECK(got.finish == want.finish);
      }
    }
  }
}

}  // namespace mmserve::language::testing

#endif  // MMSERVE_LANGUAGE_SERVICE_ROLES_TESTING_H_
