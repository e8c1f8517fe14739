// The video pipeline against transformers 4.57.6's Qwen2VLVideoProcessor,
// bit for bit (model/testdata/video, tools/gen_video_goldens.py): frame
// lists of several sizes and counts (odd included; resized frames and
// pixel_values_videos hashes, grids), and sample_frames' indices over a grid
// of frame counts, rates and options.
#include <catch2/catch.hpp>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "common/file.h"
#include "common/hash.h"
#include "model/golden_files.h"
#include "model/image_decode.h"
#include "model/video_decode.h"
#include "model/video_preprocess.h"

namespace mmserve::model {
namespace {

constexpr char kDir[] = "model/testdata/video/";

std::string Read(const std::string& path) { return ReadGoldenFile(path); }

nlohmann::json Cases(const std::string& name) { return GoldenCases(std::string(kDir) + name); }

PreprocessorConfig ConfigFor(const nlohmann::json& c) {
  PreprocessorConfig config;
  config.min_pixels = c["min_pixels"].get<int64_t>();
  config.max_pixels = c["max_pixels"].get<int64_t>();
  return config;
}

// Resized frames and pixel values of `frames` against a golden case.
void CheckProcessed(const std::vector<RgbImage>& frames, const PreprocessorConfig& config,
                    const nlohmann::json& c) {
  auto patches = PreprocessVideo(frames, config);
  REQUIRE(patches.ok());
  const auto thw = c["grid_thw"].get<std::vector<int>>();
  CHECK(patches->grid.grid_t == thw[0]);
  CHECK(patches->grid.grid_h == thw[1]);
  CHECK(patches->grid.grid_w == thw[2]);
  const auto shape = c["pixel_values_shape"].get<std::vector<int64_t>>();
  CHECK(patches->grid.num_patches() == shape[0]);
  CHECK(patches->patch_dim == shape[1]);
  const auto resized_hashes = c["resized_xxh64"].get<std::vector<uint64_t>>();
  REQUIRE(resized_hashes.size() == frames.size());
  for (size_t i = 0; i < frames.size(); ++i) {
    INFO("frame " << i);
    const RgbImage r =
        ResizeBicubicTorch(frames[i], patches->grid.resized_width, patches->grid.resized_height);
    CHECK(HashOf(r.pixels) == resized_hashes[i]);
  }
  CHECK(HashOf(patches->values) == c["pixel_values_xxh64"].get<uint64_t>());
}

TEST_CASE("frame lists equal transformers' pixel_values_videos bit for bit") {
  for (const auto& c : Cases("frames.json")) {
    INFO(c["name"].get<std::string>());
    std::vector<RgbImage> frames;
    const auto decoded = c["decoded_xxh64"].get<std::vector<uint64_t>>();
    for (size_t i = 0; i < c["files"].size(); ++i) {
      auto img = DecodeImage(Read(kDir + c["files"][i].get<std::string>()), DecodeLimits());
      REQUIRE(img.ok());
      CHECK(HashOf(img->pixels) == decoded[i]);
      frames.push_back(*std::move(img));
    }
    CheckProcessed(frames, ConfigFor(c), c);
  }
}

TEST_CASE("clips equal transformers' PyAV reader and processor") {
  for (const auto& c : Cases("clips.json")) {
    const std::string clip = c["clip"].get<std::string>();
    INFO(clip << " fps " << c["fps"].dump());
    const std::string bytes = Read(std::string(kDir) + "clips/" + clip);
    auto header = ProbeVideo(bytes, VideoLimits());
    REQUIRE(header.ok());
    CHECK(header->frame_count == c["total_num_frames"].get<int64_t>());
    CHECK(header->fps == c["video_fps"].get<double>());
    CHECK(header->width == c["width"].get<int>());
    CHECK(header->height == c["height"].get<int>());
    VideoSampling s;
    if (!c["fps"].is_null()) s.fps = c["fps"].get<double>();
    auto idx = SampleFrameIndices(header->frame_count, header->fps, s, 2);
    REQUIRE(idx.ok());
    CHECK(*idx == c["indices"].get<std::vector<int64_t>>());
    auto frames = DecodeVideoFrames(bytes, *idx, VideoLimits());
    REQUIRE(frames.ok());
    const auto decoded = c["decoded_xxh64"].get<std::vector<uint64_t>>();
    REQUIRE(frames->size() == decoded.size());
    for (size_t i = 0; i < decoded.size(); ++i) {
      INFO("frame " << i);
      CHECK(HashOf((*frames)[i].pixels) == decoded[i]);
    }
    PreprocessorConfig config;
    config.min_pixels = 3136;
    config.max_pixels = 12544;
    CheckProcessed(*frames, config, c);
  }
}

TEST_CASE("frame sampling equals sample_frames") {
  int errors = 0;
  for (const auto& c : Cases("sampling.json")) {
    VideoSampling s;
    s.fps = c["fps"].get<double>();
    s.min_frames = c["min_frames"].get<int64_t>();
    s.max_frames = c["max_frames"].get<int64_t>();
    auto idx = SampleFrameIndices(c["total"].get<int64_t>(), c["video_fps"].get<double>(), s, 2);
    INFO(c.dump());
    if (c.contains("error")) {
      ++errors;
      CHECK(absl::IsInvalidArgument(idx.status()));
    } else {
      REQUIRE(idx.ok());
      CHECK(*idx == c["indices"].get<std::vector<int64_t>>());
    }
  }
  CHECK(errors > 0);  // the golden grid covers clips shorter than a patch
}

TEST_CASE("no fps keeps every frame") {
  auto idx = SampleFrameIndices(5, 30.0, VideoSampling(), 2);
  REQUIRE(idx.ok());
  CHECK(*idx == std::vector<int64_t>{0, 1, 2, 3, 4});
}

TEST_CASE("hostile frame lists are refused") {
  PreprocessorConfig config;
  CHECK(absl::IsInvalidArgument(PreprocessVideo({}, config).status()));
  RgbImage a, b;
  a.width = 30;
  a.height = 20;
  a.pixels.assign(30 * 20 * 3, 7);
  b.width = 20;
  b.height = 30;
  b.pixels.assign(20 * 30 * 3, 7);
  const auto mixed = PreprocessVideo({a, b}, config);
  CHECK(absl::IsInvalidArgument(mixed.status()));
  CHECK(absl::StrContains(mixed.status().message(), "differ in size"));
  CHECK(absl::IsInvalidArgument(SampleFrameIndices(0, 30.0, VideoSampling(), 2).status()));
}

}  // namespace
}  // namespace mmserve::model
