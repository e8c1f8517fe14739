#include "model/vision_position_embed.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace mmserve::model {
namespace {

// torch.linspace(0, end, steps) in fp32: the first half counts up from the
// start, the second half down from the end (ATen's linspace kernel).
std::vector<float> Linspace(float end, int steps) {
  std::vector<float> out(steps);
  if (steps == 1) {
    out[0] = 0.0f;
    return out;
  }
  const float step = end / static_cast<float>(steps - 1);
  const int halfway = steps / 2;
  for (int i = 0; i < steps; ++i) {
    out[i] =
        i < halfway ? step * static_cast<float>(i) : end - step * static_cast<float>(steps - i - 1);
  }
  return out;
}

// One axis's interpolation: floor index, ceil index and fraction per patch.
struct Axis {
  std::vector<int> lo, hi;
  std::vector<float> frac;
};

Axis SampleAxis(int side, int patches) {
  Axis a;
  for (float v : Linspace(static_cast<float>(side - 1), patches)) {
    const int lo = static_cast<int>(v);  // .int(): truncation
    a.lo.push_back(lo);
    a.hi.push_back(std::min(lo + 1, side - 1));
    a.frac.push_back(v - static_cast<float>(lo));
  }
  return a;
}

}  // namespace

void AddPositionEmbeddings(const std::vector<float>& table, int dim,
                           absl::Span<const MediaGrid> grids, int merge, float* x) {
  const int side = static_cast<int>(std::lround(std::sqrt(table.size() / dim)));
  std::vector<float> grid_embed;
  for (const MediaGrid& g : grids) {
    const int h = g.grid_h, w = g.grid_w;
    const Axis rows = SampleAxis(side, h), cols = SampleAxis(side, w);
    // [h][w][dim] in row-major patch order: p0 + p1 + p2 + p3 as transformers
    // sums the four weighted lookups.
    grid_embed.assign(static_cast<size_t>(h) * w * dim, 0.0f);
    for (int i = 0; i < h; ++i) {
      const float dh = rows.frac[i];
      for (int j = 0; j < w; ++j) {
        const float dw = cols.frac[j];
        const float weight[4] = {(1 - dh) * (1 - dw), (1 - dh) * dw, dh * (1 - dw), dh * dw};
        const int index[4] = {rows.lo[i] * side + cols.lo[j], rows.lo[i] * side + cols.hi[j],
                              rows.hi[i] * side + cols.lo[j], rows.hi[i] * side + cols.hi[j]};
        float* out = &grid_embed[(static_cast<size_t>(i) * w + j) * dim];
        for (int d = 0; d < dim; ++d) {
          float sum = table[static_cast<size_t>(index[0]) * dim + d] * weight[0];
          for (int k = 1; k < 4; ++k)
            sum += table[static_cast<size_t>(index[k]) * dim + d] * weight[k];
          out[d] = sum;
        }
      }
    }
    // Merge-block order (t, block row, block column, row in block, column
    // in block), repeated for each temporal patch.
    for (int t = 0; t < g.grid_t; ++t) {
      for (int bh = 0; bh < h / merge; ++bh) {
        for (int bw = 0; bw < w / merge; ++bw) {
          for (int mh = 0; mh < merge; ++mh) {
            for (int mw = 0; mw < merge; ++mw) {
              const float* src =
                  &grid_embed[(static_cast<size_t>(bh * merge + mh) * w + bw * merge + mw) * dim];
              for (int d = 0; d < dim; ++d) x[d] += src[d];
              x += dim;
            }
          }
        }
      }
    }
  }
}

}  // namespace mmserve::model
