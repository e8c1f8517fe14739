#include "router/call_metrics.h"

#include <string>

namespace mmserve::router {
namespace {

constexpr char kMigrationsHelp[] =
    "Language streams of calls whose instance was lost, by outcome: resumed on another "
    "instance, over_limit (--migration_limit), no_instance.";
constexpr char kMediaPlacedHelp[] =
    "Images and videos of placed calls, by kv: held when the language instance placed on (P/D: "
    "the prefill instance) holds the KV of the chat message they are in, by the router's prefix "
    "index (--prefix_weight), else not_held. A held image goes to no encoder "
    "(mmserve_router_encoder_skipped_total) unless the call is an elastic pool's.";

}  // namespace

CallMetrics::CallMetrics(metrics::Registry& registry)
    : ttft(registry.GetHistogram("mmserve_router_ttft_seconds",
                                 "Time to first token at the router.", metrics::LatencyBuckets())),
      critical_round_trips(
          registry.GetHistogram("mmserve_router_critical_round_trips",
                                "Router RPCs a request's first token waited for, one after another "
                                "(Prefill; P/D: Decode hold then Prefill; RetryImages).",
                                {1, 2, 3, 4, 5, 6, 8, 12, 16})),
      itl(registry.GetHistogram("mmserve_router_itl_seconds", "Gap between streamed token batches.",
                                metrics::LatencyBuckets())),
      e2e(registry.GetHistogram("mmserve_router_e2e_seconds", "Generate latency, receipt to end.",
                                metrics::LatencyBuckets())),
      overhead(registry.GetHistogram(
          "mmserve_router_overhead_seconds",
          "Time in the router before dispatch (validation, hashing, pre-sizing).",
          metrics::LatencyBuckets())),
      migrations_resumed(registry.GetCounter("mmserve_router_migrations_total", kMigrationsHelp,
                                             {{"outcome", "resumed"}})),
      migrations_over_limit(registry.GetCounter("mmserve_router_migrations_total", kMigrationsHelp,
                                                {{"outcome", "over_limit"}})),
      migrations_no_instance(registry.GetCounter("mmserve_router_migrations_total", kMigrationsHelp,
                                                 {{"outcome", "no_instance"}})),
      media_on_held_prefix(registry.GetCounter("mmserve_router_media_placed_total",
                                               kMediaPlacedHelp, {{"kv", "held"}})),
      media_not_on_held_prefix(registry.GetCounter("mmserve_router_media_placed_total",
                                                   kMediaPlacedHelp, {{"kv", "not_held"}})),
      encoder_skipped(registry.GetCounter(
          "mmserve_router_encoder_skipped_total",
          "Images sent to no encoder: the language instance placed on (P/D: the prefill instance) "
          "holds their KV by the prefix index (--skip_cached_images).")),
      encoder_skip_fallbacks(registry.GetCounter(
          "mmserve_router_encoder_skip_fallbacks_total",
          "Images sent to no encoder whose KV the language instance no longer had (evicted, or "
          "the index was stale), or whose call moved to another instance: sent to an encoder "
          "after all.")) {
  for (int c = 0; c < kNumCodes; ++c) {
    requests_[c] = &registry.GetCounter(
        "mmserve_router_requests_total", "Generate calls by final gRPC code.",
        {{"code", absl::StatusCodeToString(static_cast<absl::StatusCode>(c))}});
  }
}

metrics::Counter& CallMetrics::Requests(absl::StatusCode code) const {
  const int c = static_cast<int>(code);
  return *requests_[c >= 0 && c < kNumCodes ? c : static_cast<int>(absl::StatusCode::kUnknown)];
}

}  // namespace mmserve::router
