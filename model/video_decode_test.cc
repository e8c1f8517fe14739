// Container probing and decoding on hostile inputs: every one refused with
// InvalidArgument and a reason, before any frame is decoded where the header
// tells (ASan runs check that nothing leaks on these paths).
#include "model/video_decode.h"

#include <catch2/catch.hpp>
#include <string>

#include "absl/strings/match.h"
#include "common/file.h"

namespace mmserve::model {
namespace {

std::string Clip(const std::string& name) {
  auto bytes = ReadFileToString("model/testdata/video/clips/" + name);
  INFO(name);
  REQUIRE(bytes.ok());
  return *bytes;
}

void CheckRefused(const absl::StatusOr<VideoHeader>& h, absl::string_view reason) {
  INFO(h.status().ToString());
  REQUIRE(absl::IsInvalidArgument(h.status()));
  CHECK(absl::StrContains(h.status().message(), reason));
}

TEST_CASE("the probe reads the header") {
  auto h = ProbeVideo(Clip("h264_96x64_21f.mp4"), VideoLimits());
  REQUIRE(h.ok());
  CHECK(h->codec == "h264");
  CHECK(h->width == 96);
  CHECK(h->height == 64);
  CHECK(h->frame_count == 21);
  CHECK(h->fps == 10.0);
  CHECK(h->duration_s == Approx(2.1));
}

TEST_CASE("WebM without a frame count: the packets are counted") {
  auto h = ProbeVideo(Clip("vp9_70x54_16f.webm"), VideoLimits());
  REQUIRE(h.ok());
  CHECK(h->codec == "vp9");
  CHECK(h->frame_count == 16);
  CHECK(h->fps > 0);
  auto frames = DecodeVideoFrames(Clip("vp9_70x54_16f.webm"), {0, 15}, VideoLimits());
  REQUIRE(frames.ok());
  CHECK(frames->size() == 2);
}

TEST_CASE("hostile containers are refused with the reason") {
  const std::string mp4 = Clip("h264_96x64_21f.mp4");
  CheckRefused(ProbeVideo("", VideoLimits()), "empty");
  // Text: a demuxer may claim it, but it has no video stream either way.
  CheckRefused(ProbeVideo("not a video at all, just some text", VideoLimits()), "video: ");
  CheckRefused(ProbeVideo(mp4.substr(0, mp4.size() / 2), VideoLimits()), "container");
  CheckRefused(ProbeVideo(Clip("zero_frames.avi"), VideoLimits()), "no frames");
  CheckRefused(ProbeVideo(Clip("hours.mp4"), VideoLimits()), "duration");
  CheckRefused(ProbeVideo(Clip("8k_vp9.webm"), VideoLimits()), "7680x4320");
  CheckRefused(ProbeVideo(Clip("ffv1_32x32.mkv"), VideoLimits()), "unsupported codec ffv1");
  CheckRefused(ProbeVideo(Clip("audio_only.wav"), VideoLimits()),
               "container");  // WAV: not a video container
  VideoLimits small;
  small.max_bytes = 100;
  CheckRefused(ProbeVideo(mp4, small), "exceed the limit");
  small = VideoLimits();
  small.max_frames = 20;
  CheckRefused(ProbeVideo(mp4, small), "more than 20 frames");
}

TEST_CASE("corrupt frame data and short clips fail to decode") {
  std::string mp4 = Clip("h264_96x64_21f.mp4");
  auto past_end = DecodeVideoFrames(mp4, {0, 30}, VideoLimits());
  REQUIRE(absl::IsInvalidArgument(past_end.status()));
  CHECK(absl::StrContains(past_end.status().message(), "ends before frame 30"));
  // Garbage over the middle of the file (the sample data): refused or
  // decoded with concealment, never a crash (ASan checks the rest).
  for (size_t i = mp4.size() / 4; i < mp4.size() * 3 / 4; i += 7) mp4[i] = static_cast<char>(i);
  auto frames = DecodeVideoFrames(mp4, {0, 5, 10, 20}, VideoLimits());
  if (!frames.ok()) CHECK(absl::IsInvalidArgument(frames.status()));
  VideoLimits small;
  small.max_decoded_bytes = 96 * 64 * 3;
  CHECK(absl::IsInvalidArgument(
      DecodeVideoFrames(Clip("h264_96x64_21f.mp4"), {0, 1}, small).status()));
}

}  // namespace
}  // namespace mmserve::model
