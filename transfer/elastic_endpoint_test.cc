// The elastic endpoint blob (round trip, every malformed form refused) and two
// ElasticInstances serving groups one after another over their own boards: the
// K/V exchange with Join and the first-token notice, and span queries
// through a lane, shm and tcp.
#include "transfer/elastic_endpoint.h"

#include <catch2/catch.hpp>
#include <string>
#include <thread>
#include <vector>

#include "transfer/elastic_kv_exchange.h"

namespace mmserve::transfer {
namespace {

ElasticEndpoint Sample() {
  return {.max_prompt_tokens = 4096,
          .kv_width = 32,
          .max_members = 8,
          .process = {.boot_id = "boot", .pid_namespace = 7, .pid = 42, .start_ticks = 99},
          .exchange = {"addr-x", "rkey-x", 0x1000},
          .span_inbox = {"addr-in", "rkey-in", 0x2000},
          .span_reply = {"addr-out", "rkey-out", 0x3000}};
}

TEST_CASE("an elastic endpoint round-trips through its blob", "[elastic]") {
  const ElasticEndpoint e = Sample();
  auto back = DecodeElasticEndpoint(EncodeElasticEndpoint(e));
  REQUIRE(back.ok());
  CHECK(back->max_prompt_tokens == 4096);
  CHECK(back->kv_width == 32);
  CHECK(back->max_members == 8);
  CHECK(back->exchange.worker_address == "addr-x");
  CHECK(back->span_inbox.rkey == "rkey-in");
  CHECK(back->span_reply.base_address == 0x3000);
  // The process, also on each board (what a waiting peer checks).
  CHECK(back->process == e.process);
  CHECK(back->exchange.process == e.process);
  CHECK(back->span_inbox.process == e.process);
  CHECK(back->span_reply.process == e.process);
  ElasticEndpoint unknown = Sample();
  unknown.process = {};
  auto none = DecodeElasticEndpoint(EncodeElasticEndpoint(unknown));
  REQUIRE(none.ok());
  CHECK(!none->exchange.process.known());
}

TEST_CASE("a malformed elastic endpoint is InvalidArgument", "[elastic]") {
  const std::string blob = EncodeElasticEndpoint(Sample());
  for (size_t n = 0; n < blob.size(); ++n) {
    CHECK(DecodeElasticEndpoint(blob.substr(0, n)).status().code() ==
          absl::StatusCode::kInvalidArgument);
  }
  CHECK(DecodeElasticEndpoint(blob + "x").status().code() == absl::StatusCode::kInvalidArgument);
  std::string bad = blob;
  bad[0] ^= 1;  // magic
  CHECK(DecodeElasticEndpoint(bad).status().code() == absl::StatusCode::kInvalidArgument);
  bad = blob;
  bad[4] = 1;  // version 1 (no process)
  CHECK(DecodeElasticEndpoint(bad).status().code() == absl::StatusCode::kInvalidArgument);
  bad = blob;
  const size_t address_length = blob.find("addr-x") - 4;
  bad[address_length] = '\xff';  // the first address's length, past the end
  bad[address_length + 1] = '\xff';
  CHECK(DecodeElasticEndpoint(bad).status().code() == absl::StatusCode::kInvalidArgument);
  bad = blob;
  const size_t boot_length = blob.find("boot") - 4;
  bad[boot_length + 2] = '\x01';  // the boot id's length past the field limit
  CHECK(DecodeElasticEndpoint(bad).status().code() == absl::StatusCode::kInvalidArgument);
  ElasticEndpoint empty = Sample();
  empty.span_reply.worker_address.clear();
  CHECK(DecodeElasticEndpoint(EncodeElasticEndpoint(empty)).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(DecodeElasticEndpoint("").status().code() == absl::StatusCode::kInvalidArgument);
}

constexpr int kLayers = 3;
constexpr int64_t kWidth = 4;

// One member's group: Join, every layer's all-gather (K = global row + layer,
// V = -K), then the first token from member 1 to member 0.
absl::Status RunMember(ElasticInstance& me, const std::vector<ElasticEndpoint>& group, int self,
                       const std::string& id, int64_t len, int32_t* token) {
  UcxElasticExchange::Plan plan{{{}, {}}, len, kWidth};
  for (int64_t g = 0; g < len; ++g) plan.rows[g < len / 2 ? 0 : 1].push_back(g);
  auto ex = UcxElasticExchange::CreateOn(me.exchange_board(), plan, self,
                                         UcxElasticExchange::SeqBase(id), absl::Seconds(5));
  if (!ex.ok()) return ex.status();
  std::vector<NoticeBoardTarget> targets;
  for (const ElasticEndpoint& e : group) targets.push_back(e.exchange);
  absl::Status s = (*ex)->Connect(targets);
  if (s.ok()) s = (*ex)->Join(absl::Seconds(5));
  const std::vector<int64_t>& mine = plan.rows[self];
  std::vector<float> k(mine.size() * kWidth), v(k.size());
  for (int layer = 0; s.ok() && layer < kLayers; ++layer) {
    for (size_t i = 0; i < k.size(); ++i) {
      k[i] = static_cast<float>(mine[i / kWidth] + layer);
      v[i] = -k[i];
    }
    const float *k_all = nullptr, *v_all = nullptr;
    s = (*ex)->AllGather(layer, mine, k.data(), v.data(), &k_all, &v_all);
    for (int64_t g = 0; s.ok() && g < len; ++g) {
      if (k_all[g * kWidth] != g + layer || v_all[g * kWidth] != -(g + layer)) {
        s = absl::InternalError("wrong K/V");
      }
    }
  }
  if (s.ok() && self == 1) s = (*ex)->SendToken(kLayers, 0, 4242);
  if (s.ok() && self == 0) {
    auto t = (*ex)->AwaitToken(kLayers, 1);
    s = t.status();
    if (t.ok()) *token = *t;
  }
  (*ex)->Finish();
  return s;
}

TEST_CASE("two elastic instances serve groups one after another on their boards", "[elastic]") {
  for (TransportProfile profile : {TransportProfile::kShm, TransportProfile::kTcp}) {
    INFO(TransportProfileName(profile));
    auto ctx = UcxContext::Create(profile);
    REQUIRE(ctx.ok());
    std::vector<std::unique_ptr<ElasticInstance>> inst;
    std::vector<ElasticEndpoint> group;
    for (int i = 0; i < 2; ++i) {
      const ElasticInstance::Options o{.name = "elastic" + std::to_string(i),
                                       .max_prompt_tokens = 64,
                                       .kv_width = kWidth,
                                       .q_width = 8,
                                       .heads = 2};
      auto elastic =
          ElasticInstance::Create(**ctx, o,
                                  [i](int layer, absl::Span<const uint64_t> tags, const float* q,
                                      int64_t rows, float* out, float* lse) {
                                    for (int64_t j = 0; j < rows * 8; ++j)
                                      out[j] = q[j] + layer + i;
                                    for (int64_t j = 0; j < rows * 2; ++j)
                                      lse[j] = static_cast<float>(tags[0]);
                                    return absl::OkStatus();
                                  });
      REQUIRE(elastic.ok());
      auto e = DecodeElasticEndpoint((*elastic)->endpoint());
      REQUIRE(e.ok());
      group.push_back(*e);
      inst.push_back(std::move(elastic).value());
    }
    // The same id twice, then another and a longer prompt: stale words of
    // an earlier group never pass for this one's.
    for (const auto& [id, len] :
         std::vector<std::pair<std::string, int64_t>>{{"a", 10}, {"a", 10}, {"b", 64}}) {
      int32_t token = 0;
      absl::Status s1;
      std::thread other([&] { s1 = RunMember(*inst[1], group, 1, id, len, &token); });
      const absl::Status s0 = RunMember(*inst[0], group, 0, id, len, &token);
      other.join();
      CHECK(s0.ok());
      CHECK(s1.ok());
      CHECK(token == 4242);
    }
    int32_t unused = 0;
    CHECK(RunMember(*inst[0], group, 0, "c", 65, &unused).code() ==
          absl::StatusCode::kResourceExhausted);
    // Instance 0 masters a group as member 1 and queries instance 1 (member 0).
    REQUIRE(inst[1]->span_server().AddClient(1, group[0].span_reply).ok());
    UcxSpanPeers& client = inst[0]->span_client();
    REQUIRE(client.Retarget(1, {group[1].span_inbox, {}}).ok());
    client.SetBatch({0, 1}, 1, {7});
    std::vector<float> q(8, 1.0f), out(8), lse(2);
    for (int layer = 0; layer < 4; ++layer) {
      const absl::Status qs = client.Query(0, layer, q.data(), 1, out.data(), lse.data());
      INFO(qs.ToString());
      REQUIRE(qs.ok());
      CHECK(out[0] == 1.0f + layer + 1);
      CHECK(lse[1] == 7.0f);
    }
  }
}

}  // namespace
}  // namespace mmserve::transfer
