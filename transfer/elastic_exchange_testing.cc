#include "transfer/elastic_exchange_testing.h"

namespace mmserve::transfer {

std::vector<std::vector<int64_t>> ElasticStripes(int members, int64_t len) {
  std::vector<std::vector<int64_t>> rows(members);
  for (int64_t i = 0; i < len; ++i) rows[i % members].push_back(i);
  return rows;
}

float ElasticTestValue(int layer, int kv, int64_t row, int64_t lane, int64_t width) {
  return static_cast<float>(layer * 100000 + kv * 50000 + row * width + lane) * 0.5f;
}

absl::Status ElasticRunLayer(UcxElasticExchange& ex, const UcxElasticExchange::Plan& plan, int self,
                             int layer, bool* all_equal) {
  const std::vector<int64_t>& rows = plan.rows[self];
  const int64_t w = plan.kv_width;
  std::vector<float> k(rows.size() * w), v(rows.size() * w);
  for (size_t i = 0; i < rows.size(); ++i) {
    for (int64_t c = 0; c < w; ++c) {
      k[i * w + c] = ElasticTestValue(layer, 0, rows[i], c, w);
      v[i * w + c] = ElasticTestValue(layer, 1, rows[i], c, w);
    }
  }
  const float* k_all = nullptr;
  const float* v_all = nullptr;
  absl::Status s = ex.AllGather(layer, rows, k.data(), v.data(), &k_all, &v_all);
  if (!s.ok()) {
    ex.Abort();
    return s;
  }
  *all_equal = true;
  for (int64_t r = 0; r < plan.prompt_len; ++r) {
    for (int64_t c = 0; c < w; ++c) {
      *all_equal &= k_all[r * w + c] == ElasticTestValue(layer, 0, r, c, w) &&
                    v_all[r * w + c] == ElasticTestValue(layer, 1, r, c, w);
    }
  }
  return absl::OkStatus();
}

}  // namespace mmserve::transfer
