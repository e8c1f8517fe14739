// mmserve_language_kv_bytes_moved_total{kind, dir}: the KV payload bytes a
// language instance moved to or from other instances, by kind:
//
//   elastic_prefill  the per-layer K/V all-gather of a group prefill (role
//                elastic): this member's rows to each peer (sent), the
//                peers' rows (received), K and V as fp32;
//   elastic_decode   multi-master decode: span queries (the master sends, a
//                holder receives: 8 + 8 + q_width x 4 bytes a layer) and
//                their partials (the holder sends, the master receives:
//                (q_width + heads) x 4 bytes a layer);
//   handoff      the P/D KV hand-off (role prefill sends, role decode
//                receives): whole blocks, layers x 2 x block_size x KV
//                heads x head_dim x 4 bytes a block.
//
// Notices, CRCs and gRPC control messages are not counted.
//
//   transfer::WireBytes b = KvBytesMoved(registry, "elastic_prefill");
//   exchange->CountBytes(b);
//
// Thread-safe (metrics::Registry and its counters are).
#ifndef MMSERVE_LANGUAGE_SERVICE_KV_BYTES_MOVED_H_
#define MMSERVE_LANGUAGE_SERVICE_KV_BYTES_MOVED_H_

#include <cstdint>
#include <string>

#include "common/metrics.h"
#include "model/kv_cache.h"
#include "transfer/wire_bytes.h"

namespace mmserve::language {

// The counters of `kind` ("elastic_prefill", "elastic_decode", "handoff"), created
// at 0 on first use.
transfer::WireBytes KvBytesMoved(metrics::Registry& metrics, const std::string& kind);

// The bytes of one block of a cache shaped `shape` that a hand-off moves:
// every layer's K and V.
inline uint64_t HandoffBlockBytes(const model::KvCacheShape& shape) {
  return static_cast<uint64_t>(shape.num_layers) * 2 * shape.block_size * shape.num_kv_heads *
         shape.head_dim * sizeof(float);
}

}  // namespace mmserve::language

#endif  // MMSERVE_LANGUAGE_SERVICE_KV_BYTES_MOVED_H_
