// Randomized property tests: thousands of small random workloads (random
// lengths, arrivals, shared prefixes, images, aborts in every
// state, tiny KV pools that force preemption, chunking and the prefill budget
// on and off), with the scheduler's rules checked after every step. A fake
// model writes, for every computed position, a value that identifies the
// exact prefix (tokens and images) into the position's KV slot, and every
// step first checks that each scheduled request's computed positions still
// hold its own values: prefix hits, sharing and eviction never hand out wrong
// or overwritten KV.
#include <catch2/catch.hpp>
#include <cstdio>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "scheduler/scheduler.h"

namespace mmserve {
namespace scheduler {
namespace {

constexpr TokenId kImageToken = 9999;
constexpr int kMaxSteps = 20000;

class Rng {
 public:
  explicit Rng(uint64_t seed) : gen_(seed) {}
  // Uniform in [lo, hi] (portable: no std distributions).
  int Int(int lo, int hi) { return lo + static_cast<int>(gen_() % uint64_t(hi - lo + 1)); }
  bool Chance(double p) { return (gen_() >> 11) * 0x1.0p-53 < p; }

 private:
  std::mt19937_64 gen_;
};

struct Planned {
  RequestParams params;
  int arrival_step = 0;
};

struct Workload {
  SchedulerConfig config;
  std::vector<Planned> requests;  // sorted by arrival_step
};

SchedulerConfig RandomConfig(Rng& rng) {
  SchedulerConfig c;
  c.kv.block_size = std::vector<int>{1, 2, 4, 8}[rng.Int(0, 3)];
  // From pools too small for some requests (rejected) to roomy ones; small
  // pools force preemption.
  c.kv.num_blocks = std::max(2, rng.Int(16, 160) / c.kv.block_size);
  c.kv.enable_prefix_caching = !rng.Chance(0.2);
  c.max_num_batched_tokens = rng.Int(1, 64);
  c.max_num_seqs = rng.Int(1, 8);
  c.enable_chunked_prefill = rng.Chance(0.5);
  if (rng.Chance(0.5)) c.max_prefill_tokens = rng.Int(1, 48);
  return c;
}

Planned RandomRequest(Rng& rng, const std::vector<std::vector<TokenId>>& families, uint64_t id,
                      int arrival_step) {
  Planned p;
  p.arrival_step = arrival_step;
  RequestParams& r = p.params;
  r.id = RequestId{id};
  // A shared prefix from a small family (prefix-cache hits), then a random tail.
  const std::vector<TokenId>& base = families[rng.Int(0, int(families.size()) - 1)];
  const int shared = rng.Chance(0.6) ? rng.Int(0, int(base.size())) : 0;
  r.prompt_token_ids.assign(base.begin(), base.begin() + shared);
  const int tail = rng.Int(shared == 0 ? 1 : 0, 12);
  for (int i = 0; i < tail; ++i) r.prompt_token_ids.push_back(rng.Int(0, 30));
  if (rng.Chance(0.25)) {  // an image: a run of identical placeholders
    const int len = rng.Int(1, 10);
    const int offset = rng.Int(0, int(r.prompt_token_ids.size()));
    r.prompt_token_ids.insert(r.prompt_token_ids.begin() + offset, len, kImageToken);
    r.mm_spans.push_back({offset, len, HashBytes(rng.Chance(0.5) ? "cat.png" : "dog.png")});
  }
  r.max_tokens = rng.Int(1, 12);
  if (rng.Chance(0.5)) r.eos_token_id = 0;
  r.ignore_eos = rng.Chance(0.2);
  if (rng.Chance(0.3)) r.stop_token_ids = {TokenId(rng.Int(1, 30))};
  return p;
}

Workload RandomWorkload(Rng& rng) {
  Workload w;
  w.config = RandomConfig(rng);
  std::vector<std::vector<TokenId>> families(3);
  for (auto& f : families) {
    f.resize(rng.Int(1, 40));
    for (TokenId& t : f) t = rng.Int(0, 30);
  }
  const int n = rng.Int(1, 24);
  int step = 0;
  for (int i = 0; i < n; ++i) {
    step += rng.Chance(0.5) ? 0 : rng.Int(1, 4);
    w.requests.push_back(RandomRequest(rng, families, uint64_t(i + 1), step));
  }
  return w;
}

// The value a correct model leaves in the KV slot of every position of a
// sequence: it identifies the whole prefix up to that position, images
// included (an image token's KV depends on the image and its index in it).
std::vector<uint64_t> PrefixValues(const Request& r) {
  std::vector<uint64_t> v(r.num_total_tokens());
  uint64_t h = 0x5eed;
  for (int p = 0; p < r.num_total_tokens(); ++p) {
    h = HashCombine(h, static_cast<uint64_t>(r.token_ids()[p]));
    for (const kvpool::MultimodalSpan& s : r.params().mm_spans) {
      if (p >= s.offset && p < s.offset + s.length) {
        h = HashCombine(HashCombine(h, s.content_hash.low), uint64_t(p - s.offset));
      }
    }
    v[p] = h;
  }
  return v;
}

struct Totals {
  int64_t workloads = 0, steps = 0, requests = 0, rejected = 0, finished = 0, aborted = 0;
  int64_t preemptions = 0, lone_oversize = 0, hit_tokens = 0, scheduled_tokens = 0;
};

class Simulator {
 public:
  Simulator(const Workload& w, Rng& rng, Totals& totals) : w_(w), rng_(rng), totals_(totals) {
    auto s = Scheduler::Create(w.config);
    REQUIRE(s.ok());
    s_ = std::move(*s);
    kv_store_.assign(size_t(w.config.kv.num_blocks) * w.config.kv.block_size, 0);
  }

