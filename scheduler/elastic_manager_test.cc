#include "scheduler/elastic_manager.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <vector>

namespace mmserve::scheduler {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Degree d: a fixed cost, then work shared by d instances, and a quadratic
// attention term.
ElasticConfig Config(int max_degree, int64_t block_size = 4) {
  ElasticConfig c;
  c.block_size = block_size;
  for (int d = 1; d <= max_degree; ++d) {
    c.per_degree.push_back({0.01 * d, 1e-3 / d, 1e-7 / d});
  }
  c.max_prefill_seconds = 10;
  c.avg_decode_latency = 1.0;
  return c;
}

double BatchCost(const std::vector<ElasticPendingRequest>& rs, const std::vector<size_t>& batch,
                 size_t degree, const ElasticConfig& c) {
  int64_t tokens = 0;
  double inv = 0;
  for (size_t r : batch) {
    tokens += rs[r].input_len;
    inv += 1.0 / static_cast<double>(rs[r].input_len);
  }
  return c.per_degree[degree - 1].Predict(tokens) * inv;
}

// Every way to cut the sorted requests into runs, each on a run of the
// sorted instances (skipping any): the DP's search space, enumerated.
double BruteForceRuns(const std::vector<ElasticPendingRequest>& rs,
                      const std::vector<ElasticInstanceState>& is, const ElasticConfig& c) {
  std::vector<size_t> by_req(rs.size()), by_inst(is.size());
  for (size_t i = 0; i < rs.size(); ++i) by_req[i] = i;
  for (size_t i = 0; i < is.size(); ++i) by_inst[i] = i;
  std::stable_sort(by_req.begin(), by_req.end(), [&](size_t a, size_t b) {
    return FootprintBlocks(rs[a], c.block_size) > FootprintBlocks(rs[b], c.block_size);
  });
  std::stable_sort(by_inst.begin(), by_inst.end(),
                   [&](size_t a, size_t b) { return is[a].free_blocks > is[b].free_blocks; });
  std::function<double(size_t, size_t)> go = [&](size_t i, size_t k) -> double {
    if (i == rs.size()) return 0.0;
    if (k == is.size()) return kInf;
    double best = go(i, k + 1);  // instance k unused
    for (size_t e = i + 1; e <= rs.size(); ++e) {
      int64_t need = 0;
      std::vector<size_t> batch;
      for (size_t r = i; r < e; ++r) {
        need += FootprintBlocks(rs[by_req[r]], c.block_size);
        batch.push_back(by_req[r]);
      }
      int64_t room = 0;
      for (size_t d = 1; d <= c.per_degree.size() && k + d <= is.size(); ++d) {
        room += is[by_inst[k + d - 1]].free_blocks;
        if (need > room) continue;
        best = std::min(best, BatchCost(rs, batch, d, c) + go(e, k + d));
      }
    }
    return best;
  };
  return go(0, 0);
}

// Any assignment of requests to batches and instances to batches or none.
double BruteForceAny(const std::vector<ElasticPendingRequest>& rs,
                     const std::vector<ElasticInstanceState>& is, const ElasticConfig& c) {
  const size_t n = rs.size(), m = is.size();
  std::vector<size_t> label(n + m, 0);  // requests: batch 0..n-1; instances: 0..n (n = none)
  double best = kInf;
  std::function<void(size_t)> go = [&](size_t at) {
    if (at == n + m) {
      double cost = 0;
      for (size_t b = 0; b < n; ++b) {
        std::vector<size_t> batch;
        int64_t need = 0, room = 0;
        size_t degree = 0;
        for (size_t r = 0; r < n; ++r) {
          if (label[r] == b) {
            batch.push_back(r);
            need += FootprintBlocks(rs[r], c.block_size);
          }
        }
        for (size_t i = 0; i < m; ++i) {
          if (label[n + i] == b) {
            ++degree;
            room += is[i].free_blocks;
          }
        }
        if (batch.empty()) continue;
        if (degree == 0 || degree > c.per_degree.size() || need > room) return;
        cost += BatchCost(rs, batch, degree, c);
      }
      best = std::min(best, cost);
      return;
    }
    const size_t labels = at < n ? n : n + 1;
    for (size_t l = 0; l < labels; ++l) {
      label[at] = l;
      go(at + 1);
    }
  };
  go(0);
  return best;
}

struct RandomCase {
  std::vector<ElasticPendingRequest> requests;
  std::vector<ElasticInstanceState> instances;
};

RandomCase MakeCase(std::mt19937& gen, size_t n, size_t m, int64_t max_free) {
  RandomCase c;
  std::uniform_int_distribution<int64_t> len(1, 300), out(0, 40), free(0, max_free);
  for (size_t i = 0; i < n; ++i) c.requests.push_back({i, len(gen), out(gen)});
  for (size_t i = 0; i < m; ++i) {
    ElasticInstanceState s;
    s.id = static_cast<int>(10 + i);
    s.free_blocks = free(gen);
    if (gen() % 3 == 0) {
      s.decoding_output_lens = {static_cast<int64_t>(1 + gen() % 50)};
      s.min_decode_elapsed_seconds = 0.1 * static_cast<double>(gen() % 20);
    }
    c.instances.push_back(s);
  }
  return c;
}

TEST_CASE("the batching DP equals brute force over its search space", "[elastic]") {
  std::mt19937 gen(1);
  int feasible = 0;
  for (int t = 0; t < 300; ++t) {
    const size_t n = 1 + gen() % 5, m = 1 + gen() % 4;
    const ElasticConfig c = Config(1 + static_cast<int>(gen() % 3));
    const RandomCase rc = MakeCase(gen, n, m, /*max_free=*/150);
    const ElasticBatching dp = BatchByDp(rc.requests, rc.instances, c);
    const double brute = BruteForceRuns(rc.requests, rc.instances, c);
    INFO("case " << t);
    if (brute == kInf) {
      CHECK(dp.cost == kInf);
      CHECK(dp.requests.empty());
      continue;
    }
    ++feasible;
    CHECK(dp.cost == Approx(brute).epsilon(1e-12));
    // The reconstructed batches cost what the DP says, and place everyone.
    double sum = 0;
    std::set<size_t> placed, used;
    for (size_t b = 0; b < dp.requests.size(); ++b) {
      int64_t need = 0, room = 0;
      for (size_t r : dp.requests[b]) {
        CHECK(placed.insert(r).second);
        need += FootprintBlocks(rc.requests[r], c.block_size);
      }
      for (size_t i : dp.instances[b]) {
        CHECK(used.insert(i).second);
        room += rc.instances[i].free_blocks;
      }
      CHECK(need <= room);
      sum += BatchCost(rc.requests, dp.requests[b], dp.instances[b].size(), c);
    }
    CHECK(placed.size() == n);
    CHECK(sum == Approx(dp.cost).epsilon(1e-12));
    // Unrestricted assignments can only do as well or better.
    if (n + m <= 7) CHECK(BruteForceAny(rc.requests, rc.instances, c) <= dp.cost * (1 + 1e-12));
  }
  CHECK(feasible > 100);
}

TEST_CASE("a long request goes to a group, short ones alone", "[elastic]") {
  ElasticConfig c = Config(2);
  std::vector<ElasticPendingRequest> rs = {{1, 30, 2}, {2, 3, 1}, {3, 3, 1}};  // 8, 1, 1 blocks
  std::vector<ElasticInstanceState> is(3);
  for (int i = 0; i < 3; ++i) is[i] = {i, 5, {}, 0};
  const ElasticBatching b = BatchByDp(rs, is, c);
  REQUIRE(b.cost < kInf);
  bool long_in_pair = false;
  for (size_t k = 0; k < b.requests.size(); ++k) {
    if (std::count(b.requests[k].begin(), b.requests[k].end(), 0u) == 1) {
      long_in_pair = b.instances[k].size() == 2;
    }
  }
  CHECK(long_in_pair);
}

TEST_CASE("dispatch: FCFS memory check, prefill cap and the cost/gain rule", "[elastic]") {
  ElasticConfig c = Config(2);
  ElasticPoolState s;
  s.instances = {{0, 10, {}, 0}, {1, 10, {}, 0}};
  // 40 + 0 tokens = 10 blocks each; the third does not fit pool-wide.
  s.pending = {{1, 40, 0}, {2, 40, 0}, {3, 4, 0}};
  ElasticIterationPlan p = PlanElasticIteration(s, c);
  CHECK(p.dispatched == 2);    // FCFS: the small third waits behind the refusal
  s.decode_growth_blocks = 5;  // decoding requests' future growth counts too
  CHECK(PlanElasticIteration(s, c).dispatched == 1);
  s.decode_growth_blocks = 0;
  c.max_prefill_seconds = 0.05;  // the first is always allowed, the second exceeds the cap
  CHECK(PlanElasticIteration(s, c).dispatched == 1);

  // One idle instance too small, one decoding: pausing it must pay off.
  ElasticConfig d = Config(2);
  ElasticPoolState busy;
  busy.instances = {{0, 2, {}, 0}, {1, 20, {1}, 0.0}};
  busy.pending = {{7, 40, 0}};
  d.avg_decode_latency = 0.0;  // no gain: the decode batch keeps running
  CHECK(PlanElasticIteration(busy, d).dispatched == 0);
  d.avg_decode_latency = 100.0;  // the request would wait long: pause
  ElasticIterationPlan q = PlanElasticIteration(busy, d);
  CHECK(q.dispatched == 1);
  CHECK(q.paused == std::vector<int>{1});
  busy.instances[1].decoding_output_lens = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
  busy.pending[0].input_len = 4000;  // cost grows with T and the paused requests
  busy.instances[1].free_blocks = 2000;
  d.avg_decode_latency = 1.0;
  CHECK(PlanElasticIteration(busy, d).dispatched == 0);
}

TEST_CASE("retention fills the most free instance first, block-aligned; master holds the tail",
          "[elastic]") {
  std::vector<ElasticInstanceState> is = {{5, 3, {}, 0}, {6, 4, {}, 0}};
  const std::vector<ElasticRequestPlan> plans = PlanRetention({{1, 20, 5}}, is, 4);  // 7 blocks
  REQUIRE(plans.size() == 1);
  REQUIRE(plans[0].spans.size() == 2);
  CHECK(plans[0].spans[0].instance == 6);
  CHECK(plans[0].spans[0].begin == 0);
  CHECK(plans[0].spans[0].end == 16);
  CHECK(plans[0].spans[1].instance == 5);
  CHECK(plans[0].spans[1].begin == 16);
  CHECK(plans[0].spans[1].end == 25);
  CHECK(plans[0].master == 5);
}

TEST_CASE("property: spans cover each context exactly, no pool over capacity, one master",
          "[elastic]") {
  std::mt19937 gen(7);
  int batches = 0, groups = 0;
  for (int t = 0; t < 500; ++t) {
    ElasticConfig c = Config(1 + static_cast<int>(gen() % 4), 1 + static_cast<int64_t>(gen() % 16));
    c.max_prefill_seconds = 0.05 + 0.1 * static_cast<double>(gen() % 10);
    c.avg_decode_latency = 0.5 * static_cast<double>(gen() % 4);
    const RandomCase rc = MakeCase(gen, 1 + gen() % 8, 1 + gen() % 6, /*max_free=*/60);
    ElasticPoolState s{rc.instances, rc.requests, static_cast<int64_t>(gen() % 10)};
    const ElasticIterationPlan p = PlanElasticIteration(s, c);
    INFO("case " << t);
    std::map<int, int64_t> used;
    std::set<int> members;
    std::set<uint64_t> seen;
    int64_t footprint = 0;
    for (const ElasticBatchPlan& b : p.batches) {
      ++batches;
      groups += b.instances.size() > 1;
      CHECK(!b.instances.empty());
      CHECK(b.instances.size() <= c.per_degree.size());
      for (int i : b.instances) CHECK(members.insert(i).second);  // disjoint groups
      for (const ElasticRequestPlan& r : b.requests) {
        CHECK(seen.insert(r.id).second);  // one batch, so one master
        const ElasticPendingRequest& want = s.pending[r.id];
        footprint += FootprintBlocks(want, c.block_size);
        int64_t at = 0;
        for (const ElasticSpan& span : r.spans) {
          CHECK(span.begin == at);
          CHECK(span.end > span.begin);
          CHECK(span.begin % c.block_size == 0);
          CHECK(std::count(b.instances.begin(), b.instances.end(), span.instance) == 1);
          used[span.instance] += (span.end - span.begin + c.block_size - 1) / c.block_size;
          at = span.end;
        }
        CHECK(at == want.input_len + want.max_new_tokens);
        CHECK(r.master == r.spans.back().instance);
      }
    }
    CHECK(seen.size() == p.dispatched);
    for (size_t i = 0; i < p.dispatched; ++i) CHECK(seen.count(s.pending[i].id) == 1);
    int64_t pool = -s.decode_growth_blocks;
    for (const ElasticInstanceState& i : s.instances) {
      CHECK(used[i.id] <= i.free_blocks);
      pool += i.free_blocks;
    }
    CHECK(footprint <= std::max<int64_t>(0, pool));
    for (int i : p.paused) CHECK(members.count(i) == 1);
  }
  CHECK(batches > 200);
  CHECK(groups > 20);
}

TEST_CASE("the step-time fit recovers a quadratic and degrades to fewer samples", "[elastic]") {
  const StepTimeModel truth{0.02, 3e-4, 5e-9};
  std::vector<StepSample> samples;
  for (int64_t s : {128, 512, 2048, 8192, 32768}) samples.push_back({s, truth.Predict(s)});
  const StepTimeModel fit = FitStepTimeModel(samples);
  CHECK(fit.a == Approx(truth.a).epsilon(1e-6));
  CHECK(fit.b == Approx(truth.b).epsilon(1e-6));
  CHECK(fit.c == Approx(truth.c).epsilon(1e-6));
  const StepTimeModel line = FitStepTimeModel({{100, 1.0}, {300, 2.0}});
  CHECK(line.a == Approx(0.5));
  CHECK(line.b == Approx(0.005));
  CHECK(line.c == 0);
  const StepTimeModel one = FitStepTimeModel({{100, 0.3}, {100, 0.5}});
  CHECK(one.a == Approx(0.4));
  CHECK(one.b == 0);
  CHECK(FitStepTimeModel({}).Predict(1000) == 0);
}

// The optimality (KKT) conditions of non-negative least squares at `m`:
// the squared error's gradient is 0 along each positive coefficient and
// not negative along each coefficient held at 0.
void CheckNonNegativeOptimum(const StepTimeModel& m, const std::vector<StepSample>& samples) {
  const double coef[3] = {m.a, m.b, m.c};
  double grad[3] = {0, 0, 0}, scale[3] = {0, 0, 0};
  for (const StepSample& s : samples) {
    const double x = static_cast<double>(s.tokens);
    const double r = m.Predict(s.tokens) - s.seconds;
    const double p[3] = {1, x, x * x};
    for (int i = 0; i < 3; ++i) {
      grad[i] += r * p[i];
      scale[i] += std::fabs(s.seconds) * p[i];
    }
  }
  for (int i = 0; i < 3; ++i) {
    INFO("coefficient " << i << " = " << coef[i] << ", gradient " << grad[i]);
    CHECK(coef[i] >= 0);
    if (coef[i] > 0) CHECK(std::fabs(grad[i]) <= 1e-9 * scale[i]);
    if (coef[i] == 0) CHECK(grad[i] >= -1e-9 * scale[i]);
  }
}

TEST_CASE("the step-time fit holds coefficients at 0 rather than go negative", "[elastic]") {
  // A line with a negative intercept: the plain fit's a < 0.
  std::vector<StepSample> line;
  for (int64_t s : {200, 400, 800, 1600}) line.push_back({s, 1e-4 * static_cast<double>(s - 100)});
  const StepTimeModel l = FitStepTimeModel(line);
  CHECK(l.a == 0);
  CheckNonNegativeOptimum(l, line);
  // Concave (a square root): the plain fit's c < 0.
  std::vector<StepSample> root;
  for (int64_t s : {256, 512, 1024, 2048, 4096}) {
    root.push_back({s, 1e-3 * std::sqrt(static_cast<double>(s))});
  }
  const StepTimeModel r = FitStepTimeModel(root);
  CHECK(r.c == 0);
  CheckNonNegativeOptimum(r, root);
  // Noisy quadratics, whichever coefficients the noise pushes below 0.
  std::mt19937 rng(7);
  std::normal_distribution<double> noise(0, 1);
  for (int trial = 0; trial < 200; ++trial) {
    const StepTimeModel truth{1e-3 * std::fabs(noise(rng)), 1e-5 * std::fabs(noise(rng)),
                              1e-9 * std::fabs(noise(rng))};
    std::vector<StepSample> samples;
    for (int64_t s : {128, 256, 512, 1024, 2048, 4096}) {
      samples.push_back({s, truth.Predict(s) * (1 + 0.2 * noise(rng))});
    }
    CheckNonNegativeOptimum(FitStepTimeModel(samples), samples);
  }
}

}  // namespace
}  // namespace mmserve::scheduler
