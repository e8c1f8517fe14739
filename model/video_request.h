// A video part of a request (mmserve.v1.Video) made into what the router and
// the encoder need: its sampling options with the processor defaults, its
// content hash (the embedding-cache and prefix-cache key), its grid from
// headers alone (the router sizes the receiver with it before anything is
// decoded), and its patches (the encoder's decode + sample + preprocess).
//
//   ASSIGN_OR_RETURN(MediaGrid g, VideoGridFromHeaders(video, cfg, vlimits, ilimits));
//   ContentHash key = VideoContentHash(video);
//   ASSIGN_OR_RETURN(ImagePatches p, LoadVideo(video, cfg, vlimits, ilimits));
//
// A container file is probed and sampled as Qwen2VLVideoProcessor does (all
// frames unless `fps` is set), or as Qwen3VLVideoProcessor does when the
// preprocessor has Qwen3 video settings (2 fps by default, a pixel budget
// over all frames; Qwen3-VL takes container files only); a frame list is taken whole (transformers
// refuses to sample one, and so does this: `fps` on a frame list is
// InvalidArgument). Unset pixel limits take the model's preprocessor config
// (transformers' video processor reads the same file when the checkpoint
// has no video_preprocessor_config.json). Every refusal is InvalidArgument
// with a reason. Thread-safe (pure functions).
#ifndef MMSERVE_MODEL_VIDEO_REQUEST_H_
#define MMSERVE_MODEL_VIDEO_REQUEST_H_

#include <vector>

#include "absl/status/statusor.h"
#include "common/hash.h"
#include "model/image_decode.h"
#include "model/image_preprocess.h"
#include "model/model_config.h"
#include "model/video_decode.h"
#include "model/video_preprocess.h"
#include "proto/common.pb.h"

namespace mmserve::model {

struct VideoOptions {
  VideoSampling sampling;
  PreprocessorConfig config;  // `base` with the request's pixel limits
};

[[nodiscard]] absl::StatusOr<VideoOptions> VideoOptionsFor(const mmserve::v1::Video& video,
                                                           const PreprocessorConfig& base);

// XXH3-128 over the clip's bytes (or each frame's) and the sampling options:
// the same clip sampled differently is a different key.
ContentHash VideoContentHash(const mmserve::v1::Video& video);

// The grid (t, h, w) the video will have, from the container header or the
// frames' image headers; checks every limit.
[[nodiscard]] absl::StatusOr<MediaGrid> VideoGridFromHeaders(const mmserve::v1::Video& video,
                                                             const PreprocessorConfig& base,
                                                             const VideoLimits& video_limits,
                                                             const DecodeLimits& image_limits);

// Qwen3-VL (base.qwen3_video): each temporal patch's timestamp in seconds
// (model/qwen3vl_video.h), from the container header; empty for the other
// families. Its prompt shows them, so the language side needs them.
[[nodiscard]] absl::StatusOr<std::vector<double>> VideoTimestampsFromHeaders(
    const mmserve::v1::Video& video, const PreprocessorConfig& base,
    const VideoLimits& video_limits);

// pixel_values_videos and the grid.
[[nodiscard]] absl::StatusOr<ImagePatches> LoadVideo(const mmserve::v1::Video& video,
                                                     const PreprocessorConfig& base,
                                                     const VideoLimits& video_limits,
                                                     const DecodeLimits& image_limits);

}  // namespace mmserve::model

#endif  // MMSERVE_MODEL_VIDEO_REQUEST_H_
