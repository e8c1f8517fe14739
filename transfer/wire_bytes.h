// Where a transfer protocol counts the payload bytes it moves: a sender
// counts what it put once the flush completed, a receiver what it accepted
// (its notice arrived and the CRC32C matched). Control words (notices,
// joins, aborts) are not payload and are not counted.
//
//   exchange->CountBytes({.sent = &sent_counter, .received = &received_counter});
//
// Either counter may be null (not counted). Thread-safe: metrics::Counter
// is; the counters must outlive whatever counts into them.
#ifndef MMSERVE_TRANSFER_WIRE_BYTES_H_
#define MMSERVE_TRANSFER_WIRE_BYTES_H_

#include <cstdint>

#include "common/metrics.h"

namespace mmserve::transfer {

struct WireBytes {
  metrics::Counter* sent = nullptr;
  metrics::Counter* received = nullptr;

  void Sent(uint64_t bytes) const {
    if (sent != nullptr) sent->Increment(static_cast<double>(bytes));
  }
  void Received(uint64_t bytes) const {
    if (received != nullptr) received->Increment(static_cast<double>(bytes));
  }
};

}  // namespace mmserve::transfer

#endif  // MMSERVE_TRANSFER_WIRE_BYTES_H_
