#include "model/vision_windows.h"

namespace mmserve::model {

VisionWindows PlanVisionWindows(absl::Span<const MediaGrid> grids, int merge, int window) {
  VisionWindows out;
  out.bounds.push_back(0);
  const int unit = merge * merge;
  int first_group = 0;
  for (const MediaGrid& g : grids) {
    const int gh = g.grid_h / merge, gw = g.grid_w / merge;
    // transformers pads by a whole window when a side is already a multiple
    // (pad = window - side % window); the extra windows are empty either way.
    const int windows_h = (gh + window - gh % window) / window;
    const int windows_w = (gw + window - gw % window) / window;
    for (int t = 0; t < g.grid_t; ++t) {
      for (int wh = 0; wh < windows_h; ++wh) {
        for (int ww = 0; ww < windows_w; ++ww) {
          int groups = 0;
          for (int h = wh * window; h < (wh + 1) * window && h < gh; ++h) {
            for (int w = ww * window; w < (ww + 1) * window && w < gw; ++w) {
              out.group_order.push_back(first_group + (t * gh + h) * gw + w);
              ++groups;
            }
          }
          if (groups > 0) out.bounds.push_back(out.bounds.back() + groups * unit);
        }
      }
    }
    first_group += g.grid_t * gh * gw;
  }
  return out;
}

}  // namespace mmserve::model
