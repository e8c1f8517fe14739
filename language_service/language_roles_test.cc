// Roles prefill and decode (issue 12 item 3) through real gRPC servers and
// the UCX KV hand-off, in one process: a decode instance holds each request's
// Decode stream, a prefill instance runs the prompt to its first token, hands
// the KV over (AllocateKv, puts, CommitKv) and ends its stream with
// kv_handed_off. The tokens and text must equal a role-both instance's; the
// rejections carry their codes; nothing leaks on either side.
#include <catch2/catch.hpp>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "common/grpc_server.h"
#include "common/metrics.h"
#include "language_service/language_core.h"
#include "language_service/language_service.h"

namespace mmserve::language {
namespace {

constexpr char kModel[] = "model/testdata/models/qwen2vl-tiny-mha-tied";

// A language instance of one role behind a gRPC server on a free port.
struct Instance {
  explicit Instance(LanguageRole role, absl::Duration commit_timeout = absl::Seconds(10)) {
    const std::string id = role == LanguageRole::kDecode    ? "decode"
                           : role == LanguageRole::kPrefill ? "prefill"
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
    o.role = role;
    o.kv_commit_timeout = commit_timeout;
    o.engine.model_dir = kModel;
    o.engine.block_size = 4;
    o.engine.kv_cache_bytes = 8 << 20;
    o.engine.max_num_seqs = 8;
    o.engine.max_num_batched_tokens = 64;
    o.engine.num_threads = 1;
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
        REQUIRE(want.status.ok());
        Output decoded;
        const Output pre = RunSplit(prefill, decode, Request(id, text, s), &decoded);
        INFO(pre.status.error_message() << " / " << decoded.status.error_message());
        REQUIRE(pre.status.ok());
        REQUIRE(decoded.status.ok());
        CHECK(pre.handed_off);
        CHECK(pre.tokens.size() == 1);
        std::vector<uint32_t> got = pre.tokens;
        got.insert(got.end(), decoded.tokens.begin(), decoded.tokens.end());
        CHECK(got == want.tokens);
        CHECK(pre.text + decoded.text == want.text);
        CHECK(decoded.finish == want.finish);
      }
    }
  }
  CHECK(prefill.Idle());
  CHECK(decode.Idle());
  CHECK(both.Idle());
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
