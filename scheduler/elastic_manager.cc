// Steps 1 and 2 of the elastic manager (elastic_manager.h) and the iteration that
// chains all four.
#include "scheduler/elastic_manager.h"

#include <algorithm>
#include <limits>
#include <numeric>
#include <vector>

namespace mmserve::scheduler {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Instances for prefills whose KV needs `blocks`: every idle one (most free
// first), then instances with decode batches, most free first, while the
// blocks do not fit.
std::vector<size_t> Allocate(const std::vector<ElasticInstanceState>& instances, int64_t blocks) {
  std::vector<size_t> idle, busy;
  for (size_t i = 0; i < instances.size(); ++i) (instances[i].idle() ? idle : busy).push_back(i);
  auto most_free = [&](size_t a, size_t b) {
    return instances[a].free_blocks > instances[b].free_blocks;
  };
  std::stable_sort(idle.begin(), idle.end(), most_free);
  std::stable_sort(busy.begin(), busy.end(), most_free);
  int64_t room = 0;
  for (size_t i : idle) room += instances[i].free_blocks;
  for (size_t i : busy) {
    if (room >= blocks) break;
    idle.push_back(i);
    room += instances[i].free_blocks;
  }
  return idle;
}

int64_t FreeOf(const std::vector<ElasticInstanceState>& instances,
               const std::vector<size_t>& which) {
  int64_t sum = 0;
  for (size_t i : which) sum += instances[i].free_blocks;
  return sum;
}

// The prefill step's predicted time on a group of `group` instances (at the
// largest modelled degree beyond it).
double PredictPrefill(const ElasticConfig& config, size_t group, int64_t tokens) {
  const size_t degree = std::min(group, config.per_degree.size());
  if (degree == 0) return kInf;
  return config.per_degree[degree - 1].Predict(tokens);
}

// The rule for pausing the decode batches of `paused` to prefill r:
// Cost = T * sum of 1 / output_len of their requests; Gain = (avg decode
// latency - least elapsed)^+ / r.input_len.
bool WorthPausing(const std::vector<ElasticInstanceState>& instances,
                  const std::vector<size_t>& paused, double prefill_seconds,
                  const ElasticPendingRequest& r, const ElasticConfig& config) {
  double inverse_outputs = 0, least_elapsed = kInf;
  for (size_t i : paused) {
    for (int64_t out : instances[i].decoding_output_lens) {
      inverse_outputs += 1.0 / static_cast<double>(std::max<int64_t>(1, out));
    }
    least_elapsed = std::min(least_elapsed, instances[i].min_decode_elapsed_seconds);
  }
  const double cost = prefill_seconds * inverse_outputs;
  const double gain = std::max(0.0, config.avg_decode_latency - least_elapsed) /
                      static_cast<double>(std::max<int64_t>(1, r.input_len));
  return cost <= gain;
}

// Step 1: how many pending requests, first-come first-served.
size_t Dispatch(const ElasticPoolState& state, const ElasticConfig& config) {
  int64_t pool_free = -state.decode_growth_blocks;
  for (const ElasticInstanceState& i : state.instances) pool_free += i.free_blocks;
  int64_t blocks = 0, tokens = 0;
  std::vector<size_t> group = Allocate(state.instances, 0);
  size_t taken = 0;
  for (const ElasticPendingRequest& r : state.pending) {
    const int64_t more = blocks + FootprintBlocks(r, config.block_size);
    if (more > pool_free) break;
    std::vector<size_t> wider = Allocate(state.instances, more);
    if (FreeOf(state.instances, wider) < more) break;
    const double t = PredictPrefill(config, wider.size(), tokens + r.input_len);
    if (taken > 0 && t > config.max_prefill_seconds) break;
    std::vector<size_t> paused;
    for (size_t i : wider) {
      if (!state.instances[i].idle() && std::find(group.begin(), group.end(), i) == group.end()) {
        paused.push_back(i);
      }
    }
    if (!paused.empty() && !WorthPausing(state.instances, paused, t, r, config)) break;
    blocks = more;
    tokens += r.input_len;
    group = std::move(wider);
    ++taken;
  }
  return taken;
}

}  // namespace

ElasticIterationPlan PlanElasticIteration(const ElasticPoolState& state,
                                          const ElasticConfig& config) {
  ElasticIterationPlan plan;
  if (config.per_degree.empty() || config.block_size <= 0) return plan;
  size_t taken = Dispatch(state, config);
  // Step 2, then 3: the DP may not place a set that fits in sum (runs of
  // instances, the degree limit); then the last request waits.
  for (; taken > 0; --taken) {
    const std::vector<ElasticPendingRequest> requests(state.pending.begin(),
                                                      state.pending.begin() + taken);
    int64_t blocks = 0;
    for (const ElasticPendingRequest& r : requests) blocks += FootprintBlocks(r, config.block_size);
    const std::vector<size_t> group = Allocate(state.instances, blocks);
    std::vector<ElasticInstanceState> offered;
    for (size_t i : group) offered.push_back(state.instances[i]);
    const ElasticBatching b = BatchByDp(requests, offered, config);
    if (b.cost == kInf) continue;
    plan.dispatched = taken;
    plan.cost = b.cost;
    for (size_t k = 0; k < b.requests.size(); ++k) {
      ElasticBatchPlan batch;
      std::vector<ElasticPendingRequest> rs;
      std::vector<ElasticInstanceState> is;
      int64_t batch_tokens = 0;
      for (size_t r : b.requests[k]) {
        rs.push_back(requests[r]);
        batch_tokens += requests[r].input_len;
      }
      for (size_t i : b.instances[k]) {
        is.push_back(offered[i]);
        batch.instances.push_back(offered[i].id);
        if (!offered[i].idle()) plan.paused.push_back(offered[i].id);
      }
      batch.requests = PlanRetention(rs, is, config.block_size);
      batch.predicted_seconds = PredictPrefill(config, is.size(), batch_tokens);
      plan.batches.push_back(std::move(batch));
    }
    break;
  }
  return plan;
}

}  // namespace mmserve::scheduler
