// PlanElasticGrowth (elastic_growth.h): reservations, extensions and moves
// of the requests that decode with their KV spread.
#include "scheduler/elastic_growth.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <vector>

namespace mmserve::scheduler {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

int64_t BlocksFor(int64_t tokens, int64_t block_size) {
  return tokens <= 0 ? 0 : (tokens + block_size - 1) / block_size;
}

const ElasticGrowthInstance* Find(const ElasticGrowthState& state, int id) {
  for (const ElasticGrowthInstance& i : state.instances) {
    if (i.id == id) return &i;
  }
  return nullptr;
}

// The holders of `r` were it mastered on `instance`: the old master joins
// them, `instance` leaves them; and the KV tokens it would find there.
std::vector<int> HoldersAfterMove(const ElasticDecodingRequest& r, int instance,
                                  int64_t* kv_there) {
  *kv_there = 0;
  std::vector<int> holders;
  for (size_t k = 0; k < r.holders.size(); ++k) {
    if (r.holders[k] == instance) {
      *kv_there = k < r.holder_kv_tokens.size() ? r.holder_kv_tokens[k] : 0;
    } else {
      holders.push_back(r.holders[k]);
    }
  }
  holders.push_back(r.master);
  return holders;
}

// A new master for `r` from `begin` on, holding `blocks`: the instance
// other than its master with room whose time per token would be least
// (then the most free, then the first listed); instance -1 when none.
struct Candidate {
  int instance = -1;
  double seconds_per_token = kInf;
};
Candidate BestNewMaster(const ElasticGrowthState& state, const ElasticDecodingRequest& r,
                        int64_t blocks, const std::map<int, int64_t>& free,
                        const std::set<int>& excluded, const DecodeStepModel& model) {
  Candidate best;
  int64_t best_free = -1;
  for (const ElasticGrowthInstance& i : state.instances) {
    if (i.id == r.master || excluded.count(i.id) > 0) continue;
    const int64_t room = free.at(i.id);
    if (room < blocks) continue;
    int64_t kv_there = 0;
    const std::vector<int> holders = HoldersAfterMove(r, i.id, &kv_there);
    const double t = SecondsPerToken(state, i.id, r.id, holders, kv_there, model);
    if (t < best.seconds_per_token || (t == best.seconds_per_token && room > best_free)) {
      best = {.instance = i.id, .seconds_per_token = t};
      best_free = room;
    }
  }
  return best;
}

// Seconds until `r`'s reservation is full: at its measured rate, else at
// the model's.
double SecondsOfHeadroom(const ElasticGrowthState& state, const ElasticDecodingRequest& r,
                         const DecodeStepModel& model) {
  double rate = r.tokens_per_second;
  if (rate <= 0) {
    const double t = SecondsPerToken(state, r.master, r.id, r.holders, r.master_kv_tokens, model);
    rate = t > 0 ? 1.0 / t : kInf;
  }
  const int64_t headroom = std::max<int64_t>(0, r.reserved_end - r.kv_tokens);
  return static_cast<double>(headroom) / rate;
}

}  // namespace

int64_t GrowthWindow(const ElasticDecodingRequest& r, const ElasticGrowthConfig& config) {
  const double during_extension =
      std::ceil(std::max(0.0, r.tokens_per_second) * std::max(0.0, config.extend_seconds));
  const int64_t window =
      std::max<int64_t>(config.lookahead_steps, static_cast<int64_t>(during_extension));
  return std::max<int64_t>(0, std::min(window, r.remaining_tokens));
}

double SecondsPerToken(const ElasticGrowthState& state, int instance, uint64_t exclude,
                       const std::vector<int>& holders, int64_t master_kv_tokens,
                       const DecodeStepModel& model) {
  // The instance's steps: its ordinary batch, and one per holder set.
  struct Step {
    int64_t rows = 0, kv = 0, holders = 0;
  };
  std::map<std::vector<int>, Step> steps;
  if (const ElasticGrowthInstance* i = Find(state, instance); i != nullptr && i->batch_rows > 0) {
    steps[{}] = {.rows = i->batch_rows, .kv = i->batch_kv_tokens};
  }
  auto add = [&](std::vector<int> set, int64_t kv) {
    std::sort(set.begin(), set.end());
    Step& s = steps[set];
    s.rows += 1;
    s.kv += kv;
    s.holders = static_cast<int64_t>(set.size());
  };
  for (const ElasticDecodingRequest& r : state.requests) {
    if (r.master == instance && r.id != exclude) add(r.holders, r.master_kv_tokens);
  }
  add(holders, master_kv_tokens);
  double seconds = 0;
  for (const auto& [set, s] : steps) seconds += model.Predict(s.rows, s.kv, s.holders);
  return seconds;
}

