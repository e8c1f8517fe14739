// Video parts: the grid from headers equals the grid of the decoded video
// (the router's sizing is exact), options and limits are checked, and the
// content hash covers the bytes and the sampling options.
#include "model/video_request.h"

#include <catch2/catch.hpp>
#include <string>

#include "absl/strings/match.h"
#include "common/file.h"

namespace mmserve::model {
namespace {

constexpr char kDir[] = "model/testdata/video/";

std::string Read(const std::string& name) {
  auto bytes = ReadFileToString(std::string(kDir) + name);
  INFO(name);
  REQUIRE(bytes.ok());
  return *bytes;
}

PreprocessorConfig Tiny() {
  PreprocessorConfig c;
  c.min_pixels = 3136;
  c.max_pixels = 12544;
  return c;
}

void CheckSizedExactly(const mmserve::v1::Video& v) {
  auto grid = VideoGridFromHeaders(v, Tiny(), VideoLimits(), DecodeLimits());
  REQUIRE(grid.ok());
  auto patches = LoadVideo(v, Tiny(), VideoLimits(), DecodeLimits());
  REQUIRE(patches.ok());
  CHECK(grid->grid_t == patches->grid.grid_t);
  CHECK(grid->grid_h == patches->grid.grid_h);
  CHECK(grid->grid_w == patches->grid.grid_w);
  CHECK(grid->num_tokens() * 4 == patches->grid.num_patches());
}

void CheckRefused(const absl::Status& s, absl::string_view reason) {
  INFO(s.ToString());
  CHECK(absl::IsInvalidArgument(s));
  CHECK(absl::StrContains(s.message(), reason));
}

TEST_CASE("the grid from headers is the decoded video's") {
  for (const char* clip : {"clips/h264_96x64_21f.mp4", "clips/vp9_70x54_16f.webm"}) {
    mmserve::v1::Video v;
    v.set_data(Read(clip));
    CheckSizedExactly(v);
    v.set_fps(2.0);
    CheckSizedExactly(v);
    v.set_max_pixels(3136 * 2);
    CheckSizedExactly(v);
  }
  mmserve::v1::Video frames;
  for (int i = 0; i < 5; ++i) {
    frames.mutable_frames()->add_frames()->set_data(
        Read("frames/jpg_64x48_x5_" + std::to_string(i) + ".jpg"));
  }
  CheckSizedExactly(frames);
}

TEST_CASE("options and limits are refused with the reason") {
  mmserve::v1::Video v;
  v.set_data(Read("clips/h264_96x64_21f.mp4"));
  v.set_fps(-1);
  CheckRefused(VideoOptionsFor(v, Tiny()).status(), "fps must be positive");
  v.set_fps(2);
  v.set_min_frames(10);
  v.set_max_frames(4);
  CheckRefused(VideoOptionsFor(v, Tiny()).status(), "min_frames");
  v.clear_min_frames();
  v.clear_max_frames();
  v.set_min_pixels(100);
  v.set_max_pixels(50);
  CheckRefused(VideoOptionsFor(v, Tiny()).status(), "min_pixels");
  v.clear_min_pixels();
  v.clear_max_pixels();
  VideoLimits small;
  small.max_frames = 10;
  CheckRefused(VideoGridFromHeaders(v, Tiny(), small, DecodeLimits()).status(), "more than 10");
  small = VideoLimits();
  small.max_sampled_frames = 8;  // all 21 frames without fps; 4 with fps 2
  v.clear_fps();
  CheckRefused(VideoGridFromHeaders(v, Tiny(), small, DecodeLimits()).status(),
               "21 frames to sample exceed the limit of 8 (set fps");
  CheckRefused(LoadVideo(v, Tiny(), small, DecodeLimits()).status(), "21 frames to sample");
  v.set_fps(2);
  CHECK(VideoGridFromHeaders(v, Tiny(), small, DecodeLimits()).ok());

  mmserve::v1::Video mixed;
  mixed.mutable_frames()->add_frames()->set_data(Read("frames/jpg_64x48_x5_0.jpg"));
  mixed.mutable_frames()->add_frames()->set_data(Read("frames/png_45x30_x1_0.png"));
  CheckRefused(VideoGridFromHeaders(mixed, Tiny(), VideoLimits(), DecodeLimits()).status(),
               "frame 1 is 45x30; frame 0 is 64x48");
  CheckRefused(LoadVideo(mixed, Tiny(), VideoLimits(), DecodeLimits()).status(), "frame 1");
  mixed.set_fps(1);
  CheckRefused(VideoOptionsFor(mixed, Tiny()).status(), "container files only");
  mmserve::v1::Video empty;
  empty.mutable_frames();
  CheckRefused(VideoGridFromHeaders(empty, Tiny(), VideoLimits(), DecodeLimits()).status(),
               "no frames");
  mmserve::v1::Video junk;
  junk.mutable_frames()->add_frames()->set_data("not an image");
  CheckRefused(VideoGridFromHeaders(junk, Tiny(), VideoLimits(), DecodeLimits()).status(),
               "frame 0");
}

TEST_CASE("the content hash covers bytes and sampling options") {
  mmserve::v1::Video a;
  a.set_data(Read("clips/h264_96x64_21f.mp4"));
  mmserve::v1::Video b = a;
  CHECK(VideoContentHash(a) == VideoContentHash(b));
  b.set_fps(2.0);
  CHECK_FALSE(VideoContentHash(a) == VideoContentHash(b));
  mmserve::v1::Video c = a;
  c.set_max_pixels(12544);
  CHECK_FALSE(VideoContentHash(a) == VideoContentHash(c));
  mmserve::v1::Video d = a;
  d.mutable_data()->back() ^= 1;
  CHECK_FALSE(VideoContentHash(a) == VideoContentHash(d));
  mmserve::v1::Video one_frame;  // a frame list is not the same file
  one_frame.mutable_frames()->add_frames()->set_data(a.data());
  CHECK_FALSE(VideoContentHash(a) == VideoContentHash(one_frame));
}

}  // namespace
}  // namespace mmserve::model
