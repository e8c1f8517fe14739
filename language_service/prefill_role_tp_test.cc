// A tensor-parallel prefill instance (two rank processes, each holding 2 of
// the model's 4 KV heads) hands its KV to decode instances of TP 2 (rank r
// -> rank r), 1 (both ranks into the one rank) and 4 (each prefill rank into
// two decode ranks): role both's tokens and text, whole and layer-wise, the
// KV bytes the decode side received are the ones sent, nothing leaks. A
// decode instance that splits another number of KV heads is refused with
// FAILED_PRECONDITION naming both TP sizes, before any write. Over tcp the
// writes of one hand-off are waited for together: three round trips
// whatever the number of pairs. A pair that fails ends the request with no
// CommitKv and every block freed.
#include <atomic>
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "common/grpc_server.h"
#include "language_service/kv_bytes_moved.h"
#include "language_service/roles_testing.h"

namespace mmserve::language {
namespace {

using namespace testing;  // NOLINT: the roles test support

const std::vector<std::string>& Prompts() {
  static const std::vector<std::string> prompts = {
      "The quick brown fox jumps over the lazy dog",
      "Hi",
      "A much longer prompt that spans several KV blocks of four tokens each, so that the "
      "hand-off moves more than a handful of blocks and every layer's keys and values",
  };
  return prompts;
}

// Into each decode TP size in turn: role both's tokens, and the bytes each
// decode instance received are those the prefill instance sent it.
void IntoEachDecodeTp(Instance& both, Instance& prefill, const std::string& name) {
  for (int decode_tp : {2, 1, 4}) {
    INFO(name << " -> decode TP " << decode_tp);
    const transfer::WireBytes sent = KvBytesMoved(prefill.registry, "handoff");
    const double before = sent.sent->value();
    Instance decode(LanguageRole::kDecode, absl::Seconds(10), decode_tp,
                    {.id = absl::StrCat("decode-tp", decode_tp)});
    SplitEqualsBoth(both, prefill, decode, Prompts(),
                    {.id_prefix = absl::StrCat(name, "-", decode_tp, "-"), .max_tokens = 8});
    const transfer::WireBytes received = KvBytesMoved(decode.registry, "handoff");
    CHECK(sent.sent->value() > before);
    CHECK(received.received->value() == sent.sent->value() - before);
    CHECK(decode.Idle());
    CHECK(prefill.Idle());
  }
}

TEST_CASE("a TP=2 prefill instance gives role both's tokens into decode TP 2, 1 and 4",
          "[roles][tp]") {
  Instance both(LanguageRole::kBoth);
  {
    Instance whole(
        LanguageRole::kPrefill, absl::Seconds(10), 2,
        {.id = "prefill-tp2", .adjust_role = [](RoleOptions& o) { o.handoff_layer_group = 0; }});
    IntoEachDecodeTp(both, whole, "whole");
  }
  {
    Instance layers(LanguageRole::kPrefill, absl::Seconds(10), 2,
                    {.id = "prefill-tp2-layers", .adjust_role = [](RoleOptions& o) {
                       o.handoff_layer_group = 1;
                       o.handoff_layerwise_min_tokens = 0;
                     }});
    IntoEachDecodeTp(both, layers, "layers");
  }
  CHECK(both.Idle());
}

// A metric's value from the instance's scrape: `series` is its name with
// any labels, as rendered.
double Scraped(Instance& instance, const std::string& series) {
  const std::string name = "\n" + series + " ";
  const std::string text = instance.registry.Render();
  const size_t at = text.find(name);
  REQUIRE(at != std::string::npos);
  return std::stod(text.substr(at + name.size()));
}

// Over tcp nothing is mapped: every write waits for a landed reply (whole
// heads, 2 -> 2) or a flush (head slices, 2 -> 1 and 2 -> 4). The writes of
// a hand-off are all started before any is waited for, so the hand-off
// waits one round trip for them together, not one per write: AllocateKv,
// the writes, CommitKv = 3 whatever the number of pairs.
TEST_CASE("over tcp, a TP=2 prefill instance waits for a hand-off's writes together",
          "[roles][tp]") {
  Instance both(LanguageRole::kBoth);
  Instance prefill(LanguageRole::kPrefill, absl::Seconds(10), 2,
                   {.id = "prefill-tp2-tcp",
                    .profile = transfer::TransportProfile::kTcp,
                    .adjust_role = [](RoleOptions& o) { o.handoff_layer_group = 0; }});
  struct Into {
    int tp;
    const char* path;  // how each write moved
    int writes;        // pairs per hand-off
  };
  for (const Into into : {Into{2, "rendezvous", 2}, Into{1, "put", 2}, Into{4, "put", 4}}) {
    INFO("decode TP " << into.tp);
    const double handoffs = Scraped(prefill, "mmserve_language_kv_handoff_round_trips_count");
    const double trips = Scraped(prefill, "mmserve_language_kv_handoff_round_trips_sum");
    const std::string series =
        absl::StrCat("mmserve_language_kv_handoff_total{path=\"", into.path, "\"}");
    const double writes = Scraped(prefill, series);
    Instance decode(LanguageRole::kDecode, absl::Seconds(10), into.tp,
                    {.id = absl::StrCat("decode-tcp-tp", into.tp),
                     .profile = transfer::TransportProfile::kTcp});
    SplitEqualsBoth(both, prefill, decode, Prompts(),
                    {.id_prefix = absl::StrCat("tcp-", into.tp, "-"), .max_tokens = 8});
    const double n = Scraped(prefill, "mmserve_language_kv_handoff_round_trips_count") - handoffs;
    CHECK(n == 4 * Prompts().size());  // SplitEqualsBoth: two rounds, greedy and seeded
    CHECK(Scraped(prefill, "mmserve_language_kv_handoff_round_trips_sum") - trips == 3 * n);
    CHECK(Scraped(prefill, series) - writes == into.writes * n);
    CHECK(decode.Idle());
    CHECK(prefill.Idle());
  }
  CHECK(both.Idle());
}

// A decode instance of 3 ranks x 1 KV head (not this model's 4): answers
// AllocateKv only, and counts the calls that came after it.
class ThreeHeadDecode final : public v1::Language::Service {
 public:
  grpc::Status AllocateKv(grpc::ServerContext*, const v1::KvAllocateRequest* request,
                          v1::KvAllocation* a) override {
    a->set_request_id(request->request_id());
    a->set_num_tokens(static_cast<uint32_t>(request->prompt_token_ids_size()));
    for (uint32_t r = 0; r < 3; ++r) {
      v1::KvRankTarget* rank = a->add_ranks();
      rank->mutable_peer()->set_worker_address("unused");
      rank->mutable_layout()->set_tp_rank(r);
      rank->mutable_layout()->set_tp_size(3);
      rank->mutable_layout()->set_num_kv_heads(1);
      rank->mutable_layout()->set_block_size(4);
    }
    return grpc::Status::OK;
  }
  grpc::Status CommitKv(grpc::ServerContext*, const v1::KvCommit*, v1::KvCommitAck*) override {
    ++commits;
    return grpc::Status::OK;
  }
  std::atomic<int> commits{0};
};

TEST_CASE(
    "a TP=2 prefill instance refuses a decode instance that splits other KV heads, naming both "
    "TP sizes",
    "[roles][tp]") {
  Instance prefill(LanguageRole::kPrefill, absl::Seconds(10), 2,
                   {.id = "prefill-tp2-refuse",
                    .adjust_role = [](RoleOptions& o) { o.handoff_layer_group = 0; }});
  ThreeHeadDecode decode;
  auto server = StartGrpcServer("127.0.0.1:0", {&decode});
  REQUIRE(server.ok());
  (*server)->SetServing(true);
  v1::PrefillRequest r = Request("refused", "The quick brown fox", Greedy(4));
  r.mutable_decode()->set_instance_id("decode");
  r.mutable_decode()->set_address("127.0.0.1:" + std::to_string((*server)->port()));
  grpc::ClientContext ctx;
  auto reader = prefill.stub->Prefill(&ctx, r);
  Output out;
  Drain(reader, &out);
  INFO(out.status.error_message());
  CHECK(out.status.error_code() == grpc::StatusCode::FAILED_PRECONDITION);
  CHECK(out.status.error_message().find("tp=2") != std::string::npos);
  CHECK(out.status.error_message().find("tp=3") != std::string::npos);
  CHECK(out.tokens.empty());  // the first token goes only with a committed hand-off
  CHECK(decode.commits == 0);
  CHECK(prefill.Idle());
  (*server)->Shutdown(absl::Seconds(1));
}

// A TP=2 decode instance whose rank 1 is gone: AllocateKv answers rank 0's
// live receiver (shm: the prefill side maps it and copies in) and the
// target of a receiver that no longer exists; CommitKv is counted.
class HalfGoneDecode final : public v1::Language::Service {
 public:
  explicit HalfGoneDecode(const model::KvCacheShape& rank_shape) {
    auto c = transfer::UcxContext::Create(transfer::TransportProfile::kShm);
    REQUIRE(c.ok());
    context_ = std::move(*c);
    auto live = transfer::KvHandoffReceiver::CreateWithCache(*context_, rank_shape, {.name = "d0"});
    REQUIRE(live.ok());
    live_ = std::move(*live);
    auto cache = model::KvCache::Create(rank_shape);
    REQUIRE(cache.ok());
    auto gone = transfer::KvHandoffReceiver::Create(*context_, **cache, {.name = "d1"});
    REQUIRE(gone.ok());
    gone_target_ = (*gone)->target();
  }  // rank 1's worker and registration are gone