std::vector<ElasticGrowthAction> PlanElasticGrowth(const ElasticGrowthState& state,
                                                   const ElasticGrowthConfig& config) {
  using Kind = ElasticGrowthAction::Kind;
  std::vector<ElasticGrowthAction> actions;
  if (config.block_size <= 0) return actions;
  const int64_t bs = config.block_size;
  std::map<int, int64_t> free;
  for (const ElasticGrowthInstance& i : state.instances) free[i.id] = i.free_blocks;

  std::vector<const ElasticDecodingRequest*> order;
  for (const ElasticDecodingRequest& r : state.requests) {
    if (free.count(r.master) == 0) continue;  // its master left the pool: not ours to grow
    order.push_back(&r);
  }
  std::map<uint64_t, double> headroom;
  for (const ElasticDecodingRequest* r : order) {
    headroom[r->id] = SecondsOfHeadroom(state, *r, config.decode);
  }
  std::stable_sort(order.begin(), order.end(),
                   [&](const ElasticDecodingRequest* a, const ElasticDecodingRequest* b) {
                     return headroom[a->id] < headroom[b->id];
                   });

  // Instances that gained a master this iteration take no move (the next
  // iteration prices them with it).
  std::set<int> gained;
  for (const ElasticDecodingRequest* rp : order) {
    const ElasticDecodingRequest& r = *rp;
    const int64_t window = GrowthWindow(r, config);
    if (window == 0 || r.next_master_ready) continue;
    const int64_t need_end = r.kv_tokens + window;
    if (r.reserved_end < need_end) {
      const int64_t blocks = BlocksFor(need_end - r.reserved_end, bs);
      if (free[r.master] >= blocks) {
        free[r.master] -= blocks;
        actions.push_back({.kind = Kind::kReserve,
                           .id = r.id,
                           .instance = r.master,
                           .begin = r.reserved_end,
                           .end = r.reserved_end + blocks * bs});
        continue;
      }
      const Candidate c = BestNewMaster(state, r, blocks, free, {}, config.decode);
      if (c.instance >= 0) {
        free[c.instance] -= blocks;
        gained.insert(c.instance);
        actions.push_back({.kind = Kind::kExtend,
                           .id = r.id,
                           .instance = c.instance,
                           .begin = r.reserved_end,
                           .end = r.reserved_end + blocks * bs});
      } else if (r.reserved_end <= r.kv_tokens) {
        actions.push_back({.kind = Kind::kOutOfKv, .id = r.id, .instance = r.master});
      }
      // Else it decodes what it reserved; blocks may free before it is full.
      continue;
    }
    // Reserved enough: a move only when it pays. It takes effect at the
    // master's next block boundary (a decode range begins on one).
    const int64_t boundary = r.reserved_end - (r.reserved_end - r.kv_tokens) / bs * bs;
    const int64_t left = r.remaining_tokens - (boundary - r.kv_tokens);
    if (left <= 0) continue;
    const int64_t blocks = BlocksFor(std::min(window, left), bs);
    const Candidate c = BestNewMaster(state, r, blocks, free, gained, config.decode);
    if (c.instance < 0) continue;
    const double now =
        SecondsPerToken(state, r.master, r.id, r.holders, r.master_kv_tokens, config.decode);
    const bool faster = c.seconds_per_token < (1.0 - config.move_margin) * now;
    const bool pays =
        (now - c.seconds_per_token) * static_cast<double>(left) > config.extend_seconds;
    if (!faster || !pays) continue;
    free[c.instance] -= blocks;
    free[r.master] += (r.reserved_end - boundary) / bs;
    gained.insert(c.instance);
    actions.push_back({.kind = Kind::kMove,
                       .id = r.id,
                       .instance = c.instance,
                       .begin = boundary,
                       .end = boundary + blocks * bs});
  }
  return actions;
}

}  // namespace mmserve::scheduler
