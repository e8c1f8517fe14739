// Test-only helpers of the ESP K/V exchange tests (in-process and
// multi-process): the striped plan and one layer with known values.
//
//   UcxEspExchange::Plan plan{EspStripes(2, 37), 37, 16};
//   bool equal = false;
//   RETURN_IF_ERROR(EspRunLayer(*ex, plan, self, layer, &equal));
#ifndef MMSERVE_TRANSFER_ESP_EXCHANGE_TESTING_H_
#define MMSERVE_TRANSFER_ESP_EXCHANGE_TESTING_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "transfer/esp_kv_exchange.h"

namespace mmserve::transfer {

// Member m's rows: r with r % members == m.
std::vector<std::vector<int64_t>> EspStripes(int members, int64_t len);

// The K (kv = 0) or V value of a token's lane at a layer.
float EspTestValue(int layer, int kv, int64_t row, int64_t lane, int64_t width);

// One AllGather of `layer` with member `self`'s known rows; *all_equal says
// whether every gathered row has its known values. Aborts the exchange on
// failure (as the model does).
absl::Status EspRunLayer(UcxEspExchange& ex, const UcxEspExchange::Plan& plan, int self, int layer,
                         bool* all_equal);

}  // namespace mmserve::transfer

#endif  // MMSERVE_TRANSFER_ESP_EXCHANGE_TESTING_H_
