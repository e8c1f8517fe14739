#include "model/image_tokens.h"

#include <catch2/catch.hpp>

namespace mmserve::model {
namespace {

struct Case {
  int64_t width, height;
  int want_h, want_w;
};

// Reference values printed by transformers 4.57.6 smart_resize(height, width,
// factor=28, min_pixels=56*56, max_pixels=28*28*1280).
constexpr Case kDefaultCases[] = {
    {56, 56, 56, 56}, {224, 224, 224, 224}, {300, 200, 196, 308},    {1000, 50, 56, 1008},
    {20, 20, 56, 56}, {1000, 10, 28, 560},  {1920, 1080, 728, 1316}, {4000, 3000, 840, 1148},
    {42, 42, 56, 56}, {70, 70, 56, 56},     {3, 600, 812, 28},       {14, 2800, 812, 28},
    {1, 1, 56, 56},
};

TEST_CASE("smart resize matches transformers for small, large and extreme images",
          "[image_tokens]") {
  ImageGridParams p;
  for (const Case& c : kDefaultCases) {
    INFO(c.width << "x" << c.height);
    auto g = SmartResize(c.width, c.height, p);
    REQUIRE(g.ok());
    CHECK(g->resized_height == c.want_h);
    CHECK(g->resized_width == c.want_w);
    CHECK(g->grid_h == c.want_h / 14);
    CHECK(g->grid_w == c.want_w / 14);
    CHECK(g->num_tokens() == (c.want_h / 28) * (c.want_w / 28));
  }
}

TEST_CASE("rounding is half to even, as Python's round()", "[image_tokens]") {
  // 42/28 = 1.5 -> 2 and 70/28 = 2.5 -> 2: both become 56 (with min_pixels
  // forcing at least 56x56 for the first anyway).
  ImageGridParams p;
  p.min_pixels = 1;
  CHECK(SmartResize(70, 70, p)->resized_height == 56);
  CHECK(SmartResize(98, 98, p)->resized_height == 112);  // 3.5 -> 4
}

TEST_CASE("a small max_pixels scales large images down to fit", "[image_tokens]") {
  ImageGridParams p;
  p.max_pixels = 50176;
  auto g = SmartResize(640, 480, p);  // transformers: (168, 252)
  REQUIRE(g.ok());
  CHECK(g->resized_height == 168);
  CHECK(g->resized_width == 252);
  CHECK(g->resized_height * g->resized_width <= p.max_pixels);
  CHECK(g->num_tokens() == 6 * 9);
}

TEST_CASE("impossible sizes are rejected", "[image_tokens]") {
  ImageGridParams p;
  CHECK(SmartResize(0, 10, p).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(SmartResize(10, -1, p).status().code() == absl::StatusCode::kInvalidArgument);
  auto s = SmartResize(2, 500, p).status();  // aspect ratio 250
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(s.message().find("aspect ratio") != absl::string_view::npos);
}

}  // namespace
}  // namespace mmserve::model
