#include "language_service/kv_bytes_moved.h"

namespace mmserve::language {

transfer::WireBytes KvBytesMoved(metrics::Registry& metrics, const std::string& kind) {
  const char* help =
      "KV payload bytes moved to or from other instances (kind: elastic_prefill = the group "
      "prefill's K/V all-gather, elastic_decode = span queries and partials, handoff = P/D KV "
      "hand-off; notices and control messages not counted).";
  return {.sent = &metrics.GetCounter("mmserve_language_kv_bytes_moved_total", help,
                                      {{"kind", kind}, {"dir", "sent"}}),
          .received = &metrics.GetCounter("mmserve_language_kv_bytes_moved_total", help,
                                          {{"kind", kind}, {"dir", "received"}})};
}

}  // namespace mmserve::language
