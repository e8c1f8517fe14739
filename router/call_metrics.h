// The metric families every Generate call updates, resolved once when the
// router starts: a call observes through references, never a lookup by
// name on a token batch.
//
//   CallMetrics metrics(registry);
//   metrics.ttft.Observe(seconds);
//   metrics.Requests(status.code()).Increment();
//
// Thread-safe (the metric objects are).
#ifndef MMSERVE_ROUTER_CALL_METRICS_H_
#define MMSERVE_ROUTER_CALL_METRICS_H_

#include <array>

#include "absl/status/status.h"
#include "common/metrics.h"

namespace mmserve::router {

struct CallMetrics {
  explicit CallMetrics(metrics::Registry& registry);

  // Generate calls by final gRPC code; every code is exported from the start.
  metrics::Counter& Requests(absl::StatusCode code) const;

  metrics::Histogram& ttft;
  // Buckets are whole round trips: role both 1 (Prefill), P/D 2 (the Decode
  // hold, then Prefill), each re-dispatch before the first token 1 more.
  metrics::Histogram& critical_round_trips;
  metrics::Histogram& itl;
  metrics::Histogram& e2e;
  metrics::Histogram& overhead;
  // Language streams moved off a lost instance (mmserve_router_migrations_total):
  // resumed on another instance; refused past --migration_limit; failed
  // for want of an instance to resume on.
  metrics::Counter& migrations_resumed;
  metrics::Counter& migrations_over_limit;
  metrics::Counter& migrations_no_instance;
  // Images and videos of placed calls, by whether the instance placed on
  // holds their message's KV (Placement::media_on_held_prefix)
  // (mmserve_router_media_placed_total).
  metrics::Counter& media_on_held_prefix;
  metrics::Counter& media_not_on_held_prefix;
  // Images sent to no encoder, their KV expected on the instance
  // (mmserve_router_encoder_skipped_total), and those of them the instance
  // did not find cached, then sent to an encoder after all
  // (mmserve_router_encoder_skip_fallbacks_total).
  metrics::Counter& encoder_skipped;
  metrics::Counter& encoder_skip_fallbacks;

 private:
  static constexpr int kNumCodes = 17;  // absl::StatusCode 0..16
  std::array<metrics::Counter*, kNumCodes> requests_;
};

}  // namespace mmserve::router

#endif  // MMSERVE_ROUTER_CALL_METRICS_H_
