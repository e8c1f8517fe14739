#include "model/mrope_positions.h"

#include <catch2/catch.hpp>

namespace mmserve::model {
namespace {

using V = std::vector<int32_t>;
constexpr int32_t kPad = 151;

ImageGrid Grid(int t, int h, int w) {
  ImageGrid g;
  g.grid_t = t;
  g.grid_h = h;
  g.grid_w = w;
  return g;
}

TEST_CASE("positions match transformers get_rope_index for two images", "[mrope]") {
  // Expected values printed by transformers 4.57.6 Qwen2VLModel.get_rope_index
  // for these ids with image_grid_thw [[1,4,6],[1,2,2]] and merge size 2.
  const V prompt = {1, 2, 3, 150, kPad, 4, 5, 150, kPad, 6};
  const std::vector<ImageGrid> grids = {Grid(1, 4, 6), Grid(1, 2, 2)};
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
  const std::vector<ImageGrid> grids = {Grid(1, 8, 4)};  // 4 x 2 merged: 8 tokens
  auto ids = ExpandImagePlaceholders(V{9, kPad}, kPad, grids);
  REQUIRE(ids.ok());
  auto p = ComputeMropePositions(*ids, kPad, grids, 2);
  REQUIRE(p.ok());
  CHECK(p->h.back() == 1 + 3);
  CHECK(p->delta == (1 + 4) - 9);  // next position 5, sequence length 9
}

TEST_CASE("image counts and run lengths must agree with the grids", "[mrope]") {
  const std::vector<ImageGrid> one = {Grid(1, 2, 2)};
  CHECK(ExpandImagePlaceholders(V{kPad, kPad}, kPad, one).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(ExpandImagePlaceholders(V{1, 2}, kPad, one).status().code() ==
        absl::StatusCode::kInvalidArgument);
  const std::vector<ImageGrid> big = {Grid(1, 4, 4)};  // needs 4 tokens
  auto short_run = ComputeMropePositions(V{1, kPad, kPad, 2}, kPad, big, 2);
  CHECK(short_run.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(ComputeMropePositions(V{1, kPad}, kPad, {}, 2).status().code() ==
        absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace mmserve::model
