#include "model/video_request.h"

#include <xxhash.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "model/qwen3vl_video.h"

namespace mmserve::model {
namespace {

absl::Status Invalid(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("video: ", what));
}

// Frame bytes of a frame list, checked against the limits.
absl::StatusOr<std::vector<absl::string_view>> FrameBytes(const mmserve::v1::VideoFrames& frames,
                                                          const VideoLimits& limits) {
  if (frames.frames_size() == 0) return Invalid("no frames");
  if (frames.frames_size() > limits.max_frames) {
    return Invalid(
        absl::StrCat(frames.frames_size(), " frames exceed the limit of ", limits.max_frames));
  }
  std::vector<absl::string_view> out;
  int64_t total = 0;
  for (const mmserve::v1::Image& f : frames.frames()) {
    total += static_cast<int64_t>(f.data().size());
    out.push_back(f.data());
  }
  if (total > limits.max_bytes) {
    return Invalid(absl::StrCat(total, " bytes of frames exceed the limit of ", limits.max_bytes));
  }
  return out;
}

// The frames' common size from their image headers.
absl::StatusOr<ImageHeader> CommonFrameHeader(const std::vector<absl::string_view>& frames,
                                              const DecodeLimits& limits) {
  ImageHeader first;
  for (size_t i = 0; i < frames.size(); ++i) {
    absl::StatusOr<ImageHeader> h = ReadImageHeader(frames[i]);
    if (!h.ok()) return Invalid(absl::StrCat("frame ", i, ": ", h.status().message()));
    if (int64_t{h->width} * h->height > limits.max_pixels) {
      return Invalid(
          absl::StrCat("frame ", i, " is ", h->width, "x", h->height, ", above the pixel limit"));
    }
    if (i == 0) {
      first = *h;
    } else if (h->width != first.width || h->height != first.height) {
      return Invalid(absl::StrCat("frame ", i, " is ", h->width, "x", h->height, "; frame 0 is ",
                                  first.width, "x", first.height));
    }
  }
  return first;
}

void Update(XXH3_state_t* s, const void* p, size_t n) { XXH3_128bits_update(s, p, n); }
void UpdateU64(XXH3_state_t* s, uint64_t v) { Update(s, &v, sizeof(v)); }
void UpdateBytes(XXH3_state_t* s, absl::string_view b) {
  UpdateU64(s, b.size());
  Update(s, b.data(), b.size());
}

// The sampled frames' count and decoded size against the limits.
absl::Status CheckSampled(int64_t frames, int64_t width, int64_t height,
                          const VideoLimits& limits) {
  if (frames > limits.max_sampled_frames) {
    return Invalid(absl::StrCat(frames, " frames to sample exceed the limit of ",
                                limits.max_sampled_frames, " (set fps to sample fewer)"));
  }
  if (frames * width * height * 3 > limits.max_decoded_bytes) {
    return Invalid(
        absl::StrCat(frames, " frames of ", width, "x", height, " exceed the decoded-size limit"));
  }
  return absl::OkStatus();
}

// A Qwen3-VL video's plan from its header: the processor config with the
// request's limits, the clip's header and the sampled frames.
struct Qwen3Plan {
  Qwen3VideoConfig config;
  VideoHeader header;
  std::vector<int64_t> indices;
};

absl::StatusOr<Qwen3Plan> PlanQwen3(const mmserve::v1::Video& video, const PreprocessorConfig& base,
                                    const VideoLimits& limits) {
  RETURN_IF_ERROR(VideoOptionsFor(video, base).status());  // the options' own checks
  if (video.has_frames()) {
    return Invalid("Qwen3-VL samples a video from its container file; send the clip, not frames");
  }
  Qwen3Plan p;
  p.config = Qwen3VideoConfigOf(base);
  if (video.has_min_frames()) p.config.min_frames = video.min_frames();
  if (video.has_max_frames()) p.config.max_frames = video.max_frames();
  if (video.has_min_pixels()) p.config.base.min_pixels = video.min_pixels();
  if (video.has_max_pixels()) p.config.base.max_pixels = video.max_pixels();
  ASSIGN_OR_RETURN(p.header, ProbeVideo(video.data(), limits));
  Qwen3VideoSampling sampling;
  if (video.has_fps()) sampling.fps = video.fps();
  absl::StatusOr<std::vector<int64_t>> indices =
      Qwen3SampleFrameIndices(p.header.frame_count, p.header.fps, sampling, p.config);
  if (!indices.ok()) return Invalid(indices.status().message());
  p.indices = *std::move(indices);
  RETURN_IF_ERROR(CheckSampled(static_cast<int64_t>(p.indices.size()), p.header.width,
                               p.header.height, limits));
  return p;
}

absl::StatusOr<MediaGrid> Qwen3Grid(const Qwen3Plan& p) {
  absl::StatusOr<MediaGrid> g = Qwen3VideoGrid(static_cast<int64_t>(p.indices.size()),
                                               p.header.width, p.header.height, p.config);
  if (!g.ok()) return Invalid(g.status().message());
  return g;
}

}  // namespace

