#include "transfer/kv_handoff_pairs.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace mmserve::transfer {

absl::StatusOr<std::vector<KvRankPair>> PairKvRanks(KvRanks prefill, KvRanks decode) {
  if (prefill.tp < 1 || decode.tp < 1 || prefill.rank_heads < 1 || decode.rank_heads < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV hand-off: tensor parallelism of ", prefill.tp, " ranks x ", prefill.rank_heads,
        " KV heads (prefill) and ", decode.tp, " x ", decode.rank_heads, " (decode)"));
  }
  const int64_t heads = prefill.tp * prefill.rank_heads;
  if (decode.tp * decode.rank_heads != heads) {
    return absl::FailedPreconditionError(
        absl::StrCat("a prefill instance with tp=", prefill.tp, " (", heads,
                     " KV heads) cannot hand its KV to a decode instance with tp=", decode.tp, " (",
                     decode.tp * decode.rank_heads, " KV heads): not the same model"));
  }
  std::vector<KvRankPair> pairs;
  for (int d = 0; d < decode.tp; ++d) {
    const int64_t d_first = d * decode.rank_heads, d_end = d_first + decode.rank_heads;
    for (int p = 0; p < prefill.tp; ++p) {
      const int64_t p_first = p * prefill.rank_heads, p_end = p_first + prefill.rank_heads;
      const int64_t first = std::max(d_first, p_first), end = std::min(d_end, p_end);
      if (first >= end) continue;
      pairs.push_back(
          {.prefill_rank = p,
           .decode_rank = d,
           .heads = {
               .src_first = first - p_first, .dst_first = first - d_first, .count = end - first}});
    }
  }
  return pairs;
}

}  // namespace mmserve::transfer
