#include "model/forward_batch.h"

#include <vector>

#include "absl/strings/str_cat.h"

namespace mmserve::model {
namespace {

absl::Status Bad(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("forward batch: ", what));
}

absl::Status ValidateSequence(const ForwardBatch& b, size_t s, const ForwardBatchLimits& limits,
                              std::vector<char>& covered) {
  const SequenceChunk& seq = b.sequences[s];
  const int64_t t_total = b.num_tokens();
  if (seq.query_len <= 0 || seq.query_start < 0 || seq.query_start + seq.query_len > t_total) {
    return Bad(absl::StrCat("sequence ", s, " rows [", seq.query_start, ", ",
                            seq.query_start + seq.query_len, ") are outside [0, ", t_total, ")"));
  }
  if (seq.context_len < seq.query_len) {
    return Bad(absl::StrCat("sequence ", s, " context_len ", seq.context_len, " < query_len ",
                            seq.query_len));
  }
  const int64_t needed = (seq.context_len + limits.block_size - 1) / limits.block_size;
  if (static_cast<int64_t>(seq.block_table.size()) < needed) {
    return Bad(absl::StrCat("sequence ", s, " has ", seq.block_table.size(),
                            " blocks for context_len ", seq.context_len, " (needs ", needed, ")"));
  }
  for (int64_t i = 0; i < needed; ++i) {
    if (seq.block_table[i] < 0 || seq.block_table[i] >= limits.num_blocks) {
      return Bad(absl::StrCat("sequence ", s, " block_table[", i, "] = ", seq.block_table[i],
                              " is outside [0, ", limits.num_blocks, ")"));
    }
  }
  for (int64_t i = 0; i < seq.query_len; ++i) {
    const int64_t row = seq.query_start + i;
    if (covered[row]) return Bad(absl::StrCat("row ", row, " belongs to two sequences"));
    covered[row] = 1;
    const int64_t pos = seq.context_len - seq.query_len + i;
    const int64_t slot =
        static_cast<int64_t>(seq.block_table[pos / limits.block_size]) * limits.block_size +
        pos % limits.block_size;
    if (b.slot_mapping[row] != slot) {
      return Bad(absl::StrCat("slot_mapping[", row, "] = ", b.slot_mapping[row], " but sequence ",
                              s, " puts cache position ", pos, " at slot ", slot));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateForwardBatch(const ForwardBatch& b, const ForwardBatchLimits& limits) {
  const int64_t t_total = b.num_tokens();
  if (t_total == 0) return Bad("no tokens");
  if (static_cast<int64_t>(b.positions.size()) != 3 * t_total) {
    return Bad(
        absl::StrCat("positions has ", b.positions.size(), " entries, expected 3 * ", t_total));
  }
  if (static_cast<int64_t>(b.slot_mapping.size()) != t_total) {
    return Bad(
        absl::StrCat("slot_mapping has ", b.slot_mapping.size(), " entries, expected ", t_total));
  }
  std::vector<char> overridden(t_total, 0);
  for (const EmbeddingOverride& o : b.embedding_overrides) {
    if (o.row < 0 || o.row >= t_total || o.values == nullptr || o.deepstack_layers < 0 ||
        (o.deepstack_layers > 0 && o.deepstack == nullptr)) {
      return Bad(absl::StrCat("embedding override for row ", o.row, " is invalid"));
    }
    if (overridden[o.row]) return Bad(absl::StrCat("row ", o.row, " is overridden twice"));
    overridden[o.row] = 1;
  }
  for (int64_t t = 0; t < t_total; ++t) {
    if (!overridden[t] && (b.token_ids[t] < 0 || b.token_ids[t] >= limits.vocab_size)) {
      return Bad(absl::StrCat("token id ", b.token_ids[t], " at row ", t,
                              " is outside the vocabulary of ", limits.vocab_size));
    }
  }
  std::vector<char> covered(t_total, 0);
  for (size_t s = 0; s < b.sequences.size(); ++s) {
    absl::Status st = ValidateSequence(b, s, limits, covered);
    if (!st.ok()) return st;
  }
  for (int64_t t = 0; t < t_total; ++t) {
    if (!covered[t]) return Bad(absl::StrCat("row ", t, " belongs to no sequence"));
  }
  for (int64_t r : b.logits_rows) {
    if (r < 0 || r >= t_total) {
      return Bad(absl::StrCat("logits row ", r, " is outside [0, ", t_total, ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace mmserve::model
