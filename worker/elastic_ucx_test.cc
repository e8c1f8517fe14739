// elastic over UCX with the model, members as threads of this process with
// their own UCX workers, shm and tcp:
// - prefill of a golden prompt over 2 and 3 members exchanging K/V with
//   UcxElasticExchange: every row's logits bitwise one instance's, text and
//   image rows;
// - decode with the KV spread over 2 (a holder answering the master's span
//   queries over UcxSpanPeers / ElasticSpanServer): logits bitwise those of the
//   same decode with in-process peers, greedy ids one instance's.
#include <catch2/catch.hpp>
#include <cstring>
#include <string>
#include <vector>

#include "model/elastic_testing.h"
#include "transfer/elastic_kv_exchange.h"
#include "transfer/elastic_span_attention.h"

namespace mmserve::model {
namespace {

using transfer::ElasticExchangeTarget;
using transfer::TransportProfile;
using transfer::UcxContext;
using transfer::UcxElasticExchange;

// The group's prefill with the UCX exchange.
std::vector<std::unique_ptr<Member>> RunUcxGroup(UcxContext& ctx, const LoadedModel& m,
                                                 const Prompt& p, const std::vector<Share>& plan) {
  const TextConfig& cfg = m.cfg.text;
  UcxElasticExchange::Plan xplan{{}, p.len(), cfg.num_key_value_heads * cfg.head_dim()};
  for (const Share& s : plan) xplan.rows.push_back(s.rows);
  std::vector<std::unique_ptr<UcxElasticExchange>> group;
  std::vector<ElasticExchangeTarget> targets;
  std::vector<KvExchange*> exchanges;
  for (size_t i = 0; i < plan.size(); ++i) {
    auto ex =
        UcxElasticExchange::Create(ctx, xplan, static_cast<int>(i),
                                   {.name = "elastic-" + std::to_string(i)}, absl::Seconds(30));
    REQUIRE(ex.ok());
    targets.push_back((*ex)->target());
    exchanges.push_back(ex->get());
    group.push_back(std::move(ex).value());
  }
  for (auto& ex : group) REQUIRE(ex->Connect(targets).ok());
  return RunGroup(m, p, plan, exchanges);
}

struct Golden {
  LoadedModel m;
  std::vector<int> masked;
  std::vector<int32_t> ids;  // the chat prompt
};

Golden LoadChat(const std::string& name) {
  Golden g{LoadTestModel(name), {}, {}};
  const nlohmann::json j = ReadJsonFile("model/testdata/goldens/" + name + "/lm_golden.json");
  g.masked = j["eos_ids_masked"].get<std::vector<int>>();
  for (const auto& gp : j["prompts"]) {
    if (gp["compute_dtype"] == "fp32" && gp["name"] == "chat") {
      g.ids = gp["input_ids"].get<std::vector<int32_t>>();
    }
  }
  REQUIRE(!g.ids.empty());
  return g;
}

TEST_CASE("elastic prefill over UCX is bitwise one instance's, shm and tcp", "[elastic]") {
  const Golden g = LoadChat("qwen2vl-tiny-gqa2-untied-sharded");
  const TextConfig& cfg = g.m.cfg.text;
  const int64_t vocab = cfg.vocab_size;
  cpu::ThreadPool pool(2);
  Qwen2Model model(cfg, *g.m.weights, pool);
  for (TransportProfile profile : {TransportProfile::kShm, TransportProfile::kTcp}) {
    auto ctx = UcxContext::Create(profile);
    REQUIRE(ctx.ok());
    for (const Prompt& p : {TextPrompt(g.ids), ImagePrompt(g.ids, cfg.hidden_size)}) {
      Instance inst(model, 128, 1);
      const SingleRun single = RunSingle(model, inst, p, g.masked, 1);
      for (const std::vector<Share>& plan : Plans(p.len())) {
        INFO(transfer::TransportProfileName(profile)
             << " members " << plan.size() << (p.overrides.empty() ? "" : " image"));
        auto members = RunUcxGroup(**ctx, g.m, p, plan);
        for (size_t i = 0; i < plan.size(); ++i) {
          REQUIRE(members[i]->status.ok());
          for (size_t r = 0; r < plan[i].rows.size(); ++r) {
            CHECK(std::memcmp(&members[i]->logits[r * vocab],
                              &single.logits[plan[i].rows[r] * vocab], vocab * sizeof(float)) == 0);
          }
        }
      }
    }
  }
}

TEST_CASE("elastic decode over UCX span queries is bitwise the in-process decode", "[elastic]") {
  const Golden g = LoadChat("qwen2vl-tiny-mha-tied");
  const TextConfig& cfg = g.m.cfg.text;
  const int64_t vocab = cfg.vocab_size;
  constexpr int kSteps = 16;
  cpu::ThreadPool pool(2);
  Qwen2Model model(cfg, *g.m.weights, pool);
  const Prompt p = TextPrompt(g.ids);
  Instance inst(model, 128, 1);
  const SingleRun single = RunSingle(model, inst, p, g.masked, kSteps);
  const std::vector<Share> plan = Plans(p.len())[0];
  const int64_t a = plan[0].keep_end;  // member 0 holds [0, a), member 1 masters
  for (TransportProfile profile : {TransportProfile::kShm, TransportProfile::kTcp}) {
    INFO(transfer::TransportProfileName(profile));
    auto ctx = UcxContext::Create(profile);
    REQUIRE(ctx.ok());
    auto local = RunUcxGroup(**ctx, g.m, p, plan);
    LocalPeers local_peers(*local[0], a, cfg);
    const SpreadDecode want = DecodeSpread(*local[1], local_peers, p, a, g.masked, kSteps, vocab);
    auto remote = RunUcxGroup(**ctx, g.m, p, plan);
    const transfer::ElasticSpanShape shape{2, 1, cfg.num_attention_heads * cfg.head_dim(),
                                           cfg.num_attention_heads};
    Member& holder = *remote[0];
    auto server = transfer::ElasticSpanServer::Create(
        **ctx, shape, 0,
        [&](int layer, absl::Span<const uint64_t>, const float* q, int64_t rows, float* out,
            float* lse) { return HolderPartials(holder, a, cfg, layer, q, rows, out, lse); },
        {.name = "holder"});
    REQUIRE(server.ok());
    auto peers =
        transfer::UcxSpanPeers::Create(**ctx, shape, 1, {.name = "master"}, absl::Seconds(30));
    REQUIRE(peers.ok());
    REQUIRE((*server)->Connect({{}, (*peers)->target()}).ok());
    REQUIRE((*peers)->Connect({(*server)->target(), {}}).ok());
    (*peers)->SetBatch({0, 1}, 1, {/*the request's tag*/ 42});
    const SpreadDecode got = DecodeSpread(*remote[1], **peers, p, a, g.masked, kSteps, vocab);
    CHECK(got.greedy == single.greedy);
    CHECK(got.greedy == want.greedy);
    REQUIRE(got.logits.size() == want.logits.size());
    for (size_t s = 0; s < got.logits.size(); ++s) CHECK(got.logits[s] == want.logits[s]);
  }
}

}  // namespace
}  // namespace mmserve::model