  void Run() {
    while (next_arrival_ < w_.requests.size() || s_->has_unfinished()) {
      REQUIRE(step_ < kMaxSteps);  // every request eventually finishes
      Arrive();
      MaybeAbort();
      const SchedulerOutput& out = s_->Schedule();
      CheckOutput(out);
      CheckAndWriteKv(out);
      std::vector<TokenId> sampled = Sample(out);
      if (!out.scheduled.empty() && rng_.Chance(0.03)) {  // abort while the step is pending
        Abort(out.scheduled[rng_.Int(0, int(out.scheduled.size()) - 1)].request->id().value);
      }
      std::vector<std::unique_ptr<Request>> finished;
      REQUIRE(s_->UpdateFromOutput(sampled, &finished).ok());
      for (const auto& r : finished) CheckFinished(*r);
      absl::Status inv = s_->CheckInvariants();
      INFO("step " << step_ << ": " << inv.ToString());
      REQUIRE(inv.ok());
      ++step_;
    }
    // No leak once every request has ended.
    REQUIRE(live_.empty());
    REQUIRE(s_->kv_cache().stats().num_used_blocks == 0);
    REQUIRE(s_->kv_cache().num_free_blocks() == w_.config.kv.num_blocks);
    REQUIRE(s_->kv_cache().num_tables() == 0);
    totals_.workloads++;
    totals_.steps += step_;
    totals_.preemptions += s_->num_preemptions();
    totals_.hit_tokens += s_->kv_cache().stats().prefix_hit_tokens;
  }

 private:
  void Arrive() {
    for (; next_arrival_ < w_.requests.size() && w_.requests[next_arrival_].arrival_step <= step_;
         ++next_arrival_) {
      const Planned& p = w_.requests[next_arrival_];
      const int64_t kv_tokens = int64_t(p.params.prompt_token_ids.size()) + p.params.max_tokens - 1;
      const bool fits = s_->kv_cache().BlocksFor(kv_tokens) <= w_.config.kv.num_blocks;
      absl::Status st = s_->AddRequest(p.params);
      totals_.requests++;
      if (!fits) {
        REQUIRE(st.code() == absl::StatusCode::kResourceExhausted);
        totals_.rejected++;
        continue;
      }
      REQUIRE(st.ok());
      const uint64_t id = p.params.id.value;
      arrival_order_[id] = next_order_++;
      live_.push_back(id);
      if (rng_.Chance(0.05)) {
        REQUIRE(s_->AddRequest(p.params).code() == absl::StatusCode::kAlreadyExists);
      }
    }
  }

