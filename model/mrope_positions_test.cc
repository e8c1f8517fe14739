#include "model/mrope_positions.h"

#include <catch2/catch.hpp>

namespace mmserve::model {
namespace {

using V = std::vector<int32_t>;
constexpr int32_t kPad = 151;

TEST_CASE("positions match transformers get_rope_index for two images", "[mrope]") {
  // Expected values printed by transformers 4.57.6 Qwen2VLModel.get_rope_index
  // for these ids with image_grid_thw [[1,4,6],[1,2,2]] and merge size 2.
  const V prompt = {1, 2, 3, 150, kPad, 4, 5, 150, kPad, 6};
  const std::vector<MediaGrid> grids = {MediaGrid::FromThw(1, 4, 6), MediaGrid::FromThw(1, 2, 2)};
  auto ids = ExpandImagePlaceholders(prompt, kPad, grids);
  REQUIRE(ids.ok());
  CHECK(*ids == V{1, 2, 3, 150, kPad, kPad, kPad, kPad, kPad, kPad, 4, 5, 150, kPad, 6});
  auto p = ComputeMropePositions(*ids, kPad, grids, 2);
  REQUIRE(p.ok());
  CHECK(p->t == V{0, 1, 2, 3, 4, 4, 4, 4, 4, 4, 7, 8, 9, 10, 11});
  CHECK(p->h == V{0, 1, 2, 3, 4, 4, 4, 5, 5, 5, 7, 8, 9, 10, 11});
  CHECK(p->w == V{0, 1, 2, 3, 4, 5, 6, 4, 5, 6, 7, 8, 9, 10, 11});
  CHECK(p->delta == -3);
}

TEST_CASE("text-only prompts get ordinary positions and no delta", "[mrope]") {
  auto p = ComputeMropePositions(V{5, 6, 7, 8}, kPad, {}, 2);
  REQUIRE(p.ok());
  CHECK(p->t == V{0, 1, 2, 3});
  CHECK(p->h == p->t);
  CHECK(p->w == p->t);
  CHECK(p->delta == 0);
}

TEST_CASE("a prompt ending in an image continues after its largest position", "[mrope]") {
  const std::vector<MediaGrid> grids = {MediaGrid::FromThw(1, 8, 4)};  // 4 x 2 merged: 8 tokens
  auto ids = ExpandImagePlaceholders(V{9, kPad}, kPad, grids);
  REQUIRE(ids.ok());
  auto p = ComputeMropePositions(*ids, kPad, grids, 2);
  REQUIRE(p.ok());
  CHECK(p->h.back() == 1 + 3);
  CHECK(p->delta == (1 + 4) - 9);  // next position 5, sequence length 9
}

TEST_CASE("image counts and run lengths must agree with the grids", "[mrope]") {
  const std::vector<MediaGrid> one = {MediaGrid::FromThw(1, 2, 2)};
  CHECK(ExpandImagePlaceholders(V{kPad, kPad}, kPad, one).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(ExpandImagePlaceholders(V{1, 2}, kPad, one).status().code() ==
        absl::StatusCode::kInvalidArgument);
  const std::vector<MediaGrid> big = {MediaGrid::FromThw(1, 4, 4)};  // needs 4 tokens
  auto short_run = ComputeMropePositions(V{1, kPad, kPad, 2}, kPad, big, 2);
  CHECK(short_run.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(ComputeMropePositions(V{1, kPad}, kPad, {}, 2).status().code() ==
        absl::StatusCode::kInvalidArgument);
}

constexpr int32_t kVideo = 152;

TEST_CASE("a video's time index advances per temporal patch; runs keep their own pads", "[mrope]") {
  // transformers 4.57.6 get_rope_index with video_grid_thw [[3,2,4]] and
  // image_grid_thw [[1,2,2]]: the video's t axis (3) outgrows h (1), w (2).
  const MediaPadIds pads{.image = kPad, .video = kVideo};
  const std::vector<MediaGrid> grids = {MediaGrid::FromThw(3, 2, 4, 2, MediaKind::kVideo),
                                        MediaGrid::FromThw(1, 2, 2)};
  auto ids = ExpandImagePlaceholders(V{1, kVideo, 2, kPad}, pads, grids);
  REQUIRE(ids.ok());
  CHECK(*ids == V{1, kVideo, kVideo, kVideo, kVideo, kVideo, kVideo, 2, kPad});
  auto p = ComputeMropePositions(*ids, pads, grids, 2);
  REQUIRE(p.ok());
  CHECK(p->t == V{0, 1, 1, 2, 2, 3, 3, 4, 5});
  CHECK(p->h == V{0, 1, 1, 1, 1, 1, 1, 4, 5});
  CHECK(p->w == V{0, 1, 2, 1, 2, 1, 2, 4, 5});
  CHECK(p->delta == 6 - 9);
}

TEST_CASE("a placeholder of the wrong kind is refused", "[mrope]") {
  const MediaPadIds pads{.image = kPad, .video = kVideo};
  const std::vector<MediaGrid> video = {MediaGrid::FromThw(1, 2, 2, 2, MediaKind::kVideo)};
  CHECK(ExpandImagePlaceholders(V{1, kPad}, pads, video).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(ComputeMropePositions(V{1, kPad}, pads, video, 2).status().code() ==
        absl::StatusCode::kInvalidArgument);
  // Without a video pad id the video token is plain text.
  auto text = ComputeMropePositions(V{1, kVideo}, kPad, {}, 2);
  REQUIRE(text.ok());
  CHECK(text->delta == 0);
}

TEST_CASE("Qwen3-VL videos: one run per temporal patch, positions as transformers", "[mrope]") {
  // Expected values printed by transformers 4.57.6 Qwen3VLModel.get_rope_index
  // for these ids (150 vision_start, 151 image pad, 152 video pad) with
  // image_grid_thw [[1,4,6]], video_grid_thw [[2,4,4]] and merge size 2.
  constexpr int32_t kImg = 151, kVid = 152, kStart = 150;
  const V ids = {1,    2,    kStart, kImg, kImg, kImg,   kImg, kImg, kImg, 3,    7, kStart, kVid,
                 kVid, kVid, kVid,   4,    8,    kStart, kVid, kVid, kVid, kVid, 5, 6};
  const std::vector<MediaGrid> grids = {MediaGrid::FromThw(1, 4, 6),
                                        MediaGrid::FromThw(2, 4, 4, 2, MediaKind::kVideo)};
  const std::vector<MediaGrid> frames = SplitVideoFrames(grids);
  REQUIRE(frames.size() == 3);
  CHECK(frames[2].kind == MediaKind::kVideo);
  CHECK(frames[2].grid_t == 1);
  auto p = ComputeMropePositions(ids, MediaPadIds{.image = kImg, .video = kVid}, frames, 2);
  REQUIRE(p.ok());
  CHECK(p->t ==
        V{0, 1, 2, 3, 3, 3, 3, 3, 3, 6, 7, 8, 9, 9, 9, 9, 11, 12, 13, 14, 14, 14, 14, 16, 17});
  CHECK(p->h ==
        V{0, 1, 2, 3, 3, 3, 4, 4, 4, 6, 7, 8, 9, 9, 10, 10, 11, 12, 13, 14, 14, 15, 15, 16, 17});
  CHECK(p->w ==
        V{0, 1, 2, 3, 4, 5, 3, 4, 5, 6, 7, 8, 9, 10, 9, 10, 11, 12, 13, 14, 15, 14, 15, 16, 17});
  CHECK(p->delta == -7);
  // Unsplit, the video's two frames would need one run of 8 tokens.
  CHECK(ComputeMropePositions(ids, MediaPadIds{.image = kImg, .video = kVid}, grids, 2)
            .status()
            .code() == absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace mmserve::model
