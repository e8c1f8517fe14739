#include "model/image_preprocess.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>

#include "common/file.h"

namespace mmserve::model {
namespace {

std::string Read(const std::string& name) {
  auto bytes = ReadFileToString("model/testdata/images/" + name);
  REQUIRE(bytes.ok());
  return *bytes;
}

// Cases written by tools/gen_image_goldens.py from transformers 4.57.6's
// Qwen2VLImageProcessor and PIL's Image.resize(BICUBIC).
TEST_CASE("preprocessing matches Qwen2VLImageProcessor on every golden case", "[preprocess]") {
  nlohmann::json cases = nlohmann::json::parse(Read("preprocess_cases.json"));
  REQUIRE(cases.size() >= 4);
  for (const auto& c : cases) {
    const std::string name = c["case"];
    INFO(name);
    auto img = DecodeImage(Read(c["image"]), DecodeLimits());
    REQUIRE(img.ok());
    PreprocessorConfig cfg;
    cfg.min_pixels = c["min_pixels"];
    cfg.max_pixels = c["max_pixels"];

    // The resize alone is PIL's, byte for byte.
    const int h = c["resized_hw"][0], w = c["resized_hw"][1];
    RgbImage resized = ResizeBicubic(*img, w, h);
    const std::string want_rgb = Read(name + ".resized.rgb");
    REQUIRE(resized.pixels.size() == want_rgb.size());
    CHECK(std::memcmp(resized.pixels.data(), want_rgb.data(), want_rgb.size()) == 0);

    auto patches = PreprocessImage(*img, cfg);
    REQUIRE(patches.ok());
    CHECK(patches->grid.grid_t == c["grid_thw"][0]);
    CHECK(patches->grid.grid_h == c["grid_thw"][1]);
    CHECK(patches->grid.grid_w == c["grid_thw"][2]);
    const std::string want = Read(name + ".pixels.f32");
    REQUIRE(patches->values.size() * 4 == want.size());
    CHECK(patches->patch_dim == c["patches"][1]);
    float worst = 0;
    for (size_t i = 0; i < patches->values.size(); ++i) {
      float ref;
      std::memcpy(&ref, want.data() + i * 4, 4);
      worst = std::max(worst, std::fabs(ref - patches->values[i]));
    }
    // Same float operations in the same order: identical values.
    CHECK(worst == 0.0f);
  }
}

TEST_CASE("resizing a constant image keeps it constant", "[preprocess]") {
  RgbImage img;
  img.width = 37;
  img.height = 23;
  img.pixels.assign(37 * 23 * 3, 77);
  for (auto [w, h] : {std::pair{112, 56}, std::pair{14, 9}, std::pair{37, 60}}) {
    RgbImage out = ResizeBicubic(img, w, h);
    REQUIRE(out.pixels.size() == static_cast<size_t>(w * h * 3));
    for (uint8_t v : out.pixels) REQUIRE(v == 77);
  }
}

TEST_CASE("the same size is a copy and patch count follows the grid", "[preprocess]") {
  RgbImage img;
  img.width = 56;
  img.height = 56;
  img.pixels.resize(56 * 56 * 3);
  for (size_t i = 0; i < img.pixels.size(); ++i) img.pixels[i] = static_cast<uint8_t>(i * 7);
  CHECK(ResizeBicubic(img, 56, 56).pixels == img.pixels);
  auto p = PreprocessImage(img, PreprocessorConfig());
  REQUIRE(p.ok());
  CHECK(p->grid.num_patches() == 16);
  CHECK(p->values.size() == 16u * 1176u);
  // Both temporal copies of a patch hold the same values.
  CHECK(std::memcmp(&p->values[0], &p->values[196], 196 * sizeof(float)) == 0);
}

}  // namespace
}  // namespace mmserve::model