absl::StatusOr<std::vector<double>> VideoTimestampsFromHeaders(const mmserve::v1::Video& video,
                                                               const PreprocessorConfig& base,
                                                               const VideoLimits& video_limits) {
  if (!base.qwen3_video) return std::vector<double>();
  ASSIGN_OR_RETURN(const Qwen3Plan p, PlanQwen3(video, base, video_limits));
  return Qwen3FrameTimestamps(p.indices, p.header.fps, p.config.base.merge_size);
}

absl::StatusOr<VideoOptions> VideoOptionsFor(const mmserve::v1::Video& video,
                                             const PreprocessorConfig& base) {
  VideoOptions o;
  o.config = base;
  if (video.has_fps()) {
    if (!std::isfinite(video.fps()) || video.fps() <= 0) return Invalid("fps must be positive");
    if (video.has_frames()) return Invalid("fps sampling applies to container files only");
    o.sampling.fps = video.fps();
  }
  if (video.has_min_frames()) o.sampling.min_frames = video.min_frames();
  if (video.has_max_frames()) o.sampling.max_frames = video.max_frames();
  if (o.sampling.min_frames < 1 || o.sampling.max_frames < o.sampling.min_frames) {
    return Invalid("need 1 <= min_frames <= max_frames");
  }
  if (video.has_min_pixels()) o.config.min_pixels = video.min_pixels();
  if (video.has_max_pixels()) o.config.max_pixels = video.max_pixels();
  if (o.config.min_pixels < 1 || o.config.max_pixels < o.config.min_pixels) {
    return Invalid("need 1 <= min_pixels <= max_pixels");
  }
  return o;
}

ContentHash VideoContentHash(const mmserve::v1::Video& video) {
  XXH3_state_t* s = XXH3_createState();
  XXH3_128bits_reset(s);
  Update(s, "mmserve-video-1", 15);
  if (video.has_frames()) {
    UpdateU64(s, 'f');
    UpdateU64(s, video.frames().frames_size());
    for (const mmserve::v1::Image& f : video.frames().frames()) UpdateBytes(s, f.data());
  } else {
    UpdateU64(s, 'd');
    UpdateBytes(s, video.data());
  }
  uint64_t fps_bits = 0;
  const double fps = video.fps();
  std::memcpy(&fps_bits, &fps, sizeof(fps));
  for (const uint64_t v : {uint64_t{video.has_fps()}, fps_bits, uint64_t{video.has_max_frames()},
                           uint64_t{video.max_frames()}, uint64_t{video.has_min_frames()},
                           uint64_t{video.min_frames()}, uint64_t{video.has_min_pixels()},
                           uint64_t{video.min_pixels()}, uint64_t{video.has_max_pixels()},
                           uint64_t{video.max_pixels()}}) {
    UpdateU64(s, v);
  }
  const XXH128_hash_t h = XXH3_128bits_digest(s);
  XXH3_freeState(s);
  return ContentHash{h.high64, h.low64};
}

