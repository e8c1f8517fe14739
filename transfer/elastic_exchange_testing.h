// Test-only helpers of the elastic K/V exchange tests (in-process and
// multi-process): the striped plan and one layer with known values.
//
//   UcxElasticExchange::Plan plan{ElasticStripes(2, 37), 37, 16};
//   bool equal = false;
//   RETURN_IF_ERROR(ElasticRunLayer(*ex, plan, self, layer, &equal));
#ifndef MMSERVE_TRANSFER_ELASTIC_EXCHANGE_TESTING_H_
#define MMSERVE_TRANSFER_ELASTIC_EXCHANGE_TESTING_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "transfer/elastic_kv_exchange.h"

namespace mmserve::transfer {

// Member m's rows: r with r % members == m.
std::vector<std::vector<int64_t>> ElasticStripes(int members, int64_t len);

// The K (kv = 0) or V value of a token's lane at a layer.
float ElasticTestValue(int layer, int kv, int64_t row, int64_t lane, int64_t width);

// One AllGather of `layer` with member `self`'s known rows; *all_equal says
// whether every gathered row has its known values. Aborts the exchange on
// failure (as the model does).
absl::Status ElasticRunLayer(UcxElasticExchange& ex, const UcxElasticExchange::Plan& plan, int self,
                             int layer, bool* all_equal);

}  // namespace mmserve::transfer

#endif  // MMSERVE_TRANSFER_ELASTIC_EXCHANGE_TESTING_H_
