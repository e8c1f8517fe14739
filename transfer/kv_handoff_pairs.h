// Which rank of a tensor-parallel prefill instance writes which KV heads of
// which rank of a tensor-parallel decode instance. Prefill rank p holds heads
// [p * P, (p + 1) * P) of the model's H, decode rank d [d * D, (d + 1) * D);
// each pair whose ranges overlap moves the overlap, so every decode rank's
// heads are written once, by one or more prefill ranks (TP 2 -> 1: both
// ranks into the one decode rank at their heads' offsets; 1 -> 2: the one
// rank sends each decode rank its half; N -> N: rank r -> rank r).
//
//   ASSIGN_OR_RETURN(std::vector<KvRankPair> pairs, PairKvRanks({2, 1}, {1, 2}));
//   // {p 0 -> d 0: heads 0 -> 0, one}, {p 1 -> d 0: heads 0 -> 1, one}
//
// Pure functions, thread-safe.
#ifndef MMSERVE_TRANSFER_KV_HANDOFF_PAIRS_H_
#define MMSERVE_TRANSFER_KV_HANDOFF_PAIRS_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "transfer/kv_segments.h"

namespace mmserve::transfer {

// An instance's tensor parallelism: `tp` ranks of `rank_heads` KV heads each.
struct KvRanks {
  int tp = 1;
  int64_t rank_heads = 0;
};

struct KvRankPair {
  int prefill_rank = 0;
  int decode_rank = 0;
  KvHeadSlice heads;  // src_first in the prefill rank, dst_first in the decode rank
};

// The pairs, by decode rank and then prefill rank (each decode rank's heads
// in order). FailedPrecondition naming both TP sizes when the two instances
// split a different number of KV heads (not the same model), InvalidArgument
// for a size below 1.
[[nodiscard]] absl::StatusOr<std::vector<KvRankPair>> PairKvRanks(KvRanks prefill, KvRanks decode);

}  // namespace mmserve::transfer

#endif  // MMSERVE_TRANSFER_KV_HANDOFF_PAIRS_H_