absl::StatusOr<MediaGrid> VideoGridFromHeaders(const mmserve::v1::Video& video,
                                               const PreprocessorConfig& base,
                                               const VideoLimits& video_limits,
                                               const DecodeLimits& image_limits) {
  if (base.qwen3_video) {
    ASSIGN_OR_RETURN(const Qwen3Plan p, PlanQwen3(video, base, video_limits));
    return Qwen3Grid(p);
  }
  ASSIGN_OR_RETURN(const VideoOptions o, VideoOptionsFor(video, base));
  if (video.has_frames()) {
    ASSIGN_OR_RETURN(const auto frames, FrameBytes(video.frames(), video_limits));
    ASSIGN_OR_RETURN(const ImageHeader h, CommonFrameHeader(frames, image_limits));
    RETURN_IF_ERROR(
        CheckSampled(static_cast<int64_t>(frames.size()), h.width, h.height, video_limits));
    return VideoGrid(static_cast<int64_t>(frames.size()), h.width, h.height, o.config);
  }
  ASSIGN_OR_RETURN(const VideoHeader h, ProbeVideo(video.data(), video_limits));
  ASSIGN_OR_RETURN(const auto indices, SampleFrameIndices(h.frame_count, h.fps, o.sampling,
                                                          o.config.temporal_patch_size));
  RETURN_IF_ERROR(
      CheckSampled(static_cast<int64_t>(indices.size()), h.width, h.height, video_limits));
  return VideoGrid(static_cast<int64_t>(indices.size()), h.width, h.height, o.config);
}

absl::StatusOr<ImagePatches> LoadVideo(const mmserve::v1::Video& video,
                                       const PreprocessorConfig& base,
                                       const VideoLimits& video_limits,
                                       const DecodeLimits& image_limits) {
  if (base.qwen3_video) {
    ASSIGN_OR_RETURN(const Qwen3Plan p, PlanQwen3(video, base, video_limits));
    ASSIGN_OR_RETURN(const MediaGrid grid, Qwen3Grid(p));
    ASSIGN_OR_RETURN(const std::vector<RgbImage> frames,
                     DecodeVideoFrames(video.data(), p.indices, video_limits));
    return PreprocessVideoToGrid(frames, grid, p.config.base);
  }
  ASSIGN_OR_RETURN(const VideoOptions o, VideoOptionsFor(video, base));
  std::vector<RgbImage> frames;
  if (video.has_frames()) {
    ASSIGN_OR_RETURN(const auto bytes, FrameBytes(video.frames(), video_limits));
    ASSIGN_OR_RETURN(const ImageHeader h, CommonFrameHeader(bytes, image_limits));
    RETURN_IF_ERROR(
        CheckSampled(static_cast<int64_t>(bytes.size()), h.width, h.height, video_limits));
    for (size_t i = 0; i < bytes.size(); ++i) {
      absl::StatusOr<RgbImage> f = DecodeImage(bytes[i], image_limits);
      if (!f.ok()) return Invalid(absl::StrCat("frame ", i, ": ", f.status().message()));
      frames.push_back(*std::move(f));
    }
  } else {
    ASSIGN_OR_RETURN(const VideoHeader h, ProbeVideo(video.data(), video_limits));
    ASSIGN_OR_RETURN(const auto indices, SampleFrameIndices(h.frame_count, h.fps, o.sampling,
                                                            o.config.temporal_patch_size));
    RETURN_IF_ERROR(
        CheckSampled(static_cast<int64_t>(indices.size()), h.width, h.height, video_limits));
    ASSIGN_OR_RETURN(frames, DecodeVideoFrames(video.data(), indices, video_limits));
  }
  return PreprocessVideo(frames, o.config);
}

}  // namespace mmserve::model
