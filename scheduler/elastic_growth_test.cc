#include "scheduler/elastic_growth.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <map>
#include <random>
#include <set>
#include <vector>

namespace mmserve::scheduler {
namespace {

using Kind = ElasticGrowthAction::Kind;

ElasticGrowthConfig Config() {
  ElasticGrowthConfig c;
  c.block_size = 16;
  c.lookahead_steps = 32;
  c.extend_seconds = 0.05;
  c.move_margin = 0.2;
  return c;
}

// A request spread over instances 0 (master, 100 KV tokens) and 1 (1000),
// reserved to slot 1120 on the master, having written 1100.
ElasticDecodingRequest Spread(uint64_t id = 7) {
  return {.id = id,
          .master = 0,
          .holders = {1},
          .holder_kv_tokens = {1000},
          .kv_tokens = 1100,
          .master_kv_tokens = 100,
          .reserved_end = 1120,
          .remaining_tokens = 500};
}

TEST_CASE("a request whose reservation covers the window needs nothing") {
  ElasticDecodingRequest r = Spread();
  r.reserved_end = 1100 + 32;
  const ElasticGrowthState s{.instances = {{.id = 0, .free_blocks = 10}, {.id = 1}},
                             .requests = {r}};
  CHECK(PlanElasticGrowth(s, Config()).empty());
}

TEST_CASE("the master reserves the next window in whole blocks while it has free blocks") {
  const ElasticGrowthState s{.instances = {{.id = 0, .free_blocks = 2}, {.id = 1}},
                             .requests = {Spread()}};
  const std::vector<ElasticGrowthAction> a = PlanElasticGrowth(s, Config());
  REQUIRE(a.size() == 1);
  CHECK(a[0].kind == Kind::kReserve);
  CHECK(a[0].instance == 0);
  // 1100 + 32 = 1132 needed; 12 slots past 1120, one block.
  CHECK(a[0].begin == 1120);
  CHECK(a[0].end == 1136);
}

TEST_CASE(
    "the window covers the tokens decoded while an extension gets ready, never past the end") {
  ElasticDecodingRequest r = Spread();
  ElasticGrowthConfig c = Config();
  CHECK(GrowthWindow(r, c) == 32);
  r.tokens_per_second = 2000;  // 100 tokens in 0.05 s
  CHECK(GrowthWindow(r, c) == 100);
  r.remaining_tokens = 40;
  CHECK(GrowthWindow(r, c) == 40);
  r.remaining_tokens = 0;
  CHECK(GrowthWindow(r, c) == 0);
  const ElasticGrowthState s{.instances = {{.id = 0}, {.id = 1}}, .requests = {r}};
  CHECK(PlanElasticGrowth(s, c).empty());  // done: nothing to reserve, no end
}

TEST_CASE("a master out of blocks extends the chain where the request would decode fastest") {
  // Instances 2 and 3 have room; 2 runs a large ordinary batch, 3 is idle.
  const ElasticGrowthState s{
      .instances = {{.id = 0},
                    {.id = 1},
                    {.id = 2, .free_blocks = 50, .batch_rows = 40, .batch_kv_tokens = 40000},
                    {.id = 3, .free_blocks = 5}},
      .requests = {Spread()}};
  const std::vector<ElasticGrowthAction> a = PlanElasticGrowth(s, Config());
  REQUIRE(a.size() == 1);
  CHECK(a[0].kind == Kind::kExtend);
  CHECK(a[0].instance == 3);
  // The new master's range continues the old one's reservation.
  CHECK(a[0].begin == 1120);
  CHECK(a[0].end == 1120 + 16);
}

TEST_CASE("an extension prefers a holder of the request's span: it attends that span itself") {
  // Instance 1 holds 1000 of its tokens and has room; instance 2 is as
  // idle but would query both 0 and 1.
  const ElasticGrowthState s{
      .instances = {{.id = 0}, {.id = 1, .free_blocks = 4}, {.id = 2, .free_blocks = 40}},
      .requests = {Spread()}};
  ElasticGrowthConfig c = Config();
  const std::vector<ElasticGrowthAction> a = PlanElasticGrowth(s, c);
  REQUIRE(a.size() == 1);
  CHECK(a[0].kind == Kind::kExtend);
  CHECK(a[0].instance == 1);
  // On 1: holder 0 only, 1000 local tokens; on 2: holders 0 and 1.
  CHECK(SecondsPerToken(s, 1, 7, {0}, 1000, c.decode) == Approx(c.decode.Predict(1, 1000, 1)));
  CHECK(SecondsPerToken(s, 2, 7, {0, 1}, 0, c.decode) == Approx(c.decode.Predict(1, 0, 2)));
}

TEST_CASE("no instance with room: the request decodes what it reserved, then runs out of KV") {
  ElasticDecodingRequest r = Spread();
  const ElasticGrowthState waiting{.instances = {{.id = 0}, {.id = 1}}, .requests = {r}};
  // 20 slots left on the master: not yet out (blocks may free meanwhile).
  // Then the 32-token window needs 2 blocks past 1120 and instance 1 has 1.
  CHECK(PlanElasticGrowth(waiting, Config()).empty());
  r.kv_tokens = r.reserved_end;
  const ElasticGrowthState out{.instances = {{.id = 0}, {.id = 1, .free_blocks = 1}},
                               .requests = {r}};
  const std::vector<ElasticGrowthAction> a = PlanElasticGrowth(out, Config());
  REQUIRE(a.size() == 1);
  CHECK(a[0].kind == Kind::kOutOfKv);
  CHECK(a[0].id == 7);
}

TEST_CASE("an extended request waits for its next master instead of extending again") {
  ElasticDecodingRequest r = Spread();
  r.next_master_ready = true;
  r.kv_tokens = r.reserved_end;
  const ElasticGrowthState s{.instances = {{.id = 0}, {.id = 1, .free_blocks = 9}},
                             .requests = {r}};
  CHECK(PlanElasticGrowth(s, Config()).empty());
}

TEST_CASE("the request closest to a full reservation claims the master's last blocks first") {
  ElasticDecodingRequest calm = Spread(1), urgent = Spread(2);
  calm.reserved_end = 1120;
  calm.kv_tokens = 1104;  // 16 slots left
  urgent.reserved_end = 1120;
  urgent.kv_tokens = 1118;  // 2 slots left
  const ElasticGrowthState s{.instances = {{.id = 0, .free_blocks = 3}, {.id = 1}},
                             .requests = {calm, urgent}};
  const std::vector<ElasticGrowthAction> a = PlanElasticGrowth(s, Config());
  // urgent needs 30 past 1120 (2 blocks), calm 16 (1 block): both fit 3.
  REQUIRE(a.size() == 2);
  CHECK(a[0].id == 2);
  CHECK(a[0].kind == Kind::kReserve);
  CHECK(a[0].end - a[0].begin == 32);
  CHECK(a[1].id == 1);
  CHECK(a[1].kind == Kind::kReserve);
  const ElasticGrowthState tight{.instances = {{.id = 0, .free_blocks = 2}, {.id = 1}},
                                 .requests = {calm, urgent}};
  const std::vector<ElasticGrowthAction> b = PlanElasticGrowth(tight, Config());
  REQUIRE(b.size() == 1);  // calm waits: 16 slots reserved still
  CHECK(b[0].id == 2);
  CHECK(b[0].kind == Kind::kReserve);
}

// Goal of the moves: a master whose round is slow hands the request to one
// that decodes it faster by the margin, at its next block boundary.
TEST_CASE("a master moves when another instance's time per token is lower by the margin") {
  ElasticDecodingRequest r = Spread();
  r.reserved_end = 1100 + 36;  // the window is reserved
  r.kv_tokens = 1100;
  ElasticGrowthConfig c = Config();
  const ElasticGrowthInstance busy{
      .id = 0, .free_blocks = 0, .batch_rows = 60, .batch_kv_tokens = 60000};
  const ElasticGrowthState s{.instances = {busy, {.id = 1}, {.id = 2, .free_blocks = 10}},
                             .requests = {r}};
  const double now = SecondsPerToken(s, 0, 7, {1}, 100, c.decode);
  const double there = SecondsPerToken(s, 2, 7, {0, 1}, 0, c.decode);
  REQUIRE(there < 0.8 * now);
  const std::vector<ElasticGrowthAction> a = PlanElasticGrowth(s, c);
  REQUIRE(a.size() == 1);
  CHECK(a[0].kind == Kind::kMove);
  CHECK(a[0].instance == 2);
  // The master's block grid: 1136 - 16 k; the first boundary at or past 1100.
  CHECK(a[0].begin == 1104);
  CHECK(a[0].end == 1104 + 32);

  SECTION("not within the margin") {
    c.move_margin = 1.0 - there / now + 0.01;
    CHECK(PlanElasticGrowth(s, c).empty());
  }
  SECTION("not when the tokens left do not repay the move") {
    ElasticDecodingRequest nearly = r;
    nearly.remaining_tokens = 5;  // one token past the boundary
    c.extend_seconds = (now - there) * 1.5;
    const ElasticGrowthState t{.instances = s.instances, .requests = {nearly}};
    CHECK(PlanElasticGrowth(t, c).empty());
  }
  SECTION("not to an instance without room for the window") {
    const ElasticGrowthState t{.instances = {busy, {.id = 1}, {.id = 2, .free_blocks = 1}},
                               .requests = {r}};
    CHECK(PlanElasticGrowth(t, c).empty());
  }
}

TEST_CASE("masters of one holder set share a step; a master with two sets runs two") {
  const DecodeStepModel m;
  ElasticDecodingRequest a = Spread(1), b = Spread(2);
  const ElasticGrowthState s{.instances = {{.id = 0}, {.id = 1}, {.id = 2}}, .requests = {a, b}};
  // A third request with holders {1} joins their step: one step of 3 rows.
  CHECK(SecondsPerToken(s, 0, 3, {1}, 100, m) == Approx(m.Predict(3, 300, 1)));
  // With holders {2} it is a second step of the round.
  CHECK(SecondsPerToken(s, 0, 3, {2}, 100, m) ==
        Approx(m.Predict(2, 200, 1) + m.Predict(1, 100, 1)));
}

// Random pools: no instance's blocks are ever promised twice, every range
// continues where the request stands, and a request runs out of KV only
// when nothing could hold its window.
TEST_CASE("random pools: reservations fit, ranges continue, out of KV only when nothing fits") {
  std::mt19937 rng(5);
  const ElasticGrowthConfig c = Config();
  for (int round = 0; round < 300; ++round) {
    ElasticGrowthState s;
    const int n = 2 + static_cast<int>(rng() % 4);
    for (int i = 0; i < n; ++i) {
      s.instances.push_back({.id = i,
                             .free_blocks = static_cast<int64_t>(rng() % 6),
                             .batch_rows = static_cast<int64_t>(rng() % 8),
                             .batch_kv_tokens = static_cast<int64_t>(rng() % 5000)});
    }
    const int requests = 1 + static_cast<int>(rng() % 5);
    for (int k = 0; k < requests; ++k) {
      ElasticDecodingRequest r;
      r.id = static_cast<uint64_t>(k);
      r.master = static_cast<int>(rng() % n);
      const int holder = (r.master + 1) % n;
      r.holders = {holder};
      r.holder_kv_tokens = {1000};
      r.master_kv_tokens = static_cast<int64_t>(rng() % 200);
      r.reserved_end = 1024 + 16 * static_cast<int64_t>(rng() % 8);
      r.kv_tokens = r.reserved_end - static_cast<int64_t>(rng() % 40);
      r.remaining_tokens = static_cast<int64_t>(rng() % 100);
      r.tokens_per_second = static_cast<double>(rng() % 3000);
      r.next_master_ready = rng() % 5 == 0;
      s.requests.push_back(r);
    }
    const std::vector<ElasticGrowthAction> actions = PlanElasticGrowth(s, c);
    std::map<int, int64_t> used, freed;
    std::set<uint64_t> seen;
    for (const ElasticGrowthAction& a : actions) {
      REQUIRE(seen.insert(a.id).second);  // one decision a request
      const ElasticDecodingRequest& r = s.requests[a.id];
      CHECK_FALSE(r.next_master_ready);
      if (a.kind == Kind::kOutOfKv) {
        CHECK(r.reserved_end <= r.kv_tokens);
        continue;
      }
      CHECK((a.end - a.begin) % c.block_size == 0);
      CHECK(a.end > a.begin);
      if (a.kind == Kind::kMove) {
        CHECK(a.begin >= r.kv_tokens);
        CHECK(a.begin <= r.reserved_end);
        CHECK((r.reserved_end - a.begin) % c.block_size == 0);
        freed[r.master] += (r.reserved_end - a.begin) / c.block_size;
      } else {
        CHECK(a.begin == r.reserved_end);
        CHECK(a.end >= r.kv_tokens + GrowthWindow(r, c));
      }
      CHECK((a.kind == Kind::kReserve) == (a.instance == r.master));
      used[a.instance] += (a.end - a.begin) / c.block_size;
    }
    for (const ElasticGrowthInstance& i : s.instances) {
      CHECK(used[i.id] <= i.free_blocks + freed[i.id]);
    }
    // Out of KV: no instance but the master had room for the window at
    // the start (claims by more urgent requests only shrink the room).
    for (const ElasticGrowthAction& a : actions) {
      if (a.kind != Kind::kOutOfKv) continue;
      const ElasticDecodingRequest& r = s.requests[a.id];
      const int64_t need = r.kv_tokens + GrowthWindow(r, c) - r.reserved_end;
      const int64_t blocks = (need + c.block_size - 1) / c.block_size;
      for (const ElasticGrowthInstance& i : s.instances) {
        if (i.id != r.master && used[i.id] == 0) CHECK(i.free_blocks < blocks);
      }
    }
  }
}

TEST_CASE("the decode step model is recovered from steps that vary every feature") {
  const DecodeStepModel truth{.a = 3e-3, .per_row = 2e-4, .per_kv_token = 5e-8, .per_holder = 7e-4};
  std::vector<DecodeStepSample> samples;
  for (int64_t rows : {1, 4, 9})
    for (int64_t kv : {0, 3000, 20000})
      for (int64_t holders : {0, 1, 3}) {
        samples.push_back({rows, kv, holders, truth.Predict(rows, kv, holders)});
      }
  const DecodeStepModel fit = FitDecodeStepModel(samples, DecodeStepModel{});
  CHECK(fit.a == Approx(truth.a).epsilon(1e-6));
  CHECK(fit.per_row == Approx(truth.per_row).epsilon(1e-6));
  CHECK(fit.per_kv_token == Approx(truth.per_kv_token).epsilon(1e-6));
  CHECK(fit.per_holder == Approx(truth.per_holder).epsilon(1e-6));
}

TEST_CASE("load reports fit the intercept and the per-row cost; the rest stays the prior's") {
  const DecodeStepModel prior;  // the defaults
  DecodeStepModel truth = prior;
  truth.a = 5e-3;
  truth.per_row = 3e-4;
  std::vector<DecodeStepSample> samples;
  for (int64_t rows : {1, 2, 5, 8})
    samples.push_back({rows, 4000, 1, truth.Predict(rows, 4000, 1)});
  const DecodeStepModel fit = FitDecodeStepModel(samples, prior);
  CHECK(fit.a == Approx(truth.a).epsilon(1e-6));
  CHECK(fit.per_row == Approx(truth.per_row).epsilon(1e-6));
  CHECK(fit.per_kv_token == prior.per_kv_token);
  CHECK(fit.per_holder == prior.per_holder);
  // Nothing measured: the prior.
  const DecodeStepModel none = FitDecodeStepModel({}, prior);
  CHECK(none.a == prior.a);
  CHECK(none.per_row == prior.per_row);
}

TEST_CASE("a fitted decode step model never gets cheaper with more work") {
  // Noisy steps that take less time for more rows: the slope is held at 0.
  const std::vector<DecodeStepSample> samples = {
      {1, 0, 0, 9e-3}, {2, 0, 0, 8e-3}, {4, 0, 0, 6e-3}, {8, 0, 0, 5e-3}};
  const DecodeStepModel fit = FitDecodeStepModel(samples, DecodeStepModel{});
  CHECK(fit.per_row == 0);
  CHECK(fit.a == Approx(7e-3));  // the mean
  CHECK(fit.per_kv_token >= 0);
  CHECK(fit.per_holder >= 0);
}

}  // namespace
}  // namespace mmserve::scheduler