  void MaybeAbort() {
    if (!live_.empty() && rng_.Chance(0.05)) Abort(live_[rng_.Int(0, int(live_.size()) - 1)]);
    if (rng_.Chance(0.01)) {
      REQUIRE(s_->Abort(RequestId{999999}).code() == absl::StatusCode::kNotFound);
    }
  }

  void Abort(uint64_t id) {
    REQUIRE(s_->Abort(RequestId{id}).ok());
    REQUIRE(s_->Find(RequestId{id}) == nullptr);
    Forget(id);
    totals_.aborted++;
  }

  void Forget(uint64_t id) { live_.erase(std::find(live_.begin(), live_.end(), id)); }

  void CheckBudgets(const SchedulerOutput& out) {
    const SchedulerConfig& c = w_.config;
    int tokens = 0, prefill = 0, prefill_entries = 0;
    for (const ScheduledRequest& e : out.scheduled) {
      tokens += e.num_tokens;
      prefill += e.is_prefill ? e.num_tokens : 0;
      prefill_entries += e.is_prefill;
    }
    REQUIRE(tokens == out.num_batched_tokens);
    REQUIRE(prefill == out.num_prefill_tokens);
    REQUIRE(int(out.scheduled.size()) <= c.max_num_seqs);
    if (out.lone_oversize_prefill) REQUIRE_FALSE(c.enable_chunked_prefill);
    // The only exceptions: the lone-oversize prompt.
    if (tokens > c.max_num_batched_tokens) {
      REQUIRE(out.lone_oversize_prefill);
      REQUIRE(out.scheduled.size() == 1);
    }
    if (c.max_prefill_tokens && prefill > *c.max_prefill_tokens) {
      REQUIRE(out.lone_oversize_prefill);
      REQUIRE(prefill_entries == 1);
    }
    totals_.lone_oversize += out.lone_oversize_prefill;
    totals_.scheduled_tokens += tokens;
  }

  void CheckEntries(const SchedulerOutput& out) {
    absl::flat_hash_set<uint64_t> ids;
    for (const ScheduledRequest& e : out.scheduled) {
      const Request& r = *e.request;
      REQUIRE(ids.insert(r.id().value).second);  // no request twice
      REQUIRE(r.status() == RequestStatus::kRunning);
      REQUIRE(e.num_tokens >= 1);
      REQUIRE(e.num_computed_tokens == r.num_computed_tokens());
      REQUIRE(e.num_computed_tokens + e.num_tokens <= r.num_total_tokens());
      REQUIRE(e.samples == (e.num_computed_tokens + e.num_tokens == r.num_total_tokens()));
      if (!w_.config.enable_chunked_prefill && e.is_prefill) REQUIRE(e.samples);
    }
    for (RequestId id : out.preempted) {
      REQUIRE(s_->Find(id)->status() == RequestStatus::kPreempted);
      REQUIRE_FALSE(ids.contains(id.value));
    }
  }

  // FIFO: a request is first admitted only if no earlier-arrived ready request
  // is still waiting, and no preempted request is waiting to go first.
  // Liveness: a step schedules nothing only if nothing is live.
  void CheckOrderAndProgress(const SchedulerOutput& out) {
    for (const ScheduledRequest& e : out.scheduled) {
      const uint64_t id = e.request->id().value;
      if (!admitted_once_.insert(id).second) continue;
      for (uint64_t other : live_) {
        const RequestStatus st = s_->Find(RequestId{other})->status();
        REQUIRE(st != RequestStatus::kPreempted);
        if (arrival_order_[other] < arrival_order_[id]) REQUIRE(st != RequestStatus::kWaiting);
      }
    }
    if (!out.scheduled.empty()) return;
    REQUIRE(live_.empty());
  }

  void CheckOutput(const SchedulerOutput& out) {
    CheckBudgets(out);
    CheckEntries(out);
    CheckOrderAndProgress(out);
  }

