// Qwen2-VL video preprocessing, as transformers 4.57.6's
// Qwen2VLVideoProcessor does it: frame selection (sample_frames), smart
// resize with the video pixel limits, torchvision's antialiased bicubic
// resize of uint8 frames, fused rescale + normalize in float32, the last
// frame repeated to fill the final temporal patch, and the patches flattened
// in pixel_values_videos order.
//
//   ASSIGN_OR_RETURN(std::vector<int64_t> idx,
//                    SampleFrameIndices(total, video_fps, sampling, 2));
//   ... decode frames idx ...
//   ASSIGN_OR_RETURN(ImagePatches p, PreprocessVideo(frames, config));
//   // p.grid = (t, h, w); p.values: [t*h*w][3 * 2 * 14 * 14]
//
// The resize reproduces torch's CPU uint8 kernel (the path torchvision takes
// for uint8 bicubic with antialias on a CPU): weights computed in double,
// rounded to int16 with the largest precision that keeps the largest weight
// below 2^15, horizontal pass first, 8-bit rounding after each pass. Frames
// equal transformers' bit for bit (video_preprocess_golden_test). Thread-safe (pure).
#ifndef MMSERVE_MODEL_VIDEO_PREPROCESS_H_
#define MMSERVE_MODEL_VIDEO_PREPROCESS_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "model/image_decode.h"
#include "model/image_preprocess.h"
#include "model/model_config.h"

namespace mmserve::model {

// Per-request sampling options; unset fields take the processor defaults.
struct VideoSampling {
  // Frames per second to sample. Unset: every frame (transformers'
  // do_sample_frames=False default); min/max_frames then do not apply.
  std::optional<double> fps;
  int64_t min_frames = 4;
  int64_t max_frames = 768;
};

// The indices of the frames Qwen2VLVideoProcessor.sample_frames keeps from a
// clip of `total_frames` frames at `video_fps`, ascending. InvalidArgument
// when it would keep none (a clip shorter than one temporal patch) or the
// inputs are not positive.
[[nodiscard]] absl::StatusOr<std::vector<int64_t>> SampleFrameIndices(int64_t total_frames,
                                                                      double video_fps,
                                                                      const VideoSampling& sampling,
                                                                      int temporal_patch_size);

// torchvision F.resize(frame, [height, width], BICUBIC, antialias=True) on a
// uint8 CPU tensor.
RgbImage ResizeBicubicTorch(const RgbImage& in, int width, int height);

// The grid of `num_frames` frames of width x height under `config`'s pixel
// limits (the router sizes a video from its header with this).
[[nodiscard]] absl::StatusOr<MediaGrid> VideoGrid(int64_t num_frames, int64_t width, int64_t height,
                                                  const PreprocessorConfig& config);

// pixel_values_videos and video_grid_thw of one video. `config` carries the
// video pixel limits. InvalidArgument for no frames or frames of different
// sizes.
[[nodiscard]] absl::StatusOr<ImagePatches> PreprocessVideo(const std::vector<RgbImage>& frames,
                                                           const PreprocessorConfig& config);

// The same at a grid computed elsewhere (Qwen3-VL's own resize rule,
// model/qwen3vl_video.h): every frame resized to grid's resized size, the
// last one repeated to fill the final temporal patch.
[[nodiscard]] absl::StatusOr<ImagePatches> PreprocessVideoToGrid(
    const std::vector<RgbImage>& frames, const MediaGrid& grid, const PreprocessorConfig& config);

}  // namespace mmserve::model

#endif  // MMSERVE_MODEL_VIDEO_PREPROCESS_H_
