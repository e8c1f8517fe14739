// Video containers through Debian's FFmpeg libraries (third_party:ffmpeg):
// a header probe that decodes nothing, and decoding of chosen frames to
// 8-bit RGB as transformers' PyAV reader gets them (frames counted in the
// decoder's output order, converted by libswscale to rgb24 with
// SWS_BILINEAR and the default colorspace, as PyAV's to_ndarray does).
//
//   ASSIGN_OR_RETURN(VideoHeader h, ProbeVideo(bytes, VideoLimits()));
//   ASSIGN_OR_RETURN(auto idx, SampleFrameIndices(h.frame_count, h.fps, s, 2));
//   ASSIGN_OR_RETURN(std::vector<RgbImage> frames,
//                    DecodeVideoFrames(bytes, idx, VideoLimits()));
//
// Input is untrusted: demuxers are limited to common file containers (no
// playlists or anything that opens other files), codecs to a list of video
// codecs, and the header is checked against the limits before any frame is
// decoded. Every failure is InvalidArgument with a reason. Thread-safe (each
// call has its own FFmpeg contexts).
#ifndef MMSERVE_MODEL_VIDEO_DECODE_H_
#define MMSERVE_MODEL_VIDEO_DECODE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "model/image_decode.h"

namespace mmserve::model {

struct VideoLimits {
  int64_t max_bytes = 64ll << 20;
  // Longest clip, by its header (frame count / frame rate).
  double max_duration_s = 600.0;
  // Most frames in the container.
  int64_t max_frames = 36000;
  // Largest frame (width * height): 4K UHD passes, 8K does not.
  int64_t max_frame_pixels = 4096ll * 2304;
  // Most frames one video may be sampled to (each becomes half a temporal
  // patch of tokens): transformers' max_frames default. A longer clip without
  // `fps` (which keeps every frame) is refused rather than truncated.
  int64_t max_sampled_frames = 768;
  // Most RGB bytes one DecodeVideoFrames call may hold (frames x pixels x 3).
  int64_t max_decoded_bytes = 1ll << 30;
};

struct VideoHeader {
  std::string container;  // demuxer name, e.g. "mov,mp4,m4a,3gp,3g2,mj2"
  std::string codec;      // e.g. "h264"
  int width = 0;
  int height = 0;
  // The stream's frame count (nb_frames, what PyAV's stream.frames reads);
  // when the container does not record it (Matroska/WebM), the video
  // packets counted by demuxing (no decoding).
  int64_t frame_count = 0;
  double fps = 0.0;         // the stream's average frame rate
  double duration_s = 0.0;  // frame_count / fps, as transformers computes it
};

// Reads the container header (and, without a recorded frame count, its
// packets) and checks it against `limits`: InvalidArgument for empty,
// unknown, truncated or corrupt data, no video stream, an unsupported codec,
// zero frames, no frame rate, or a clip over a limit.
[[nodiscard]] absl::StatusOr<VideoHeader> ProbeVideo(absl::string_view bytes,
                                                     const VideoLimits& limits);

// Decodes the frames at `indices` (ascending, as SampleFrameIndices gives
// them) to RGB. InvalidArgument when the data does not decode, a frame's
// size differs from the header's, or the clip ends before the last index.
[[nodiscard]] absl::StatusOr<std::vector<RgbImage>> DecodeVideoFrames(
    absl::string_view bytes, const std::vector<int64_t>& indices, const VideoLimits& limits);

}  // namespace mmserve::model

#endif  // MMSERVE_MODEL_VIDEO_DECODE_H_
