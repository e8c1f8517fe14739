// Hostile container bytes through the router's probe and the encoder's
// decode (model/video_decode.h). Properties: every refusal is
// InvalidArgument; an accepted header has a positive size, frame count and
// frame rate within the limits; a decode never succeeds where the probe
// fails, and a decoded frame has the header's size and width * height * 3
// bytes.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/strings/string_view.h"
#include "fuzz/fuzz_check.h"
#include "model/video_decode.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace mmserve::model;
  const absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  // Small limits keep each run fast; the limit checks are part of what is
  // exercised.
  VideoLimits limits;
  limits.max_frames = 2000;
  limits.max_frame_pixels = 1 << 20;
  limits.max_decoded_bytes = 16 << 20;
  const absl::StatusOr<VideoHeader> header = ProbeVideo(bytes, limits);
  if (!header.ok()) {
    FUZZ_CHECK(absl::IsInvalidArgument(header.status())) << header.status();
  } else {
    FUZZ_CHECK(header->width > 0 && header->height > 0) << header->width << "x" << header->height;
    FUZZ_CHECK(int64_t{header->width} * header->height <= limits.max_frame_pixels);
    FUZZ_CHECK(header->frame_count > 0 && header->frame_count <= limits.max_frames)
        << header->frame_count;
    FUZZ_CHECK(header->fps > 0 && header->duration_s <= limits.max_duration_s) << header->fps;
  }
  const std::vector<int64_t> indices = {0, 1};
  const absl::StatusOr<std::vector<RgbImage>> frames = DecodeVideoFrames(bytes, indices, limits);
  if (!frames.ok()) {
    FUZZ_CHECK(absl::IsInvalidArgument(frames.status())) << frames.status();
    return 0;
  }
  FUZZ_CHECK(header.ok()) << "decoded a video whose probe failed: " << header.status();
  FUZZ_CHECK(frames->size() == indices.size()) << frames->size();
  for (const RgbImage& f : *frames) {
    FUZZ_CHECK(f.width == header->width && f.height == header->height)
        << f.width << "x" << f.height;
    FUZZ_CHECK(f.pixels.size() == static_cast<size_t>(f.width) * f.height * 3);
  }
  return 0;
}
