// PlanElasticGrowth (elastic_growth.h): reservations, extensions and moves
// of the requests that decode with their KV spread.
#include "scheduler/elastic_growth.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <utility>
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

namespace {

// One iteration's free blocks and decisions, request by request.
class Growth {
 public:
  Growth(const ElasticGrowthState& state, const ElasticGrowthConfig& config)
      : state_(state), config_(config), bs_(config.block_size) {
    for (const ElasticGrowthInstance& i : state.instances) free_[i.id] = i.free_blocks;
  }
  bool knows(int instance) const { return free_.count(instance) > 0; }

  // Its window does not fit what it reserved: reserve on the master, else
  // extend, else out of KV once nothing is left.
  void Grow(const ElasticDecodingRequest& r, int64_t need_end) {
    using Kind = ElasticGrowthAction::Kind;
    const int64_t blocks = BlocksFor(need_end - r.reserved_end, bs_);
    const int64_t end = r.reserved_end + blocks * bs_;
    if (free_[r.master] >= blocks) {
      free_[r.master] -= blocks;
      actions_.push_back({Kind::kReserve, r.id, r.master, r.reserved_end, end});
      return;
    }
    const Candidate c = BestNewMaster(state_, r, blocks, free_, {}, config_.decode);
    if (c.instance >= 0) {
      free_[c.instance] -= blocks;
      gained_.insert(c.instance);
      actions_.push_back({Kind::kExtend, r.id, c.instance, r.reserved_end, end});
    } else if (r.reserved_end <= r.kv_tokens) {
      actions_.push_back({Kind::kOutOfKv, r.id, r.master, 0, 0});
    }
    // Else it decodes what it reserved; blocks may free before it is full.
  }

  // Its window is reserved: a move when it pays. It takes effect at the
  // master's next block boundary (a decode range begins on one).
  void MaybeMove(const ElasticDecodingRequest& r, int64_t window) {
    const int64_t boundary = r.reserved_end - (r.reserved_end - r.kv_tokens) / bs_ * bs_;
    const int64_t left = r.remaining_tokens - (boundary - r.kv_tokens);
    if (left <= 0) return;
    const int64_t blocks = BlocksFor(std::min(window, left), bs_);
    const Candidate c = BestNewMaster(state_, r, blocks, free_, gained_, config_.decode);
    if (c.instance < 0) return;
    const double now =
        SecondsPerToken(state_, r.master, r.id, r.holders, r.master_kv_tokens, config_.decode);
    const bool faster = c.seconds_per_token < (1.0 - config_.move_margin) * now;
    const bool pays =
        (now - c.seconds_per_token) * static_cast<double>(left) > config_.extend_seconds;
    if (!faster || !pays) return;
    free_[c.instance] -= blocks;
    free_[r.master] += (r.reserved_end - boundary) / bs_;
    gained_.insert(c.instance);
    actions_.push_back(
        {ElasticGrowthAction::Kind::kMove, r.id, c.instance, boundary, boundary + blocks * bs_});
  }

  std::vector<ElasticGrowthAction> Take() { return std::move(actions_); }

 private:
  const ElasticGrowthState& state_;
  const ElasticGrowthConfig& config_;
  const int64_t bs_;
  std::map<int, int64_t> free_;
  // Instances that gained a master this iteration take no move (the next
  // iteration prices them with it).
  std::set<int> gained_;
  std::vector<ElasticGrowthAction> actions_;
};

}  // namespace

std::vector<ElasticGrowthAction> PlanElasticGrowth(const ElasticGrowthState& state,
                                                   const ElasticGrowthConfig& config) {
  if (config.block_size <= 0) return {};
  Growth growth(state, config);
  std::vector<const ElasticDecodingRequest*> order;
  std::map<uint64_t, double> headroom;
  for (const ElasticDecodingRequest& r : state.requests) {
    if (!growth.knows(r.master)) continue;  // its master left the pool: not ours to grow
    order.push_back(&r);
    headroom[r.id] = SecondsOfHeadroom(state, r, config.decode);
  }
  std::stable_sort(order.begin(), order.end(),
                   [&](const ElasticDecodingRequest* a, const ElasticDecodingRequest* b) {
                     return headroom[a->id] < headroom[b->id];
                   });
  for (const ElasticDecodingRequest* r : order) {
    const int64_t window = GrowthWindow(*r, config);
    if (window == 0 || r->next_master_ready) continue;
    const int64_t need_end = r->kv_tokens + window;
    if (r->reserved_end < need_end) {
      growth.Grow(*r, need_end);
    } else {
      growth.MaybeMove(*r, window);
    }
  }
  return growth.Take();
}

}  // namespace mmserve::scheduler