  // Every computed position of a scheduled request must still hold its own
  // prefix value; then the fake model writes the newly computed positions.
  void CheckAndWriteKv(const SchedulerOutput& out) {
    const kvpool::KvCacheManager& kv = s_->kv_cache();
    for (const ScheduledRequest& e : out.scheduled) {
      const Request& r = *e.request;
      REQUIRE(int64_t(kv.block_table(r.block_table()).size()) * kv.block_size() >=
              e.num_computed_tokens + e.num_tokens);
      const std::vector<uint64_t> values = PrefixValues(r);
      for (int p = 0; p < e.num_computed_tokens; ++p) {
        REQUIRE(kv_store_[kv.Slot(r.block_table(), p)] == values[p]);
      }
      for (int p = e.num_computed_tokens; p < e.num_computed_tokens + e.num_tokens; ++p) {
        kv_store_[kv.Slot(r.block_table(), p)] = values[p];
      }
    }
  }

  std::vector<TokenId> Sample(const SchedulerOutput& out) {
    std::vector<TokenId> sampled;
    for (const ScheduledRequest& e : out.scheduled) {
      sampled.push_back(e.samples ? TokenId(rng_.Int(0, 30)) : kvpool::kNoToken);
    }
    return sampled;
  }

  void CheckFinished(const Request& r) {
    REQUIRE(r.status() == RequestStatus::kFinished);
    REQUIRE(r.num_output_tokens() >= 1);
    REQUIRE(r.num_output_tokens() <= r.params().max_tokens);
    const TokenId last = r.output_token_ids().back();
    const auto& stops = r.params().stop_token_ids;
    const bool stop_token = (!r.params().ignore_eos && last == r.params().eos_token_id) ||
                            std::find(stops.begin(), stops.end(), last) != stops.end();
    if (r.finish_reason() == FinishReason::kStop) REQUIRE(stop_token);
    if (r.finish_reason() == FinishReason::kLength) {
      REQUIRE_FALSE(stop_token);
      REQUIRE(r.num_output_tokens() == r.params().max_tokens);
    }
    Forget(r.id().value);
    totals_.finished++;
  }

  const Workload& w_;
  Rng& rng_;
  Totals& totals_;
  std::unique_ptr<Scheduler> s_;
  size_t next_arrival_ = 0;
  int step_ = 0;
  int next_order_ = 0;
  absl::flat_hash_map<uint64_t, int> arrival_order_;
  std::vector<uint64_t> live_;  // ids live in the scheduler, by arrival
  absl::flat_hash_set<uint64_t> admitted_once_;
  std::vector<uint64_t> kv_store_;  // the fake KV, one value per slot
};

TEST_CASE("random workloads keep every scheduling rule after every step", "[property]") {
  constexpr uint64_t kSeeds[] = {1, 7, 42, 1234, 5150, 90210, 271828, 314159};
  constexpr int kIterationsPerSeed = 400;
  for (uint64_t seed : kSeeds) {
    Totals t;
    Rng rng(seed);
    for (int i = 0; i < kIterationsPerSeed; ++i) {
      INFO("seed " << seed << " iteration " << i);
      Workload w = RandomWorkload(rng);
      Simulator(w, rng, t).Run();
    }
    std::printf(
        "[property] seed=%llu iterations=%d steps=%lld requests=%lld rejected=%lld "
        "finished=%lld aborted=%lld preemptions=%lld lone_oversize=%lld prefix_hit_tokens=%lld "
        "scheduled_tokens=%lld\n",
        (unsigned long long)seed, kIterationsPerSeed, (long long)t.steps, (long long)t.requests,
        (long long)t.rejected, (long long)t.finished, (long long)t.aborted,
        (long long)t.preemptions, (long long)t.lone_oversize, (long long)t.hit_tokens,
        (long long)t.scheduled_tokens);
    std::fflush(stdout);
    CHECK(t.workloads == kIterationsPerSeed);
    CHECK(t.finished + t.aborted + t.rejected == t.requests);
  }
}

}  // namespace
}  // namespace scheduler
}  // namespace mmserve
