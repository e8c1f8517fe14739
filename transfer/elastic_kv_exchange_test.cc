#include "transfer/elastic_kv_exchange.h"

#include <catch2/catch.hpp>
#include <string>
#include <thread>
#include <vector>

#include "common/status_macros.h"
#include "transfer/elastic_exchange_testing.h"

namespace mmserve::transfer {
namespace {

constexpr int64_t kLen = 37, kWidth = 16;
constexpr int kLayers = 5;

std::vector<std::unique_ptr<UcxElasticExchange>> Group(UcxContext& ctx,
                                                       const UcxElasticExchange::Plan& plan,
                                                       absl::Duration timeout) {
  std::vector<std::unique_ptr<UcxElasticExchange>> group;
  std::vector<ElasticExchangeTarget> targets;
  for (size_t m = 0; m < plan.rows.size(); ++m) {
    auto ex = UcxElasticExchange::Create(ctx, plan, static_cast<int>(m),
                                         {.name = "elastic-" + std::to_string(m)}, timeout);
    REQUIRE(ex.ok());
    targets.push_back((*ex)->target());
    group.push_back(std::move(ex).value());
  }
  for (auto& ex : group) REQUIRE(ex->Connect(targets).ok());
  return group;
}

// Member m's layers; *all_equal: every layer gathered every row exactly.
absl::Status RunMember(UcxElasticExchange& ex, const UcxElasticExchange::Plan& plan, int m,
                       int layers, bool* all_equal) {
  *all_equal = true;
  for (int layer = 0; layer < layers; ++layer) {
    bool equal = false;
    RETURN_IF_ERROR(ElasticRunLayer(ex, plan, m, layer, &equal));
    *all_equal &= equal;
  }
  return absl::OkStatus();
}

TEST_CASE("every member gathers every row of every layer, over shm and tcp", "[elastic]") {
  for (TransportProfile profile : {TransportProfile::kShm, TransportProfile::kTcp}) {
    CAPTURE(TransportProfileName(profile));
    auto ctx = UcxContext::Create(profile);
    REQUIRE(ctx.ok());
    for (int members : {2, 3}) {
      CAPTURE(members);
      const UcxElasticExchange::Plan plan{ElasticStripes(members, kLen), kLen, kWidth};
      auto group = Group(**ctx, plan, absl::Seconds(30));
      std::vector<absl::Status> status(members);
      bool equal[3] = {false, false, false};
      std::vector<std::thread> threads;
      for (int m = 0; m < members; ++m) {
        threads.emplace_back(
            [&, m] { status[m] = RunMember(*group[m], plan, m, kLayers, &equal[m]); });
      }
      for (std::thread& t : threads) t.join();
      for (int m = 0; m < members; ++m) {
        CHECK(status[m].ok());
        CHECK(equal[m]);
      }
    }
  }
}

TEST_CASE("a member that fails aborts the others with its code; one that never comes times out",
          "[elastic]") {
  auto ctx = UcxContext::Create(TransportProfile::kShm);
  REQUIRE(ctx.ok());
  const UcxElasticExchange::Plan plan{ElasticStripes(2, kLen), kLen, kWidth};
  bool equal = false;
  {
    auto group = Group(**ctx, plan, absl::Seconds(30));
    group[1]->Abort();
    CHECK(RunMember(*group[0], plan, 0, kLayers, &equal).code() == absl::StatusCode::kUnavailable);
  }
  {
    auto group = Group(**ctx, plan, absl::Seconds(30));
    group[1]->Abort(absl::StatusCode::kResourceExhausted);
    CHECK(RunMember(*group[0], plan, 0, kLayers, &equal).code() ==
          absl::StatusCode::kResourceExhausted);
  }
  {
    auto group = Group(**ctx, plan, absl::Milliseconds(200));
    CHECK(RunMember(*group[0], plan, 0, kLayers, &equal).code() ==
          absl::StatusCode::kDeadlineExceeded);
  }
  CHECK(!UcxElasticExchange::Create(**ctx, {{{0, 1}, {1, 2}}, 3, kWidth}, 0, {}, absl::Seconds(1))
             .ok());  // row 1 twice
}

TEST_CASE("a request id's groups have their own sequence bases", "[elastic]") {
  CHECK(UcxElasticExchange::SeqBase("r1") == UcxElasticExchange::SeqBase("r1", 0));
  CHECK(UcxElasticExchange::SeqBase("r1", 1) != UcxElasticExchange::SeqBase("r1", 2));
  CHECK(UcxElasticExchange::SeqBase("r1", 1) != UcxElasticExchange::SeqBase("r1"));
  for (uint64_t group : {uint64_t{0}, uint64_t{1}, ~uint64_t{0}}) {
    const uint32_t base = UcxElasticExchange::SeqBase("r1", group);
    CHECK(base >= 2);               // the abort word base - 1 is never 0
    CHECK(base < 0x80000000u + 2);  // every layer stays far below kAbortSeq
  }
  CHECK(AbortCode(AbortWord(7, absl::StatusCode::kInvalidArgument)) ==
        absl::StatusCode::kInvalidArgument);
  CHECK(AbortCode(NoticeWord(7, 0)) == absl::StatusCode::kUnavailable);  // no code carried
  CHECK(AbortCode(NoticeWord(7, 999)) == absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace mmserve::transfer
