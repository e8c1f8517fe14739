// Qwen3-VL videos as transformers 4.57.6 computes them: Qwen3VLVideoProcessor's
// frame sampling and resize, and Qwen3VLProcessor's prompt, in which each
// temporal patch follows its own timestamp text.
//
//   ASSIGN_OR_RETURN(Qwen3VideoConfig cfg, LoadQwen3VideoConfig(model_dir));
//   ASSIGN_OR_RETURN(auto idx, Qwen3SampleFrameIndices(total, video_fps, {}, cfg));
//   ... decode frames idx ...
//   ASSIGN_OR_RETURN(ImagePatches p, Qwen3PreprocessVideo(frames, cfg));
//   const std::vector<double> t = Qwen3FrameTimestamps(idx, video_fps, cfg.base.merge_size);
//   ASSIGN_OR_RETURN(std::string prompt, ExpandQwen3VideoPrompt(text, {{t, 1}}));
//   // prompt: "<0.3 seconds><|vision_start|><|video_pad|><|vision_end|>..." per
//   // temporal patch; SplitVideoFrames (mrope_positions.h) gives the grids.
//
// What differs from Qwen2-VL's processor (model/video_preprocess.h): frames
// are sampled by default (2 fps), min/max_frames clamp the count but do not
// round it to temporal patches, indices are numpy's linspace rounded half to
// even, and the pixel budget (size.shortest_edge / longest_edge) covers all
// sampled frames together at 32-pixel units (patch x merge). Thread-safe
// (pure functions).
#ifndef MMSERVE_MODEL_QWEN3VL_VIDEO_H_
#define MMSERVE_MODEL_QWEN3VL_VIDEO_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "model/image_decode.h"
#include "model/image_preprocess.h"
#include "model/model_config.h"

namespace mmserve::model {

// A Qwen3VLVideoProcessor's settings in one place. base carries patch, merge
// and temporal sizes, mean and std (the image processor's), and the pixel
// budget over all sampled frames (min_pixels = size.shortest_edge,
// max_pixels = size.longest_edge of video_preprocessor_config.json).
struct Qwen3VideoConfig {
  PreprocessorConfig base;
  double fps = 2.0;
  int64_t min_frames = 4;
  int64_t max_frames = 768;
};

// The config of a preprocessor with Qwen3 video settings (its qwen3_video);
// the defaults of Qwen3VLVideoProcessor without them.
Qwen3VideoConfig Qwen3VideoConfigOf(const PreprocessorConfig& preprocessor);

// The model directory's (LoadModelConfig); NotFound without a Qwen3-VL
// video_preprocessor_config.json.
[[nodiscard]] absl::StatusOr<Qwen3VideoConfig> LoadQwen3VideoConfig(const std::string& dir);

// A request's sampling: at most one of them (transformers refuses both).
struct Qwen3VideoSampling {
  std::optional<double> fps;          // unset: the config's
  std::optional<int64_t> num_frames;  // taken as is, no clamping
};

// Qwen3VLVideoProcessor.sample_frames: num_frames = int(total / video_fps *
// fps) clamped to [min_frames, max_frames] and to total, then
// linspace(0, total - 1, num_frames) rounded half to even. InvalidArgument
// for no frames, a non-positive rate, or both fps and num_frames.
[[nodiscard]] absl::StatusOr<std::vector<int64_t>> Qwen3SampleFrameIndices(
    int64_t total_frames, double video_fps, const Qwen3VideoSampling& sampling,
    const Qwen3VideoConfig& config);

// The grid of num_frames frames of width x height (Qwen3-VL's smart_resize).
// InvalidArgument for fewer frames than a temporal patch, a side below 32
// pixels (patch x merge) or an aspect ratio above 200, as transformers.
[[nodiscard]] absl::StatusOr<MediaGrid> Qwen3VideoGrid(int64_t num_frames, int64_t width,
                                                       int64_t height,
                                                       const Qwen3VideoConfig& config);

// pixel_values_videos and video_grid_thw of the sampled frames.
[[nodiscard]] absl::StatusOr<ImagePatches> Qwen3PreprocessVideo(const std::vector<RgbImage>& frames,
                                                                const Qwen3VideoConfig& config);

// Qwen3VLProcessor._calculate_timestamps: the indices padded with the last
// to a multiple of merge_size, each index / video_fps, and each group's
// first and last averaged: one timestamp per temporal patch, in seconds.
std::vector<double> Qwen3FrameTimestamps(absl::Span<const int64_t> indices, double video_fps,
                                         int merge_size);

// One video of a prompt: its temporal patches' timestamps and how many
// <|video_pad|> each patch gets (its tokens, or 1 where the caller expands
// pads later).
struct Qwen3VideoPrompt {
  std::vector<double> timestamps;
  int64_t pads_per_patch = 1;
};

// Qwen3VLProcessor's text: video k's "<|vision_start|><|video_pad|><|vision_end|>"
// (the first such block left, else the first bare <|video_pad|>) becomes,
// per temporal patch, "<%.1f seconds>" then vision_start, its pads and
// vision_end. InvalidArgument when the prompt has fewer video
// placeholders than videos or more.
[[nodiscard]] absl::StatusOr<std::string> ExpandQwen3VideoPrompt(
    const std::string& text, absl::Span<const Qwen3VideoPrompt> videos);

}  // namespace mmserve::model

#endif  // MMSERVE_MODEL_QWEN3VL_VIDEO_H_
