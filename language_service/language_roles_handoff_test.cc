// Roles prefill and decode, continued: a TP=2 decode instance (and the KV
// bytes its hand-offs moved), a core that cannot load, and the hand-off's
// rejections with their codes and no leaks (TP prefill:
// prefill_role_tp_test.cc).
#include <catch2/catch.hpp>
#include <cmath>

#include "language_service/kv_bytes_moved.h"
#include "language_service/roles_testing.h"

namespace mmserve::language {
namespace {

using namespace testing;  // NOLINT: the roles test support

TEST_CASE("prefill + a TP=2 decode instance give role both's tokens and text", "[roles][tp]") {
  Instance both(LanguageRole::kBoth), prefill(LanguageRole::kPrefill),
      decode(LanguageRole::kDecode, absl::Seconds(10), 2);
  const std::vector<std::string> prompts = {
      "The quick brown fox jumps over the lazy dog",
      "Hi",
      "A much longer prompt that spans several KV blocks of four tokens each, so that the "
      "hand-off moves more than a handful of blocks and every layer's keys and values",
  };
  SplitEqualsBoth(both, prefill, decode, prompts,
                  {.id_prefix = "t", .max_tokens = 10, .seed_base = 77});
  // The hand-offs' KV bytes: what prefill sent, the decode instance's two
  // ranks received (each its heads), whole blocks of every layer's K and V.
  const model::TextConfig& cfg = prefill.core->config().text;
  const double block = 2.0 * cfg.num_hidden_layers * 4 * cfg.num_key_value_heads * cfg.head_dim() *
                       sizeof(float);  // roles_testing's 4-token blocks
  const transfer::WireBytes sent = KvBytesMoved(prefill.registry, "handoff");
  const transfer::WireBytes received = KvBytesMoved(decode.registry, "handoff");
  CHECK(sent.sent->value() >= 3 * block);
  CHECK(std::fmod(sent.sent->value(), block) == 0);
  CHECK(received.received->value() == sent.sent->value());
  CHECK(sent.received->value() == 0);
  CHECK(received.sent->value() == 0);
  const transfer::WireBytes none = KvBytesMoved(both.registry, "handoff");
  CHECK(none.sent->value() + none.received->value() == 0);
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
