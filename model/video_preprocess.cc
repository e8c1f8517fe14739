#include "model/video_preprocess.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace mmserve::model {
namespace {

// torch's HelperInterpCubic::aa_filter (a = -0.5), in its arithmetic.
double CubicAaFilter(double x) {
  constexpr double a = -0.5;
  x = std::fabs(x);
  if (x < 1.0) return ((a + 2) * x - (a + 3)) * x * x + 1;
  if (x < 2.0) return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a;
  return 0.0;
}

// Every output coordinate's source window and int16 weights, with the
// shared fixed-point precision.
struct TorchTaps {
  std::vector<int> first;
  std::vector<int> count;
  std::vector<std::vector<int32_t>> weights;
  int precision = 0;
};

// _compute_indices_min_size_weights_aa + _compute_int16_weights_aa.
TorchTaps TorchCoefficients(int in_size, int out_size) {
  const double scale = static_cast<double>(in_size) / out_size;
  const double support = scale >= 1.0 ? 2.0 * scale : 2.0;
  const double invscale = scale >= 1.0 ? 1.0 / scale : 1.0;
  std::vector<std::vector<double>> w(out_size);
  TorchTaps t;
  t.first.resize(out_size);
  t.count.resize(out_size);
  double w_max = 0.0;
  for (int i = 0; i < out_size; ++i) {
    const double center = scale * (i + 0.5);
    const int64_t xmin = std::max<int64_t>(static_cast<int64_t>(center - support + 0.5), 0);
    const int64_t xsize =
        std::min<int64_t>(static_cast<int64_t>(center + support + 0.5), in_size) - xmin;
    double total = 0.0;
    w[i].resize(xsize);
    for (int64_t j = 0; j < xsize; ++j) {
      w[i][j] = CubicAaFilter((j + xmin - center + 0.5) * invscale);
      total += w[i][j];
    }
    if (total != 0.0) {
      for (double& v : w[i]) {
        v /= total;
        w_max = std::max(w_max, v);
      }
    }
    t.first[i] = static_cast<int>(xmin);
    t.count[i] = static_cast<int>(xsize);
  }
  for (t.precision = 0; t.precision < 22; ++t.precision) {
    if (static_cast<int>(0.5 + w_max * (1 << (t.precision + 1))) >= (1 << 15)) break;
  }
  t.weights.resize(out_size);
  for (int i = 0; i < out_size; ++i) {
    for (const double v : w[i]) {
      const double fixed = v * (1 << t.precision);
      t.weights[i].push_back(static_cast<int16_t>(v < 0 ? static_cast<int>(-0.5 + fixed)
                                                        : static_cast<int>(0.5 + fixed)));
    }
  }
  return t;
}

uint8_t ClipShift(int32_t acc, int precision) {
  return static_cast<uint8_t>(std::clamp(acc >> precision, 0, 255));
}

// Resamples along x (stride 3 between pixels) or y (stride width * 3).
RgbImage TorchPass(const RgbImage& in, int out_size, bool horizontal) {
  const TorchTaps t = TorchCoefficients(horizontal ? in.width : in.height, out_size);
  RgbImage out;
  out.width = horizontal ? out_size : in.width;
  out.height = horizontal ? in.height : out_size;
  out.pixels.resize(static_cast<size_t>(out.width) * out.height * 3);
  const int32_t init = 1 << (t.precision - 1);
  const size_t in_row = static_cast<size_t>(in.width) * 3;
  const size_t out_row = static_cast<size_t>(out.width) * 3;
  if (horizontal) {
    for (int y = 0; y < in.height; ++y) {
      const uint8_t* src = &in.pixels[y * in_row];
      uint8_t* dst = &out.pixels[y * out_row];
      for (int x = 0; x < out_size; ++x) {
        int32_t acc[3] = {init, init, init};
        const uint8_t* s = src + static_cast<size_t>(t.first[x]) * 3;
        for (int k = 0; k < t.count[x]; ++k, s += 3) {
          const int32_t wk = t.weights[x][k];
          acc[0] += s[0] * wk;
          acc[1] += s[1] * wk;
          acc[2] += s[2] * wk;
        }
        for (int c = 0; c < 3; ++c) dst[x * 3 + c] = ClipShift(acc[c], t.precision);
      }
    }
    return out;
  }
  std::vector<int32_t> acc(in_row);
  for (int y = 0; y < out_size; ++y) {
    std::fill(acc.begin(), acc.end(), init);
    for (int k = 0; k < t.count[y]; ++k) {
      const uint8_t* src = &in.pixels[(t.first[y] + k) * in_row];
      const int32_t wk = t.weights[y][k];
      for (size_t i = 0; i < in_row; ++i) acc[i] += src[i] * wk;
    }
    uint8_t* dst = &out.pixels[y * out_row];
    for (size_t i = 0; i < in_row; ++i) dst[i] = ClipShift(acc[i], t.precision);
  }
  return out;
}

// One patch's values, (c, tp, p, p), from the temporal_patch frames from
// `first` on (past the last frame, the last one repeats) at pixel (y0, x0).
float* WritePatch(const std::vector<RgbImage>& frames, const float (&lut)[3][256], int first,
                  const PreprocessorConfig& config, int y0, int x0, float* dst) {
  const int P = config.patch_size, T = config.temporal_patch_size;
  const int last = static_cast<int>(frames.size()) - 1;
  for (int c = 0; c < 3; ++c) {
    for (int tp = 0; tp < T; ++tp) {
      const RgbImage& f = frames[std::min(first + tp, last)];
      for (int py = 0; py < P; ++py) {
        const uint8_t* src = &f.pixels[(static_cast<size_t>(y0 + py) * f.width + x0) * 3 + c];
        for (int px = 0; px < P; ++px) *dst++ = lut[c][src[px * 3]];
      }
    }
  }
  return dst;
}

// Patches in (t, h/m, w/m, m, m) order.
void Flatten(const std::vector<RgbImage>& frames, const float (&lut)[3][256],
             const PreprocessorConfig& config, ImagePatches& out) {
  const MediaGrid& g = out.grid;
  const int P = config.patch_size, M = config.merge_size, T = config.temporal_patch_size;
  float* dst = out.values.data();
  for (int gt = 0; gt < g.grid_t; ++gt) {
    for (int bh = 0; bh < g.grid_h / M; ++bh) {
      for (int bw = 0; bw < g.grid_w / M; ++bw) {
        for (int mh = 0; mh < M; ++mh) {
          for (int mw = 0; mw < M; ++mw) {
            dst =
                WritePatch(frames, lut, gt * T, config, (bh * M + mh) * P, (bw * M + mw) * P, dst);
          }
        }
      }
    }
  }
}

// InvalidArgument for no frames or frames of different sizes.
absl::Status CheckFrames(const std::vector<RgbImage>& frames) {
  if (frames.empty()) return absl::InvalidArgumentError("video has no frames");
  for (const RgbImage& f : frames) {
    if (f.width != frames[0].width || f.height != frames[0].height) {
      return absl::InvalidArgumentError(absl::StrCat("video frames differ in size: ", f.width, "x",
                                                     f.height, " after ", frames[0].width, "x",
                                                     frames[0].height));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<int64_t>> SampleFrameIndices(int64_t total_frames, double video_fps,
                                                        const VideoSampling& sampling,
                                                        int temporal_patch_size) {
  if (total_frames <= 0) return absl::InvalidArgumentError("video has no frames");
  std::vector<int64_t> indices;
  if (!sampling.fps.has_value()) {
    for (int64_t i = 0; i < total_frames; ++i) indices.push_back(i);
    return indices;
  }
  if (!(video_fps > 0) || !(*sampling.fps > 0)) {
    return absl::InvalidArgumentError("sampling by fps needs a positive frame rate");
  }
  const int64_t tps = temporal_patch_size;
  const int64_t max_frames = std::min(sampling.max_frames, total_frames) / tps * tps;
  double num = static_cast<double>(total_frames) / video_fps * *sampling.fps;
  num = std::min(std::min(std::max(num, static_cast<double>(sampling.min_frames)),
                          static_cast<double>(max_frames)),
                 static_cast<double>(total_frames));
  const int64_t num_frames = static_cast<int64_t>(std::floor(num / tps)) * tps;
  if (num_frames <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("video of ", total_frames, " frames is shorter than one temporal patch"));
  }
  // torch.arange(0, total, total / num_frames).int(): float32 values (from a
  // double accumulator), size ceil(total / step) in double.
  const double step = static_cast<double>(total_frames) / num_frames;
  const auto size = static_cast<int64_t>(std::ceil(static_cast<double>(total_frames) / step));
  for (int64_t i = 0; i < size; ++i) {
    indices.push_back(static_cast<int64_t>(static_cast<float>(step * static_cast<double>(i))));
  }
  return indices;
}

RgbImage ResizeBicubicTorch(const RgbImage& in, int width, int height) {
  if (width == in.width && height == in.height) return in;
  if (width == in.width) return TorchPass(in, height, /*horizontal=*/false);
  RgbImage h = TorchPass(in, width, /*horizontal=*/true);
  if (height == in.height) return h;
  return TorchPass(h, height, /*horizontal=*/false);
}

absl::StatusOr<MediaGrid> VideoGrid(int64_t num_frames, int64_t width, int64_t height,
                                    const PreprocessorConfig& config) {
  if (num_frames <= 0) return absl::InvalidArgumentError("video has no frames");
  ASSIGN_OR_RETURN(MediaGrid grid, SmartResize(width, height, GridParamsFor(config)));
  const int64_t tps = config.temporal_patch_size;
  grid.grid_t = static_cast<int>((num_frames + tps - 1) / tps);
  grid.kind = MediaKind::kVideo;
  return grid;
}

absl::StatusOr<ImagePatches> PreprocessVideo(const std::vector<RgbImage>& frames,
                                             const PreprocessorConfig& config) {
  RETURN_IF_ERROR(CheckFrames(frames));
  ASSIGN_OR_RETURN(MediaGrid grid, VideoGrid(static_cast<int64_t>(frames.size()), frames[0].width,
                                             frames[0].height, config));
  return PreprocessVideoToGrid(frames, grid, config);
}

absl::StatusOr<ImagePatches> PreprocessVideoToGrid(const std::vector<RgbImage>& frames,
                                                   const MediaGrid& grid,
                                                   const PreprocessorConfig& config) {
  RETURN_IF_ERROR(CheckFrames(frames));
  std::vector<RgbImage> resized;
  resized.reserve(frames.size());
  for (const RgbImage& f : frames) {
    resized.push_back(ResizeBicubicTorch(f, grid.resized_width, grid.resized_height));
  }
  // Fused rescale + normalize: (x - mean * 255) / (std * 255) in float32,
  // the factors float32 products as torch computes them.
  float lut[3][256];
  for (int c = 0; c < 3; ++c) {
    const auto scale = static_cast<float>(1.0 / config.rescale_factor);
    const float mean = config.image_mean[c] * scale, std = config.image_std[c] * scale;
    for (int level = 0; level < 256; ++level)
      lut[c][level] = (static_cast<float>(level) - mean) / std;
  }
  ImagePatches out;
  out.grid = grid;
  out.patch_dim = 3 * config.temporal_patch_size * config.patch_size * config.patch_size;
  out.values.resize(static_cast<size_t>(grid.num_patches()) * out.patch_dim);
  Flatten(resized, lut, config, out);
  return out;
}

}  // namespace mmserve::model