  grpc::Status AllocateKv(grpc::ServerContext*, const v1::KvAllocateRequest* request,
                          v1::KvAllocation* a) override {
    a->set_request_id(request->request_id());
    a->set_num_tokens(request->num_tokens());
    for (uint32_t r = 0; r < 2; ++r) {
      const transfer::KvHandoffTarget& t = r == 0 ? live_->target() : gone_target_;
      v1::KvRankTarget* rank = a->add_ranks();
      rank->mutable_peer()->set_worker_address(t.worker_address);
      v1::KvLayout* l = rank->mutable_layout();
      l->set_num_layers(static_cast<uint32_t>(t.shape.num_layers));
      l->set_num_kv_heads(static_cast<uint32_t>(t.shape.num_kv_heads));
      l->set_head_dim(static_cast<uint32_t>(t.shape.head_dim));
      l->set_block_size(static_cast<uint32_t>(t.shape.block_size));
      l->set_num_blocks(static_cast<uint32_t>(t.shape.num_blocks));
      l->set_tp_rank(r);
      l->set_tp_size(2);
      rank->mutable_kv_region()->set_base_address(t.base_address);
      rank->mutable_kv_region()->set_rkey(t.rkey);
      for (uint32_t b = 0; b * t.shape.block_size < request->num_tokens(); ++b) {
        rank->add_block_ids(b);
      }
    }
    return grpc::Status::OK;
  }
  grpc::Status CommitKv(grpc::ServerContext*, const v1::KvCommit*, v1::KvCommitAck*) override {
    ++commits;
    return grpc::Status::OK;
  }
  std::atomic<int> commits{0};

