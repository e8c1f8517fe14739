// ElasticWirePlan: the global manager's batches become plans every member
// accepts (language_service/elastic_plan.h).
#include "router/elastic_group_plan.h"

#include <catch2/catch.hpp>
#include <random>
#include <string>
#include <vector>

#include "language_service/elastic_plan.h"

namespace mmserve::router {
namespace {

using scheduler::ElasticBatchPlan;
using scheduler::ElasticRequestPlan;
namespace iv1 = ::mmserve::internal::v1;

// Instances 4 (language-a) and 7 (language-b), blocks of 16: the wire
// plan of `r`, checked as every member checks it.
iv1::ElasticPlan PlanOnTwo(const ElasticRequestPlan& r) {
  ElasticBatchPlan batch;
  batch.instances = {4, 7};
  std::vector<std::string> ids(8);
  ids[4] = "language-a";
  ids[7] = "language-b";
  auto plan = ElasticWirePlan(batch, r, ids);
  REQUIRE(plan.ok());
  CHECK(language::CheckElasticPlan(*plan, static_cast<uint32_t>(r.input_len), 16).ok());
  return *plan;
}

TEST_CASE("a 3k-token prompt over two 2k-token instances", "[elastic]") {
  // The prompt's 3000 tokens and 8 new ones: a keeps [0, 2048), b
  // [2048, 3008) and masters.
  const iv1::ElasticPlan plan = PlanOnTwo({1, 3000, {{4, 0, 2048}, {7, 2048, 3008}}, 7});
  REQUIRE(plan.members_size() == 2);
  CHECK(plan.members(0).instance_id() == "language-a");
  CHECK(plan.members(0).rows(0).end() == 1500);
  CHECK(plan.members(1).keep().begin() == 2048);
  CHECK(plan.members(1).keep().end() == 3000);
  CHECK(plan.master() == 1);
  CHECK(plan.sampler() == 1);

  CHECK(plan.members(0).decode().end() == 0);
  CHECK(plan.members(1).decode().begin() == 3000);
  CHECK(plan.members(1).decode().end() == 3008);
  CHECK(language::ElasticMasterChain(plan) == std::vector<int>{1});

  ElasticBatchPlan batch;
  batch.instances = {4, 7};
  ElasticRequestPlan outside{1, 3000, {{4, 0, 2048}, {5, 2048, 3008}}, 5};
  CHECK(ElasticWirePlan(batch, outside, std::vector<std::string>(8, "x")).status().code() ==
        absl::StatusCode::kInternal);
}

TEST_CASE("a decode tail past the first master's pool: the master moves on", "[elastic]") {
  // A 2000-token prompt and 99 new tokens on two 2048-token instances: a
  // keeps [0, 2048), the prompt and 48 decode slots, and masters first; b
  // masters the rest.
  const iv1::ElasticPlan plan = PlanOnTwo({1, 2000, {{4, 0, 2048}, {7, 2048, 2099}}, 7});
  CHECK(plan.master() == 0);
  CHECK(plan.members(0).keep().end() == 2000);
  CHECK(plan.members(0).decode().begin() == 2000);
  CHECK(plan.members(0).decode().end() == 2048);
  CHECK(plan.members(1).keep().end() == 0);
  CHECK(plan.members(1).decode().begin() == 2048);
  CHECK(plan.members(1).decode().end() == 2099);
  CHECK(language::ElasticMasterChain(plan) == std::vector<int>{0, 1});
}

TEST_CASE("property: every planned request's wire plan passes the members' check", "[elastic]") {
  std::mt19937 gen(11);
  int plans = 0;
  for (int t = 0; t < 300; ++t) {
    scheduler::ElasticConfig c;
    c.block_size = 1 + static_cast<int64_t>(gen() % 16);
    const int degrees = 1 + static_cast<int>(gen() % 4);
    for (int d = 1; d <= degrees; ++d) c.per_degree.push_back({0.01 * d, 1e-3 / d, 1e-7 / d});
    c.max_prefill_seconds = 10;
    scheduler::ElasticPoolState s;
    const int n = 1 + static_cast<int>(gen() % 6);
    std::vector<std::string> ids;
    for (int i = 0; i < n; ++i) {
      s.instances.push_back({i, static_cast<int64_t>(gen() % 60), {}, 0});
      ids.push_back("language-" + std::to_string(i));
    }
    for (uint64_t k = 0; k < 1 + gen() % 8; ++k) {
      s.pending.push_back(
          {k, 1 + static_cast<int64_t>(gen() % 200), static_cast<int64_t>(gen() % 20)});
    }
    const scheduler::ElasticIterationPlan p = scheduler::PlanElasticIteration(s, c);
    for (const ElasticBatchPlan& b : p.batches) {
      for (const ElasticRequestPlan& r : b.requests) {
        INFO("case " << t << " request " << r.id);
        auto plan = ElasticWirePlan(b, r, ids);
        REQUIRE(plan.ok());
        CHECK(language::CheckElasticPlan(*plan, static_cast<uint32_t>(r.input_len),
                                         static_cast<uint32_t>(c.block_size))
                  .ok());
        ++plans;
      }
    }
  }
  CHECK(plans > 100);
}

}  // namespace
}  // namespace mmserve::router
