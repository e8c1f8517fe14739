// How many tokens an image becomes, from its width and height alone: the
// Qwen2-VL image processor's smart resize, shared by the router (to size the
// language side's receive buffer before the image is decoded) and the
// encoder (to resize).
//
//   ASSIGN_OR_RETURN(MediaGrid g, SmartResize(1920, 1080, cfg));
//   int tokens = g.num_tokens();  // (grid_h * grid_w) / merge^2
//
// The arithmetic follows transformers' smart_resize exactly, including
// Python's round-half-to-even. Thread-safe (pure functions).
#ifndef MMSERVE_MODEL_IMAGE_TOKENS_H_
#define MMSERVE_MODEL_IMAGE_TOKENS_H_

#include <cstdint>

#include "absl/status/statusor.h"

namespace mmserve::model {

struct ImageGridParams {
  int patch_size = 14;
  int merge_size = 2;
  int temporal_patch_size = 2;
  int64_t min_pixels = 56 * 56;
  int64_t max_pixels = 28 * 28 * 1280;
};

// What a multimodal slot holds (language.proto's MediaKind): an image's run
// of tokens is <|image_pad|>, a video's <|video_pad|>. Images and videos
// share one index space (order of appearance in the prompt).
enum class MediaKind { kImage, kVideo };

struct MediaGrid {
  int resized_height = 0;
  int resized_width = 0;
  int grid_t = 1;  // one temporal patch for a still image
  int grid_h = 0;  // patches down
  int grid_w = 0;  // patches across
  int merge_size = 2;
  // kVideo: grid_t temporal patches (frame pairs) of a video; the vision
  // tower treats both kinds alike, the prompt places a video's tokens on
  // <|video_pad|>.
  MediaKind kind = MediaKind::kImage;
  // How far the M-RoPE time position advances per temporal patch
  // (mrope_positions.h): 1 but for Qwen2.5-VL's videos, whose time axis is
  // scaled to seconds (ModelConfig::VideoTimeStep). 0 is allowed: every
  // temporal patch then sits at the same time position.
  int time_step = 1;

  // A grid from (t, h, w) patch counts, as image_grid_thw (or
  // video_grid_thw, with kind kVideo) lists them.
  static MediaGrid FromThw(int t, int h, int w, int merge_size = 2,
                           MediaKind kind = MediaKind::kImage) {
    MediaGrid g;
    g.kind = kind;
    g.grid_t = t;
    g.grid_h = h;
    g.grid_w = w;
    g.merge_size = merge_size;
    return g;
  }

  int64_t num_patches() const { return static_cast<int64_t>(grid_t) * grid_h * grid_w; }
  int64_t num_tokens() const { return num_patches() / (merge_size * merge_size); }
};

// InvalidArgument for a non-positive size or an aspect ratio above 200 (as
// the reference rejects).
[[nodiscard]] absl::StatusOr<MediaGrid> SmartResize(int64_t width, int64_t height,
                                                    const ImageGridParams& params);

}  // namespace mmserve::model

#endif  // MMSERVE_MODEL_IMAGE_TOKENS_H_
