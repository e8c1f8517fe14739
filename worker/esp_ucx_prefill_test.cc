// ESP prefill of a golden prompt over 2 and 3 members whose K/V exchange is
// UCX (transfer/esp_kv_exchange.h), over shm and tcp: every row's logits
// bitwise one instance's, with text and with image rows. The members are
// threads of this process with their own UCX workers.
#include <catch2/catch.hpp>
#include <cstring>
#include <string>
#include <vector>

#include "model/esp_test_util.h"
#include "transfer/esp_kv_exchange.h"

namespace mmserve::model {
namespace {

using transfer::EspExchangeTarget;
using transfer::TransportProfile;
using transfer::UcxContext;
using transfer::UcxEspExchange;

TEST_CASE("ESP prefill over UCX is bitwise one instance's, shm and tcp", "[esp]") {
  const std::string name = "qwen2vl-tiny-gqa2-untied-sharded";
  LoadedModel m = LoadTestModel(name);
  const nlohmann::json g = ReadJsonFile("model/testdata/goldens/" + name + "/lm_golden.json");
  const std::vector<int> masked = g["eos_ids_masked"].get<std::vector<int>>();
  std::vector<int32_t> ids;
  for (const auto& gp : g["prompts"]) {
    if (gp["compute_dtype"] == "fp32" && gp["name"] == "chat") {
      ids = gp["input_ids"].get<std::vector<int32_t>>();
    }
  }
  REQUIRE(!ids.empty());
  const TextConfig& cfg = m.cfg.text;
  const int64_t vocab = cfg.vocab_size;
  cpu::ThreadPool pool(2);
  Qwen2Model model(cfg, *m.weights, pool);
  for (TransportProfile profile : {TransportProfile::kShm, TransportProfile::kTcp}) {
    auto ctx = UcxContext::Create(profile);
    REQUIRE(ctx.ok());
    for (const Prompt& p : {TextPrompt(ids), ImagePrompt(ids, cfg.hidden_size)}) {
      Instance inst(model, 128, 1);
      const SingleRun single = RunSingle(model, inst, p, masked, 1);
      for (const std::vector<Share>& plan : Plans(p.len())) {
        INFO(transfer::TransportProfileName(profile)
             << " members " << plan.size() << (p.overrides.empty() ? "" : " image"));
        UcxEspExchange::Plan xplan{{}, p.len(), cfg.num_key_value_heads * cfg.head_dim()};
        for (const Share& s : plan) xplan.rows.push_back(s.rows);
        std::vector<std::unique_ptr<UcxEspExchange>> group;
        std::vector<EspExchangeTarget> targets;
        std::vector<KvExchange*> exchanges;
        for (size_t i = 0; i < plan.size(); ++i) {
          auto ex = UcxEspExchange::Create(**ctx, xplan, static_cast<int>(i),
                                           {.name = "esp-" + std::to_string(i)}, absl::Seconds(30));
          REQUIRE(ex.ok());
          targets.push_back((*ex)->target());
          exchanges.push_back(ex->get());
          group.push_back(std::move(ex).value());
        }
        for (auto& ex : group) REQUIRE(ex->Connect(targets).ok());
        auto members = RunGroup(m, p, plan, exchanges);
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

}  // namespace
}  // namespace mmserve::model
