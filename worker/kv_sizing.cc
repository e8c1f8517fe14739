#include "worker/kv_sizing.h"

#include <algorithm>
#include <climits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace mmserve::worker {

absl::StatusOr<KvSizing> DecideKvBlocks(const KvSizingInputs& in) {
  if (in.block_size <= 0 || in.max_num_seqs <= 0 || in.max_model_len <= 0 || in.block_bytes == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV sizing needs positive block_size, max_num_seqs, max_model_len and block bytes (got ",
        in.block_size, ", ", in.max_num_seqs, ", ", in.max_model_len, ", ", in.block_bytes, ")"));
  }
  KvSizing s;
  s.block_bytes = in.block_bytes;
  s.wanted_blocks = static_cast<int64_t>(in.max_num_seqs) *
                    ((in.max_model_len + in.block_size - 1) / in.block_size);
  int64_t blocks;
  if (in.requested_bytes > 0) {
    s.requested = true;
    s.cap_blocks = static_cast<int64_t>(in.requested_bytes / in.block_bytes);
    blocks = s.cap_blocks;
  } else {
    const double share = std::max<double>(0, static_cast<double>(in.available_bytes)) *
                         std::clamp(in.memory_fraction, 0.0, 1.0);
    s.cap_blocks = static_cast<int64_t>(share / static_cast<double>(in.block_bytes));
    blocks = std::min(s.wanted_blocks, s.cap_blocks);
  }
  if (blocks < 2) {
    return absl::ResourceExhaustedError(absl::StrCat("KV budget of ", s.cap_blocks * in.block_bytes,
                                                     " bytes holds fewer than 2 blocks of ",
                                                     in.block_bytes, " bytes"));
  }
  s.num_blocks = static_cast<int>(std::min<int64_t>(blocks, INT_MAX));
  return s;
}

std::string KvSizing::Describe() const {
  auto mib = [](double bytes) { return absl::StrFormat("%.1f MiB", bytes / (1 << 20)); };
  std::string why;
  if (requested) {
    why = absl::StrCat("as requested (", mib(static_cast<double>(cap_blocks) * block_bytes), ")");
  } else if (num_blocks >= wanted_blocks) {
    why = absl::StrCat("all the engine can use (max_num_seqs x max_model_len); the memory cap was ",
                       cap_blocks, " blocks");
  } else {
    why = absl::StrCat("capped by free memory; the engine could use ", wanted_blocks, " blocks");
  }
  return absl::StrCat("KV cache ", num_blocks,
                      " blocks = ", mib(static_cast<double>(num_blocks) * block_bytes), ": ", why);
}

}  // namespace mmserve::worker
