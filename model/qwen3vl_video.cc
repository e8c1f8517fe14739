#include "model/qwen3vl_video.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "model/video_preprocess.h"

namespace mmserve::model {
namespace {

constexpr char kVideoPad[] = "<|video_pad|>";
constexpr char kBlock[] = "<|vision_start|><|video_pad|><|vision_end|>";
// Qwen3VLProcessor's stand-in while it rewrites the text, so that inserted
// pads are not taken for the next video's placeholder.
constexpr char kPlaceholder[] = "<|placeholder|>";

void ReplaceAll(std::string& s, const std::string& from, const std::string& to) {
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size())) {
    s.replace(at, from.size(), to);
  }
}

}  // namespace

Qwen3VideoConfig Qwen3VideoConfigOf(const PreprocessorConfig& preprocessor) {
  Qwen3VideoConfig c;
  c.base = preprocessor;
  const Qwen3VideoSettings v = preprocessor.qwen3_video.value_or(Qwen3VideoSettings());
  c.base.min_pixels = v.min_pixels;
  c.base.max_pixels = v.max_pixels;
  c.fps = v.fps;
  c.min_frames = v.min_frames;
  c.max_frames = v.max_frames;
  return c;
}

absl::StatusOr<Qwen3VideoConfig> LoadQwen3VideoConfig(const std::string& dir) {
  ASSIGN_OR_RETURN(const ModelConfig config, LoadModelConfig(dir));
  if (!config.preprocessor || !config.preprocessor->qwen3_video) {
    return absl::NotFoundError(dir + " has no Qwen3-VL video_preprocessor_config.json");
  }
  return Qwen3VideoConfigOf(*config.preprocessor);
}

absl::StatusOr<std::vector<int64_t>> Qwen3SampleFrameIndices(int64_t total_frames, double video_fps,
                                                             const Qwen3VideoSampling& sampling,
                                                             const Qwen3VideoConfig& config) {
  if (total_frames <= 0) return absl::InvalidArgumentError("video has no frames");
  if (sampling.fps.has_value() && sampling.num_frames.has_value()) {
    return absl::InvalidArgumentError("give fps or num_frames, not both");
  }
  int64_t n = 0;
  if (sampling.num_frames.has_value()) {
    n = *sampling.num_frames;
  } else {
    const double fps = sampling.fps.value_or(config.fps);
    if (!(video_fps > 0) || !(fps > 0)) {
      return absl::InvalidArgumentError("sampling by fps needs a positive frame rate");
    }
    n = static_cast<int64_t>(static_cast<double>(total_frames) / video_fps * fps);
    n = std::min(std::min(std::max(n, config.min_frames), config.max_frames), total_frames);
  }
  if (n <= 0) return absl::InvalidArgumentError("video sampled to no frames");
  // np.linspace(0, total - 1, n).round(): i * step, the last exactly total - 1.
  std::vector<int64_t> indices(n);
  const double last = static_cast<double>(total_frames - 1);
  const double step = n > 1 ? last / static_cast<double>(n - 1) : 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const double v = i == n - 1 && n > 1 ? last : static_cast<double>(i) * step;
    indices[i] = static_cast<int64_t>(std::nearbyint(v));
  }
  return indices;
}

