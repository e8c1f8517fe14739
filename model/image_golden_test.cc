// The image pipeline against Pillow and transformers 4.57.6's slow
// (Pillow) Qwen2-VL processor, byte for byte: decoded pixels, resized pixels
// and pixel_values, on 60+ source sizes, a JPEG set and the PNG conversions
// (model/testdata/pillow, tools/gen_pillow_goldens.py), and on the resized
// images of model/testdata/goldens. Also prints how far transformers' fast
// (torchvision) processor is from the slow one, as the goldens recorded it.
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/file.h"
#include "common/hash.h"
#include "model/golden_files.h"
#include "model/image_decode.h"
#include "model/image_preprocess.h"
#include "model/image_tokens.h"

namespace mmserve::model {
namespace {

constexpr char kPillow[] = "model/testdata/pillow/";

std::string Read(const std::string& path) { return ReadGoldenFile(path); }

nlohmann::json Cases(const std::string& name) { return GoldenCases(std::string(kPillow) + name); }

// tools/gen_pillow_goldens.py's synth(): gradients, hash noise and hard
// edges in uint32 arithmetic.
RgbImage SynthImage(uint32_t w, uint32_t h, uint32_t seed) {
  RgbImage img;
  img.width = static_cast<int>(w);
  img.height = static_cast<int>(h);
  img.pixels.resize(static_cast<size_t>(w) * h * 3);
  const uint32_t wd = w > 1 ? w - 1 : 1, hd = h > 1 ? h - 1 : 1;
  for (uint32_t y = 0; y < h; ++y) {
    for (uint32_t x = 0; x < w; ++x) {
      for (uint32_t c = 0; c < 3; ++c) {
        uint32_t n = (x * 73856093u) ^ (y * 19349663u) ^ ((c + 3 * seed) * 83492791u);
        n = (n ^ (n >> 13)) * 1274126177u;
        n = n ^ (n >> 16);
        const uint32_t grad = (x * 255u / wd * (c + 1) + y * 255u / hd * (3 - c)) / 4;
        const uint32_t edge = ((x / 23 + y / 17 + c) % 3) * 50;
        img.pixels[(static_cast<size_t>(y) * w + x) * 3 + c] =
            static_cast<uint8_t>((grad + edge + (n & 63)) % 256);
      }
    }
  }
  return img;
}

PreprocessorConfig GoldenConfig() {
  PreprocessorConfig cfg;  // min_pixels 56*56, max_pixels 28*28*1280, as the goldens
  return cfg;
}

// Resize and pixel_values of `img` against one golden record.
void CheckProcessed(const RgbImage& img, const nlohmann::json& c) {
  auto patches = PreprocessImage(img, GoldenConfig());
  REQUIRE(patches.ok());
  CHECK(patches->grid.grid_t == c["grid_thw"][0].get<int>());
  CHECK(patches->grid.grid_h == c["grid_thw"][1].get<int>());
  CHECK(patches->grid.grid_w == c["grid_thw"][2].get<int>());
  const int rh = c["resized_hw"][0], rw = c["resized_hw"][1];
  CHECK(HashOf(ResizeBicubic(img, rw, rh).pixels) == c["resized_xxh64"].get<uint64_t>());
  CHECK(patches->values.size() ==
        c["pixel_values_shape"][0].get<size_t>() * c["pixel_values_shape"][1].get<size_t>());
  CHECK(HashOf(patches->values) == c["pixel_values_xxh64"].get<uint64_t>());
}

// Worst fast-vs-slow figures over a golden set, printed for the record.
void ReportFast(const char* set, const nlohmann::json& cases) {
  double max_levels = 0, worst_frac = 0;
  int over_one = 0, measured = 0;
  for (const auto& c : cases) {
    if (!c.contains("fast") || !c["fast"].contains("max_levels")) continue;
    ++measured;
    const double levels = c["fast"]["max_levels"];
    max_levels = std::max(max_levels, levels);
    worst_frac = std::max(worst_frac, c["fast"]["frac_over_half_level"].get<double>());
    over_one += levels > 1.5;
  }
  std::printf(
      "%s: fast (torchvision) processor vs slow (= mmserve) over %d cases: up to %.0f levels; "
      "%d cases over 1 level; up to %.1f%% of values off by more than half a level\n",
      set, measured, max_levels, over_one, 100 * worst_frac);
}

TEST_CASE("60+ source sizes resize and normalize to the slow processor's bytes", "[golden]") {
  const nlohmann::json cases = Cases("sizes.json");
  REQUIRE(cases.size() >= 60);
  for (const auto& c : cases) {
    const uint32_t w = c["width"], h = c["height"];
    INFO(w << "x" << h);
    const RgbImage img = SynthImage(w, h, 0);
    REQUIRE(HashOf(img.pixels) == c["source_xxh64"].get<uint64_t>());
    CheckProcessed(img, c);
  }
  ReportFast("sizes", cases);
}

TEST_CASE("the JPEG set decodes to Pillow's pixels and processes to the slow processor's",
          "[golden]") {
  const nlohmann::json cases = Cases("jpeg.json");
  REQUIRE(cases.size() >= 20);
  for (const auto& c : cases) {
    const std::string file = c["file"];
    INFO(file);
    const std::string bytes = Read(kPillow + file);
    auto header = ReadImageHeader(bytes);
    REQUIRE(header.ok());
    CHECK(header->format == ImageFormat::kJpeg);
    CHECK(header->width == c["width"].get<int>());
    CHECK(header->height == c["height"].get<int>());
    auto img = DecodeImage(bytes, DecodeLimits());
    INFO(img.status().ToString());
    REQUIRE(img.ok());
    CHECK(HashOf(img->pixels) == c["decoded_xxh64"].get<uint64_t>());
    CheckProcessed(*img, c);
  }
  ReportFast("jpeg", cases);
}

TEST_CASE("PNG bit depths and colour types convert as Pillow's convert(\"RGB\")", "[golden]") {
  const nlohmann::json cases = Cases("png.json");
  REQUIRE(cases.size() >= 10);
  for (const auto& c : cases) {
    const std::string file = c["file"];
    INFO(file << " (Pillow mode " << c["pillow_mode"].get<std::string>() << ")");
    auto img = DecodeImage(Read(kPillow + file), DecodeLimits());
    INFO(img.status().ToString());
    REQUIRE(img.ok());
    CHECK(img->width == c["width"].get<int>());
    CHECK(img->height == c["height"].get<int>());
    CHECK(HashOf(img->pixels) == c["decoded_xxh64"].get<uint64_t>());
  }
}

TEST_CASE("the resized images in goldens/ (gray90x70 and the rest) are reproduced exactly",
          "[golden]") {
  const nlohmann::json doc =
      nlohmann::json::parse(Read("model/testdata/goldens/image_processor.json"));
  int compared = 0;
  for (const auto& c : doc["images"]) {
    const std::string name = c["name"];
    INFO(name);
    auto img =
        DecodeImage(Read("model/testdata/goldens/" + c["file"].get<std::string>()), DecodeLimits());
    REQUIRE(img.ok());
    auto want = DecodeImage(Read("model/testdata/goldens/" + c["resized_file"].get<std::string>()),
                            DecodeLimits());
    REQUIRE(want.ok());
    REQUIRE(want->width == c["resized_width"].get<int>());
    REQUIRE(want->height == c["resized_height"].get<int>());
    const RgbImage got = ResizeBicubic(*img, want->width, want->height);
    int worst = 0;
    for (size_t i = 0; i < got.pixels.size(); ++i) {
      worst = std::max(worst, std::abs(int(got.pixels[i]) - int(want->pixels[i])));
    }
    CHECK(worst == 0);
    ++compared;
  }
  CHECK(compared >= 8);
}

TEST_CASE("the pass order follows Pillow's rule", "[golden]") {
  // Both shrink: vertical first only when the height loses more than twice
  // the columns the width loses.
  CHECK(ResizeVerticalFirst(640, 480, 644, 476));  // width grows, height shrinks
  CHECK_FALSE(ResizeVerticalFirst(480, 640, 476, 644));
  CHECK_FALSE(ResizeVerticalFirst(90, 70, 112, 84));  // both grow
  CHECK(ResizeVerticalFirst(90, 70, 84, 56));         // 14 rows > 2 * 6 columns
  // The measured boundary for 120x100 -> w x 30: vertical first from w = 86.
  CHECK(ResizeVerticalFirst(120, 100, 86, 30));        // 70 rows > 2 * 34 columns
  CHECK_FALSE(ResizeVerticalFirst(120, 100, 85, 30));  // 70 rows = 2 * 35 columns
  CHECK_FALSE(ResizeVerticalFirst(100, 60, 100, 30));  // one pass only
}

}  // namespace
}  // namespace mmserve::model
