// Qwen2.5-VL's window attention layout (transformers' get_window_index):
// each image (or video frame) is cut into windows of window x window merge
// groups (a merge group is spatial_merge_size^2 consecutive patch rows), the
// last row and column of windows padded; the tower runs with the groups
// reordered window by window, so that each window's patches are contiguous.
//
//   VisionWindows w = PlanVisionWindows(grids, /*merge=*/2, /*window=*/4);
//   // rows of group w.group_order[i] move to position i; blocks with window
//   // attention use w.bounds, the others the per-frame bounds (frames stay
//   // contiguous); merged tokens go back with out[group_order[i]] = in[i].
//
// Thread-safe (pure function).
#ifndef MMSERVE_MODEL_VISION_WINDOWS_H_
#define MMSERVE_MODEL_VISION_WINDOWS_H_

#include <vector>

#include "absl/types/span.h"
#include "model/image_tokens.h"

namespace mmserve::model {

struct VisionWindows {
  // The merge group placed at each position, over all grids in order.
  std::vector<int> group_order;
  // Patch rows where each non-empty window starts, then the total.
  std::vector<int> bounds;
};

// `window` is window_size / spatial_merge_size / patch_size (merge groups per
// window side), >= 1. Grids must be multiples of `merge` (AttentionBounds
// checks that first).
VisionWindows PlanVisionWindows(absl::Span<const MediaGrid> grids, int merge, int window);

}  // namespace mmserve::model

#endif  // MMSERVE_MODEL_VISION_WINDOWS_H_
