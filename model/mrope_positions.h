// Multimodal prompts for Qwen2-VL: expanding each image placeholder into one
// token per image embedding, and the M-RoPE position ids of the result
// (transformers' Qwen2-VL get_rope_index).
//
//   ASSIGN_OR_RETURN(auto ids, ExpandImagePlaceholders(prompt_ids, pad_id, grids));
//   ASSIGN_OR_RETURN(MropePositions pos, ComputeMropePositions(ids, pad_id, grids, 2));
//   // pos.t/h/w[i]: the three position components of token i; decode token
//   // n (0-based over the whole sequence) has position n + pos.delta in all
//   // three.
//
// Text tokens advance all three components together. An image's tokens sit
// on a (t, h, w) grid of merged patches offset by the position after the
// preceding text; the text after it resumes from the largest position used
// plus one. Thread-safe (pure functions).
#ifndef MMSERVE_MODEL_MROPE_POSITIONS_H_
#define MMSERVE_MODEL_MROPE_POSITIONS_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "model/image_tokens.h"

namespace mmserve::model {

struct MropePositions {
  std::vector<int32_t> t, h, w;  // one entry per token
  // Position of token n during decoding is n + delta (Qwen2-VL rope_deltas).
  int32_t delta = 0;
};

// Replaces the k-th `image_pad_id` in `ids` by grids[k].num_tokens() copies.
// InvalidArgument when the number of placeholders differs from grids.size().
[[nodiscard]] absl::StatusOr<std::vector<int32_t>> ExpandImagePlaceholders(
    absl::Span<const int32_t> ids, int32_t image_pad_id, absl::Span<const ImageGrid> grids);

// Positions for expanded `ids`, whose image runs follow `grids` in order.
// InvalidArgument when a run's length disagrees with its grid.
[[nodiscard]] absl::StatusOr<MropePositions> ComputeMropePositions(
    absl::Span<const int32_t> ids, int32_t image_pad_id, absl::Span<const ImageGrid> grids,
    int spatial_merge_size);

}  // namespace mmserve::model

#endif  // MMSERVE_MODEL_MROPE_POSITIONS_H_
