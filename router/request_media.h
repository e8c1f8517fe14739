// The images and videos of a GenerateRequest, in one order: the index space
// the encoder calls, PromptImage.image_index and the language side share
// (chat parts in order; raw placeholders in the order they stand in the
// text). Videos' own checks and sizing live here: sampling options and
// limits from the container header or the frames' image headers, all
// before anything is decoded. Pure functions, thread-safe.
//
//   for (const MediaPart& m : RequestMedia(request)) { m.image or m.video }
//   ASSIGN_OR_RETURN(PreparedMedia p, PrepareVideo(options, *m.video, k));
#ifndef MMSERVE_ROUTER_REQUEST_MEDIA_H_
#define MMSERVE_ROUTER_REQUEST_MEDIA_H_

#include <cstddef>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/inference.pb.h"
#include "router/request_validation.h"

namespace mmserve::router {

// Exactly one of the two is set.
struct MediaPart {
  const mmserve::v1::Image* image = nullptr;
  const mmserve::v1::Video* video = nullptr;
};

std::vector<MediaPart> RequestMedia(const mmserve::v1::GenerateRequest& request);

// The video parts' checks that read no header: user messages only, raw
// placeholders matching raw.videos, non-empty, bytes within
// options.max_video_bytes, images + videos within options.max_images.
[[nodiscard]] absl::Status ValidateVideos(const RouterOptions& options,
                                          const mmserve::v1::GenerateRequest& request);

// Media index k's content hash (bytes and sampling options) and, with
// options.presize, its exact grid from the headers, every limit checked.
[[nodiscard]] absl::StatusOr<PreparedMedia> PrepareVideo(const RouterOptions& options,
                                                         const mmserve::v1::Video& video, size_t k);

}  // namespace mmserve::router

#endif  // MMSERVE_ROUTER_REQUEST_MEDIA_H_
