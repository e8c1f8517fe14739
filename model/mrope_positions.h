// Multimodal prompts for Qwen2-VL: expanding each image or video placeholder
// into one token per embedding row, and the M-RoPE position ids of the
// result (transformers' Qwen2-VL get_rope_index, image_grid_thw and
// video_grid_thw).
//
//   const MediaPadIds pads{.image = image_pad_id, .video = video_pad_id};
//   ASSIGN_OR_RETURN(auto ids, ExpandImagePlaceholders(prompt_ids, pads, grids));
//   ASSIGN_OR_RETURN(MropePositions pos, ComputeMropePositions(ids, pads, grids, 2));
//   // pos.t/h/w[i]: the three position components of token i; decode token
//   // n (0-based over the whole sequence) has position n + pos.delta in all
//   // three.
//
// `grids` lists images and videos together in order of appearance; each
// grid's kind says which pad its run holds. Text tokens advance all three
// components together. An image's or video's tokens sit on a (t, h, w) grid
// of merged patches (t: the video's temporal patches, 1 for an image) offset
// by the position after the preceding text (temporal patch a at time
// a * grid.time_step); the text after it resumes from the largest position
// used plus one. Thread-safe (pure functions).
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

// The placeholder token of each media kind; -1: the kind is not accepted
// (no token id is negative).
struct MediaPadIds {
  int32_t image = -1;
  int32_t video = -1;

  int32_t Of(MediaKind kind) const { return kind == MediaKind::kVideo ? video : image; }
  bool IsPad(int32_t id) const { return id >= 0 && (id == image || id == video); }
};

// Replaces the k-th pad (image or video) in `ids` by grids[k].num_tokens()
// copies. InvalidArgument when the number of placeholders differs from
// grids.size() or the k-th placeholder is not of grids[k].kind.
[[nodiscard]] absl::StatusOr<std::vector<int32_t>> ExpandImagePlaceholders(
    absl::Span<const int32_t> ids, const MediaPadIds& pads, absl::Span<const MediaGrid> grids);

// Positions for expanded `ids`, whose image and video runs follow `grids` in
// order. InvalidArgument when a run's length or pad disagrees with its grid.
[[nodiscard]] absl::StatusOr<MropePositions> ComputeMropePositions(
    absl::Span<const int32_t> ids, const MediaPadIds& pads, absl::Span<const MediaGrid> grids,
    int spatial_merge_size);

// Qwen3-VL's grids for ComputeMropePositions (transformers'
// Qwen3VLModel.get_rope_index): its prompts show a video frame by frame, each
// temporal patch a run of <|video_pad|> after its own timestamp text, so a
// video of grid_t temporal patches becomes grid_t grids of one temporal
// patch (time lives in the timestamps, not in the t component). Images are
// unchanged.
[[nodiscard]] std::vector<MediaGrid> SplitVideoFrames(absl::Span<const MediaGrid> grids);

// Images only: the same with no video pad.
[[nodiscard]] inline absl::StatusOr<std::vector<int32_t>> ExpandImagePlaceholders(
    absl::Span<const int32_t> ids, int32_t image_pad_id, absl::Span<const MediaGrid> grids) {
  return ExpandImagePlaceholders(ids, MediaPadIds{.image = image_pad_id}, grids);
}
[[nodiscard]] inline absl::StatusOr<MropePositions> ComputeMropePositions(
    absl::Span<const int32_t> ids, int32_t image_pad_id, absl::Span<const MediaGrid> grids,
    int spatial_merge_size) {
  return ComputeMropePositions(ids, MediaPadIds{.image = image_pad_id}, grids, spatial_merge_size);
}

}  // namespace mmserve::model

#endif  // MMSERVE_MODEL_MROPE_POSITIONS_H_
