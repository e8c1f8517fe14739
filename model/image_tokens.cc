#include "model/image_tokens.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace mmserve::model {
namespace {

// Python's round(): half to even.
int64_t RoundHalfEven(double x) { return static_cast<int64_t>(std::nearbyint(x)); }

int64_t RoundByFactor(double v, int64_t f) { return RoundHalfEven(v / f) * f; }
int64_t FloorByFactor(double v, int64_t f) { return static_cast<int64_t>(std::floor(v / f)) * f; }
int64_t CeilByFactor(double v, int64_t f) { return static_cast<int64_t>(std::ceil(v / f)) * f; }

}  // namespace

absl::StatusOr<MediaGrid> SmartResize(int64_t width, int64_t height,
                                      const ImageGridParams& params) {
  if (width <= 0 || height <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("image size ", width, "x", height, " must be positive"));
  }
  if (static_cast<double>(std::max(width, height)) / std::min(width, height) > 200) {
    return absl::InvalidArgumentError(
        absl::StrCat("image ", width, "x", height, " has an aspect ratio above 200"));
  }
  const int64_t factor = static_cast<int64_t>(params.patch_size) * params.merge_size;
  // No clamp to `factor` here: transformers 4.57 lets a side round to 0 and
  // relies on the min_pixels branch to scale it back up.
  int64_t h = RoundByFactor(static_cast<double>(height), factor);
  int64_t w = RoundByFactor(static_cast<double>(width), factor);
  if (h * w > params.max_pixels) {
    const double beta = std::sqrt(static_cast<double>(height) * width / params.max_pixels);
    h = std::max(factor, FloorByFactor(height / beta, factor));
    w = std::max(factor, FloorByFactor(width / beta, factor));
  } else if (h * w < params.min_pixels) {
    const double beta = std::sqrt(static_cast<double>(params.min_pixels) / (height * width));
    h = CeilByFactor(height * beta, factor);
    w = CeilByFactor(width * beta, factor);
  }
  MediaGrid g;
  g.resized_height = static_cast<int>(h);
  g.resized_width = static_cast<int>(w);
  g.grid_h = static_cast<int>(h / params.patch_size);
  g.grid_w = static_cast<int>(w / params.patch_size);
  g.merge_size = params.merge_size;
  return g;
}

}  // namespace mmserve::model
