// Steps 3 and 4 of the elastic manager (elastic_manager.h): the batching dynamic
// program and the retention plan.
#include <algorithm>
#include <limits>
#include <numeric>
#include <vector>

#include "scheduler/elastic_manager.h"

namespace mmserve::scheduler {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Indices 0..n-1 sorted by key descending, ties by index.
template <typename Key>
std::vector<size_t> OrderDescending(size_t n, Key key) {
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return key(a) > key(b); });
  return order;
}

// Prefix sums over the sorted requests and instances.
struct Prefix {
  std::vector<int64_t> footprint, tokens, free;
  std::vector<double> inverse_len;
};

Prefix Sums(const std::vector<ElasticPendingRequest>& requests, const std::vector<size_t>& by_req,
            const std::vector<ElasticInstanceState>& instances, const std::vector<size_t>& by_inst,
            int64_t block_size) {
  Prefix p;
  p.footprint = {0};
  p.tokens = {0};
  p.inverse_len = {0};
  for (size_t r : by_req) {
    p.footprint.push_back(p.footprint.back() + FootprintBlocks(requests[r], block_size));
    p.tokens.push_back(p.tokens.back() + requests[r].input_len);
    p.inverse_len.push_back(p.inverse_len.back() +
                            1.0 / static_cast<double>(std::max<int64_t>(1, requests[r].input_len)));
  }
  p.free = {0};
  for (size_t i : by_inst) p.free.push_back(p.free.back() + instances[i].free_blocks);
  return p;
}

}  // namespace

int64_t FootprintBlocks(const ElasticPendingRequest& r, int64_t block_size) {
  return (r.input_len + r.max_new_tokens + block_size - 1) / block_size;
}

ElasticBatching BatchByDp(const std::vector<ElasticPendingRequest>& requests,
                          const std::vector<ElasticInstanceState>& instances,
                          const ElasticConfig& config) {
  const size_t n = requests.size(), m = instances.size();
  const size_t max_degree = config.per_degree.size();
  const std::vector<size_t> by_req =
      OrderDescending(n, [&](size_t i) { return FootprintBlocks(requests[i], config.block_size); });
  const std::vector<size_t> by_inst =
      OrderDescending(m, [&](size_t i) { return instances[i].free_blocks; });
  const Prefix p = Sums(requests, by_req, instances, by_inst, config.block_size);
  // f[i][k]: requests [0, i) on instances [0, k); from[i][k] = {j, d} of its
  // last batch, d = 0 when instance k-1 is unused.
  std::vector<std::vector<double>> f(n + 1, std::vector<double>(m + 1, kInf));
  std::vector<std::vector<std::pair<size_t, size_t>>> from(
      n + 1, std::vector<std::pair<size_t, size_t>>(m + 1, {0, 0}));
  for (size_t k = 0; k <= m; ++k) f[0][k] = 0;
  for (size_t i = 1; i <= n; ++i) {
    for (size_t k = 1; k <= m; ++k) {
      f[i][k] = f[i][k - 1];
      from[i][k] = {i, 0};
      for (size_t d = 1; d <= std::min(max_degree, k); ++d) {
        const int64_t room = p.free[k] - p.free[k - d];
        const StepTimeModel& t = config.per_degree[d - 1];
        for (size_t j = 0; j < i; ++j) {
          if (p.footprint[i] - p.footprint[j] > room || f[j][k - d] == kInf) continue;
          const double c = f[j][k - d] + t.Predict(p.tokens[i] - p.tokens[j]) *
                                             (p.inverse_len[i] - p.inverse_len[j]);
          if (c < f[i][k]) {
            f[i][k] = c;
            from[i][k] = {j, d};
          }
        }
      }
    }
  }
  ElasticBatching out;
  out.cost = n == 0 ? 0.0 : (m == 0 ? kInf : f[n][m]);
  if (out.cost == kInf) return out;
  for (size_t i = n, k = m; i > 0;) {
    const auto [j, d] = from[i][k];
    if (d == 0) {
      --k;
      continue;
    }
    out.requests.emplace_back();
    out.instances.emplace_back();
    for (size_t r = j; r < i; ++r) out.requests.back().push_back(by_req[r]);
    for (size_t e = k - d; e < k; ++e) out.instances.back().push_back(by_inst[e]);
    i = j;
    k -= d;
  }
  std::reverse(out.requests.begin(), out.requests.end());
  std::reverse(out.instances.begin(), out.instances.end());
  return out;
}

std::vector<ElasticRequestPlan> PlanRetention(const std::vector<ElasticPendingRequest>& requests,
                                              const std::vector<ElasticInstanceState>& instances,
                                              int64_t block_size) {
  const std::vector<size_t> order =
      OrderDescending(instances.size(), [&](size_t i) { return instances[i].free_blocks; });
  std::vector<int64_t> left(instances.size());
  for (size_t i = 0; i < instances.size(); ++i) left[i] = instances[i].free_blocks;
  std::vector<ElasticRequestPlan> plans;
  size_t at = 0;  // the instance being filled
  for (const ElasticPendingRequest& r : requests) {
    ElasticRequestPlan plan{r.id, r.input_len, {}, -1};
    const int64_t total = r.input_len + r.max_new_tokens;
    for (int64_t begin = 0; begin < total;) {
      while (at < order.size() && left[order[at]] == 0) ++at;
      if (at == order.size()) break;  // does not fit: the caller checked it does
      const size_t i = order[at];
      const int64_t end = std::min(total, begin + left[i] * block_size);
      left[i] -= (end - begin + block_size - 1) / block_size;
      plan.spans.push_back({instances[i].id, begin, end});
      begin = end;
    }
    if (!plan.spans.empty()) plan.master = plan.spans.back().instance;
    plans.push_back(std::move(plan));
  }
  return plans;
}

}  // namespace mmserve::scheduler
