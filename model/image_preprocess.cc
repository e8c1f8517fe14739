#include "model/image_preprocess.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "common/status_macros.h"

namespace mmserve::model {
namespace {

constexpr int kPrecisionBits = 32 - 8 - 2;  // PIL's 8-bit resample precision

double BicubicFilter(double x) {  // Keys cubic, a = -0.5
  constexpr double a = -0.5;
  x = std::fabs(x);
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
  if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * a;
  return 0.0;
}

// One output coordinate's source window and fixed-point weights.
struct Taps {
  int first = 0;
  int count = 0;
  std::vector<int32_t> weights;
};

// PIL precompute_coeffs + normalize_coeffs_8bpc for resizing in_size ->
// out_size over the whole source.
std::vector<Taps> Coefficients(int in_size, int out_size) {
  constexpr double kSupport = 2.0;
  const double scale = static_cast<double>(static_cast<float>(in_size)) / out_size;
  const double filter_scale = std::max(scale, 1.0);
  const double support = kSupport * filter_scale;
  std::vector<Taps> taps(out_size);
  std::vector<double> w;
  for (int xx = 0; xx < out_size; ++xx) {
    const double center = (xx + 0.5) * scale;
    int xmin = static_cast<int>(center - support + 0.5);
    int xmax = static_cast<int>(center + support + 0.5);
    xmin = std::max(xmin, 0);
    xmax = std::min(xmax, in_size) - xmin;
    w.assign(xmax, 0.0);
    double total = 0.0;
    for (int x = 0; x < xmax; ++x) {
      w[x] = BicubicFilter((x + xmin - center + 0.5) / filter_scale);
      total += w[x];
    }
    Taps& t = taps[xx];
    t.first = xmin;
    t.count = xmax;
    t.weights.resize(xmax);
    for (int x = 0; x < xmax; ++x) {
      const double k = total != 0.0 ? w[x] / total : w[x];
      const double fixed = k * (1 << kPrecisionBits);
      t.weights[x] = static_cast<int32_t>(k < 0 ? fixed - 0.5 : fixed + 0.5);
    }
  }
  return taps;
}

uint8_t Clip8(int32_t acc) {
  int32_t v = acc >> kPrecisionBits;  // arithmetic shift, as PIL's lookup table
  return static_cast<uint8_t>(std::clamp(v, 0, 255));
}

// Output column x of each row in [row_first, row_first + rows) of `in`.
// Runs on blocks of kBlock rows transposed to column-major (pixel x of the
// block's rows contiguous), so that each output column is the same
// vectorizable multiply-add over rows as the vertical pass. Integer sums do
// not depend on their order: the result is Pillow's exactly.
RgbImage HorizontalPass(const RgbImage& in, const std::vector<Taps>& taps, int row_first,
                        int rows) {
  constexpr int kBlock = 32;
  RgbImage out;
  out.width = static_cast<int>(taps.size());
  out.height = rows;
  out.pixels.resize(static_cast<size_t>(out.width) * rows * 3);
  std::vector<uint8_t> cols(static_cast<size_t>(in.width) * kBlock * 3);
  int32_t acc[kBlock * 3];
  const size_t out_stride = static_cast<size_t>(out.width) * 3;
  for (int y0 = 0; y0 < rows; y0 += kBlock) {
    const int nb = std::min(kBlock, rows - y0), span = nb * 3;
    for (int yy = 0; yy < nb; ++yy) {
      const uint8_t* row = &in.pixels[static_cast<size_t>(y0 + yy + row_first) * in.width * 3];
      uint8_t* dst = &cols[yy * 3];
      for (int x = 0; x < in.width; ++x, dst += span) {
        dst[0] = row[x * 3];
        dst[1] = row[x * 3 + 1];
        dst[2] = row[x * 3 + 2];
      }
    }
    for (int x = 0; x < out.width; ++x) {
      const Taps& t = taps[x];
      for (int i = 0; i < span; ++i) acc[i] = 1 << (kPrecisionBits - 1);
      for (int k = 0; k < t.count; ++k) {
        const uint8_t* col = &cols[static_cast<size_t>(t.first + k) * span];
        const int32_t wk = t.weights[k];
        for (int i = 0; i < span; ++i) acc[i] += col[i] * wk;
      }
      uint8_t* dst = &out.pixels[static_cast<size_t>(y0) * out_stride + x * 3];
      for (int yy = 0; yy < nb; ++yy, dst += out_stride) {
        dst[0] = Clip8(acc[yy * 3]);
        dst[1] = Clip8(acc[yy * 3 + 1]);
        dst[2] = Clip8(acc[yy * 3 + 2]);
      }
    }
  }
  return out;
}

// Output row y from rows taps[y].first - row_offset ... of `in`.
RgbImage VerticalPass(const RgbImage& in, const std::vector<Taps>& taps, int row_offset) {
  RgbImage out;
  out.width = in.width;
  out.height = static_cast<int>(taps.size());
  out.pixels.resize(static_cast<size_t>(out.width) * out.height * 3);
  const size_t stride = static_cast<size_t>(in.width) * 3;
  std::vector<int32_t> acc(stride);
  for (int y = 0; y < out.height; ++y) {
    const Taps& t = taps[y];
    std::fill(acc.begin(), acc.end(), 1 << (kPrecisionBits - 1));
    for (int k = 0; k < t.count; ++k) {
      const uint8_t* src = &in.pixels[(t.first - row_offset + k) * stride];
      const int32_t wk = t.weights[k];
      for (size_t i = 0; i < stride; ++i) acc[i] += src[i] * wk;
    }
    uint8_t* dst = &out.pixels[y * stride];
    for (size_t i = 0; i < stride; ++i) dst[i] = Clip8(acc[i]);
  }
  return out;
}

}  // namespace

bool ResizeVerticalFirst(int in_width, int in_height, int width, int height) {
  return width != in_width && height < in_height && in_height - height > 2 * (in_width - width);
}

RgbImage ResizeBicubic(const RgbImage& in, int width, int height) {
  if (width == in.width && height == in.height) return in;
  const std::vector<Taps> vert = Coefficients(in.height, height);
  if (width == in.width) return VerticalPass(in, vert, 0);
  const std::vector<Taps> horiz = Coefficients(in.width, width);
  if (height == in.height) return HorizontalPass(in, horiz, 0, in.height);
  if (ResizeVerticalFirst(in.width, in.height, width, height)) {
    return HorizontalPass(VerticalPass(in, vert, 0), horiz, 0, height);
  }
  // Horizontal pass over only the rows the vertical pass reads, as PIL does.
  const int row_first = vert.front().first;
  const int row_last = vert.back().first + vert.back().count;
  return VerticalPass(HorizontalPass(in, horiz, row_first, row_last - row_first), vert, row_first);
}

ImageGridParams GridParamsFor(const PreprocessorConfig& config) {
  ImageGridParams params;
  params.patch_size = config.patch_size;
  params.merge_size = config.merge_size;
  params.temporal_patch_size = config.temporal_patch_size;
  params.min_pixels = config.min_pixels;
  params.max_pixels = config.max_pixels;
  return params;
}

absl::StatusOr<ImagePatches> PreprocessImage(const RgbImage& image,
                                             const PreprocessorConfig& config) {
  ASSIGN_OR_RETURN(MediaGrid grid, SmartResize(image.width, image.height, GridParamsFor(config)));
  const RgbImage resized = ResizeBicubic(image, grid.resized_width, grid.resized_height);

  // rescale (float64 multiply, stored as float32) then normalize in float32,
  // as transformers' rescale() and normalize() do. A value depends only on
  // its channel and 8-bit level, so the 3 x 256 results are a table.
  float lut[3][256];
  for (int c = 0; c < 3; ++c) {
    for (int level = 0; level < 256; ++level) {
      const float x = static_cast<float>(level * config.rescale_factor);
      lut[c][level] = (x - config.image_mean[c]) / config.image_std[c];
    }
  }

  // Reference order: (t, h/m, w/m, m, m) patches x (c, tp, p, p) values; a
  // still image repeats its one frame temporal_patch_size times.
  const int w = resized.width;
  const int P = config.patch_size, M = config.merge_size, T = config.temporal_patch_size;
  ImagePatches out;
  out.grid = grid;
  out.patch_dim = 3 * T * P * P;
  out.values.resize(static_cast<size_t>(grid.num_patches()) * out.patch_dim);
  float* dst = out.values.data();
  for (int bh = 0; bh < grid.grid_h / M; ++bh) {
    for (int bw = 0; bw < grid.grid_w / M; ++bw) {
      for (int mh = 0; mh < M; ++mh) {
        for (int mw = 0; mw < M; ++mw) {
          const int y0 = (bh * M + mh) * P, x0 = (bw * M + mw) * P;
          for (int c = 0; c < 3; ++c) {
            float* first = dst;
            for (int py = 0; py < P; ++py) {
              const uint8_t* src = &resized.pixels[(static_cast<size_t>(y0 + py) * w + x0) * 3 + c];
              for (int px = 0; px < P; ++px) *dst++ = lut[c][src[px * 3]];
            }
            for (int t = 1; t < T; ++t) dst = std::copy(first, first + P * P, dst);
          }
        }
      }
    }
  }
  return out;
}

}  // namespace mmserve::model