absl::StatusOr<MediaGrid> Qwen3VideoGrid(int64_t num_frames, int64_t width, int64_t height,
                                         const Qwen3VideoConfig& config) {
  const PreprocessorConfig& p = config.base;
  const int64_t factor = static_cast<int64_t>(p.patch_size) * p.merge_size;
  const int64_t tps = p.temporal_patch_size;
  if (num_frames < tps) {
    return absl::InvalidArgumentError(
        absl::StrCat("video of ", num_frames, " frames is shorter than one temporal patch"));
  }
  if (height < factor || width < factor) {
    return absl::InvalidArgumentError(absl::StrCat("video of ", width, "x", height,
                                                   " is smaller than ", factor, " pixels a side"));
  }
  if (static_cast<double>(std::max(width, height)) / static_cast<double>(std::min(width, height)) >
      200) {
    return absl::InvalidArgumentError("video aspect ratio above 200");
  }
  const auto units = [&](double v) { return static_cast<int64_t>(v) * factor; };
  int64_t h = units(std::nearbyint(static_cast<double>(height) / factor));
  int64_t w = units(std::nearbyint(static_cast<double>(width) / factor));
  const int64_t t =
      static_cast<int64_t>(std::nearbyint(static_cast<double>(num_frames) / tps)) * tps;
  const double all = static_cast<double>(num_frames * height * width);
  if (t * h * w > p.max_pixels) {
    const double beta = std::sqrt(all / static_cast<double>(p.max_pixels));
    h = std::max(factor, units(std::floor(static_cast<double>(height) / beta / factor)));
    w = std::max(factor, units(std::floor(static_cast<double>(width) / beta / factor)));
  } else if (t * h * w < p.min_pixels) {
    const double beta = std::sqrt(static_cast<double>(p.min_pixels) / all);
    h = units(std::ceil(static_cast<double>(height) * beta / factor));
    w = units(std::ceil(static_cast<double>(width) * beta / factor));
  }
  MediaGrid g = MediaGrid::FromThw(
      static_cast<int>((num_frames + tps - 1) / tps), static_cast<int>(h / p.patch_size),
      static_cast<int>(w / p.patch_size), p.merge_size, MediaKind::kVideo);
  g.resized_height = static_cast<int>(h);
  g.resized_width = static_cast<int>(w);
  return g;
}

absl::StatusOr<ImagePatches> Qwen3PreprocessVideo(const std::vector<RgbImage>& frames,
                                                  const Qwen3VideoConfig& config) {
  if (frames.empty()) return absl::InvalidArgumentError("video has no frames");
  ASSIGN_OR_RETURN(const MediaGrid grid, Qwen3VideoGrid(static_cast<int64_t>(frames.size()),
                                                        frames[0].width, frames[0].height, config));
  return PreprocessVideoToGrid(frames, grid, config.base);
}

std::vector<double> Qwen3FrameTimestamps(absl::Span<const int64_t> indices, double video_fps,
                                         int merge_size) {
  std::vector<int64_t> padded(indices.begin(), indices.end());
  while (!padded.empty() && padded.size() % merge_size != 0) padded.push_back(padded.back());
  std::vector<double> out;
  for (size_t i = 0; i < padded.size(); i += merge_size) {
    const double first = static_cast<double>(padded[i]) / video_fps;
    const double last = static_cast<double>(padded[i + merge_size - 1]) / video_fps;
    out.push_back((first + last) / 2);
  }
  return out;
}

absl::StatusOr<std::string> ExpandQwen3VideoPrompt(const std::string& text,
                                                   absl::Span<const Qwen3VideoPrompt> videos) {
  std::string out = text;
  size_t index = 0;
  for (; out.find(kVideoPad) != std::string::npos; ++index) {
    if (index >= videos.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("prompt has more video placeholders than the ", videos.size(), " videos"));
    }
    std::string placeholder;
    for (const double t : videos[index].timestamps) {
      char stamp[64];
      std::snprintf(stamp, sizeof(stamp), "<%.1f seconds>", t);
      absl::StrAppend(&placeholder, stamp, "<|vision_start|>");
      for (int64_t k = 0; k < videos[index].pads_per_patch; ++k) {
        absl::StrAppend(&placeholder, kPlaceholder);
      }
      absl::StrAppend(&placeholder, "<|vision_end|>");
    }
    const size_t block = out.find(kBlock);
    if (block != std::string::npos) {
      out.replace(block, sizeof(kBlock) - 1, placeholder);
    } else {
      out.replace(out.find(kVideoPad), sizeof(kVideoPad) - 1, placeholder);
    }
  }
  if (index != videos.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("prompt has ", index, " video placeholders for ", videos.size(), " videos"));
  }
  ReplaceAll(out, kPlaceholder, kVideoPad);
  return out;
}

}  // namespace mmserve::model
