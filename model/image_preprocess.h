// Qwen2-VL image preprocessing, as transformers' Qwen2VLImageProcessor does
// it: smart resize (image_tokens.h) with PIL's bicubic filter on 8-bit RGB,
// rescale by 1/255, normalize with the configured mean/std, duplicate the
// frame to fill the temporal patch, and flatten into patches in the
// reference order.
//
//   ASSIGN_OR_RETURN(ImagePatches p, PreprocessImage(rgb, preprocessor_config));
//   // p.values: [p.grid.num_patches()][3 * temporal_patch * patch * patch]
//
// The resize reproduces PIL's Resample.c (separable passes in Pillow's
// order, see ResizeVerticalFirst; fixed-point coefficients with 22
// fractional bits, 8-bit rounding after each pass), so resized pixels equal
// PIL's exactly and pixel values equal the reference's bit for bit.
// Thread-safe (pure functions).
#ifndef MMSERVE_MODEL_IMAGE_PREPROCESS_H_
#define MMSERVE_MODEL_IMAGE_PREPROCESS_H_

#include <vector>

#include "absl/status/statusor.h"
#include "model/image_decode.h"
#include "model/image_tokens.h"
#include "model/model_config.h"

namespace mmserve::model {

// PIL Image.resize((width, height), Image.BICUBIC) on an RGB image.
RgbImage ResizeBicubic(const RgbImage& in, int width, int height);

// Whether Pillow (13.0, the version the goldens pin) runs the vertical pass
// before the horizontal one when both are needed: when the height shrinks by
// more than twice the columns the width loses (so always when the width grows
// and the height shrinks, never when the height grows). Each pass rounds to 8
// bits, so the order moves pixels by up to ~25 levels. Pillow's source for
// this was not at hand; the rule was fitted by resizing random images both
// ways and comparing with Pillow: 0 exceptions in 453 random size pairs
// (8-1400 pixels a side) and in image_golden_test's 88 cases.
bool ResizeVerticalFirst(int in_width, int in_height, int width, int height);

struct ImagePatches {
  MediaGrid grid;
  int patch_dim = 0;          // 3 * temporal_patch_size * patch_size^2
  std::vector<float> values;  // num_patches x patch_dim, row-major
};

// InvalidArgument for an image smart resize rejects (see image_tokens.h).
[[nodiscard]] absl::StatusOr<ImagePatches> PreprocessImage(const RgbImage& image,
                                                           const PreprocessorConfig& config);

// The smart-resize parameters of `config` (what the router needs to count an
// image's tokens from its header).
ImageGridParams GridParamsFor(const PreprocessorConfig& config);

}  // namespace mmserve::model

#endif  // MMSERVE_MODEL_IMAGE_PREPROCESS_H_
