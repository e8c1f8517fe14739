// A master that reserves its decode KV a window at a time (the plan's
// decode_window), on in-process elastic instances over real gRPC and UCX:
// its span grows by blocks as it decodes and its tokens and text stay role
// both's (greedy and seeded); a master whose pool has no block for its
// next window ends the request RESOURCE_EXHAUSTED after the tokens it
// could decode, where reserving the whole decode would have refused the
// group at once; every instance's blocks are free again at the end.
#include <algorithm>
#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <vector>

#include "language_service/elastic_serve_testing.h"

namespace mmserve::language::testing {
namespace {

constexpr char kText[] =
    "Tell me a long story about elastic sequence parallelism across instances.";

// Two elastic instances over shm; the second (the master) with a pool of
// `master_kv_bytes`.
std::vector<std::unique_ptr<Instance>> Pair(int64_t master_kv_bytes) {
  std::vector<std::unique_ptr<Instance>> out;
  for (int m = 0; m < 2; ++m) {
    out.push_back(std::make_unique<Instance>(
        LanguageRole::kElastic, absl::Seconds(10), 1,
        InstanceOptions{"elastic-" + std::to_string(m), transfer::TransportProfile::kShm,
                        m == 1 ? master_kv_bytes : int64_t{8 << 20}}));
  }
  return out;
}

TEST_CASE("a master with a decode window grows its span as it decodes; tokens stay role both's",
          "[elastic]") {
  Instance both(LanguageRole::kBoth);
  auto elastic = Pair(8 << 20);
  const std::vector<Instance*> members = {elastic[0].get(), elastic[1].get()};
  for (bool seeded : {false, true}) {
    INFO((seeded ? "seeded" : "greedy"));
    mmserve::v1::SamplingParams s = Greedy(40);
    if (seeded) {
      s.set_temperature(0.9f);
      s.set_top_p(0.95f);
      s.set_seed(99);
    }
    const std::string id = seeded ? "seeded" : "greedy";
    const v1::PrefillRequest request = Request(id, kText, s);
    const Stream want = RunBothWithUsage(both, request);
    REQUIRE(want.out.status.ok());
    REQUIRE(want.out.tokens.size() == 40);
    v1::ElasticPlan plan = MakePlan(members, EvenShares(want.prompt_tokens, 2), 1, 1);
    plan.set_decode_window(kBlock);  // a block at a time: 10 growths
    const std::vector<Stream> got = RunGroup(members, plan, [&](int) { return request; });
    INFO(got[1].out.status.error_message());
    REQUIRE(got[0].out.status.ok());
    REQUIRE(got[1].out.status.ok());
    CHECK(got[1].out.tokens == want.out.tokens);
    CHECK(got[1].out.text == want.out.text);
    CHECK(got[1].out.finish == want.out.finish);
    CHECK(UsedBlocks(*elastic[1], 0) == 0);  // the master freed its span at the finish
    AbortAndCheckIdle(members, id);
  }
}

TEST_CASE("a master whose pool has no block for its next window ends RESOURCE_EXHAUSTED",
          "[elastic]") {
  Instance both(LanguageRole::kBoth);
  // 96 KiB: 96 tokens (24 blocks) of the tiny model's KV on the master.
  auto elastic = Pair(96 << 10);
  const std::vector<Instance*> members = {elastic[0].get(), elastic[1].get()};
  const v1::PrefillRequest request = Request("long", kText, Greedy(90));
  const Stream want = RunBothWithUsage(both, request);
  REQUIRE(want.out.status.ok());
  const uint32_t len = want.prompt_tokens;
  const std::vector<Share> shares = EvenShares(len, 2);
  const uint32_t pool = elastic[1]->core->Capacity().kv_blocks_total() * kBlock;
  INFO("prompt " << len << " tokens, master pool " << pool);
  // Its KV would reach index len + 89 (max_tokens is bounded by the pool, the
  // instance's context); the master's span begins at keep_begin.
  REQUIRE(len + 89 - shares[1].keep_begin > pool);  // the whole decode does not fit
  // Reserving the whole decode, the master refuses the group at once and
  // tells the other member.
  v1::ElasticPlan plan = MakePlan(members, shares, 1, 1);
  std::vector<Stream> got = RunGroup(members, plan, [&](int) { return request; });
  INFO(got[0].out.status.error_message() << " / " << got[1].out.status.error_message());
  CHECK(got[1].out.status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED);
  CHECK(got[0].out.status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED);
  CHECK(elastic[0]->Idle());
  CHECK(elastic[1]->Idle());
  // A block at a time, it decodes until its pool is full, then ends.
  plan.set_decode_window(kBlock);
  const v1::PrefillRequest windowed = Request("windowed", kText, Greedy(90));
  got = RunGroup(members, plan, [&](int) { return windowed; });
  INFO(got[0].out.status.error_message() << " / " << got[1].out.status.error_message());
  REQUIRE(got[0].out.status.ok());  // the holder kept its span
  CHECK(got[1].out.status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED);
  CHECK(got[1].out.status.error_message().find("KV") != std::string::npos);
  const std::vector<uint32_t>& tokens = got[1].out.tokens;
  // The first token, then one a slot of the pool past the prompt.
  CHECK(tokens.size() == 1 + shares[1].keep_begin + pool - len);
  REQUIRE(tokens.size() < want.out.tokens.size());
  CHECK(std::equal(tokens.begin(), tokens.end(), want.out.tokens.begin()));
  AbortAndCheckIdle(members, "windowed");
}

}  // namespace
}  // namespace mmserve::language::testing