 private:
  std::unique_ptr<transfer::UcxContext> context_;
  std::unique_ptr<transfer::KvHandoffReceiver> live_;
  transfer::KvHandoffTarget gone_target_;
};

// The pair into the gone rank fails: UNAVAILABLE when its endpoint cannot
// be made (as here) or UCX reports the peer lost, DEADLINE_EXCEEDED when a
// write runs out of its deadline (shm reports no peer loss mid-write). The
// pair into the live rank, started first, is finished before the hand-off
// ends. The request ends with no token, no CommitKv goes, and the prefill
// instance frees every block.
TEST_CASE("a TP=2 prefill hand-off one of whose pairs fails ends the request and frees its blocks",
          "[roles][tp]") {
  Instance prefill(LanguageRole::kPrefill, absl::Seconds(10), 2,
                   {.id = "prefill-tp2-half", .adjust_role = [](RoleOptions& o) {
                      o.handoff_layer_group = 0;
                      o.kv_handoff_timeout = absl::Seconds(2);
                    }});
  const model::TextConfig& cfg = prefill.core->config().text;
  HalfGoneDecode decode(
      {cfg.num_hidden_layers, 64, 4, cfg.num_key_value_heads / 2, cfg.head_dim()});
  auto server = StartGrpcServer("127.0.0.1:0", {&decode});
  REQUIRE(server.ok());
  (*server)->SetServing(true);
  v1::PrefillRequest r = Request("half", Prompts()[2], Greedy(4));
  r.mutable_decode()->set_instance_id("decode");
  r.mutable_decode()->set_address("127.0.0.1:" + std::to_string((*server)->port()));
  grpc::ClientContext ctx;
  auto reader = prefill.stub->Prefill(&ctx, r);
  Output out;
  Drain(reader, &out);
  INFO(out.status.error_message());
  CHECK((out.status.error_code() == grpc::StatusCode::UNAVAILABLE ||
         out.status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED));
  CHECK(out.tokens.empty());
  CHECK(decode.commits == 0);
  CHECK(prefill.Idle());
  (*server)->Shutdown(absl::Seconds(1));
}

}  // namespace
}  // namespace mmserve::language
