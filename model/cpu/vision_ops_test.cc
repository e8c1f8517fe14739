#include "model/cpu/vision_ops.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "model/cpu/cpu_isa.h"
#include "model/cpu/test_vectors.h"

namespace mmserve::model::cpu {
namespace {

std::vector<float> Random(int64_t n, float scale, uint32_t seed) {
  return testing::NormalVector(n, scale, seed);
}

TEST_CASE("SoftmaxRows is softmax at every level, any width", "[vision_ops]") {
  for (CpuIsa isa : SupportedCpuIsas()) {
    const ScopedCpuIsa level(isa);
    for (int64_t cols : {1, 7, 15, 16, 17, 64, 1027}) {
      INFO(IsaName() << " cols " << cols);
      const int64_t rows = 3;
      const std::vector<float> in = Random(rows * cols, 4.0f, 11 + cols);
      std::vector<float> s = in;
      SoftmaxRows(s.data(), rows, cols);
      for (int64_t r = 0; r < rows; ++r) {
        const float* x = &in[r * cols];
        double mx = x[0], sum = 0;
        for (int64_t c = 0; c < cols; ++c) mx = std::max<double>(mx, x[c]);
        for (int64_t c = 0; c < cols; ++c) sum += std::exp(x[c] - mx);
        double worst = 0;
        for (int64_t c = 0; c < cols; ++c) {
          const double want = std::exp(x[c] - mx) / sum;
          worst = std::max(worst, std::fabs(s[r * cols + c] - want) / want);
        }
        CHECK(worst < 1e-5);  // the scalar row sum rounds ~cols times
      }
    }
  }
}

TEST_CASE("SoftmaxRows gives 0 to scores far below the maximum", "[vision_ops]") {
  for (CpuIsa isa : SupportedCpuIsas()) {
    const ScopedCpuIsa level(isa);
    INFO(IsaName());
    std::vector<float> s = {0.0f, -200.0f, -90.0f, 3.0f, -INFINITY};
    SoftmaxRows(s.data(), 1, static_cast<int64_t>(s.size()));
    CHECK(s[1] == 0.0f);
    CHECK(s[4] == 0.0f);
    CHECK(s[2] < 1e-38f);
    CHECK(std::fabs(s[0] + s[3] - 1.0f) < 1e-6f);
  }
}

TEST_CASE("QuickGeluInPlace is x * sigmoid(1.702 x) at every level", "[vision_ops]") {
  std::vector<float> in = Random(1000, 3.0f, 5);
  for (float x : {0.0f, -0.0f, 1e-30f, -60.0f, 60.0f, -100.0f, 100.0f, -1e30f, 1e30f}) {
    in.push_back(x);
  }
  for (CpuIsa isa : SupportedCpuIsas()) {
    const ScopedCpuIsa level(isa);
    // Odd counts leave a masked tail.
    for (int64_t count : {static_cast<int64_t>(in.size()), int64_t{13}}) {
      INFO(IsaName() << " count " << count);
      std::vector<float> x(in.end() - count, in.end());
      QuickGeluInPlace(x.data(), count);
      double worst = 0;
      for (int64_t i = 0; i < count; ++i) {
        const double v = in[in.size() - count + i];
        const double want = v / (1.0 + std::exp(-1.702 * v));
        worst = std::max(worst, std::fabs(x[i] - want) / std::max(1e-30, std::fabs(want)));
        if (std::fabs(want) < 1e-37) CHECK(std::fabs(x[i]) < 1e-37f);
      }
      CHECK(worst < 2e-6);
    }
  }
}

TEST_CASE("the AVX2 level runs the scalar loops: the same bits as std::exp", "[vision_ops]") {
  const ScopedCpuIsa level(CpuIsa::kAvx2);
  const std::vector<float> in = Random(515, 2.0f, 9);
  std::vector<float> x = in, want = in;
  QuickGeluInPlace(x.data(), static_cast<int64_t>(x.size()));
  for (float& v : want) v = v / (1.0f + std::exp(-1.702f * v));
  CHECK(std::memcmp(x.data(), want.data(), x.size() * sizeof(float)) == 0);
}

// torch.nn.LayerNorm in double: the mean, the biased variance, then
// (x - mean) / sqrt(var + eps) * w + b.
std::vector<double> LayerNormReference(const float* x, int64_t dim, const float* w, const float* b,
                                       float eps) {
  double mean = 0, var = 0;
  for (int64_t i = 0; i < dim; ++i) mean += x[i];
  mean /= dim;
  for (int64_t i = 0; i < dim; ++i) var += (x[i] - mean) * (x[i] - mean);
  var /= dim;
  std::vector<double> y(dim);
  for (int64_t i = 0; i < dim; ++i) y[i] = (x[i] - mean) / std::sqrt(var + eps) * w[i] + b[i];
  return y;
}

TEST_CASE("LayerNormRows is LayerNorm with the same bits at every level, any width",
          "[vision_ops]") {
  for (int64_t dim : {1, 7, 8, 9, 15, 16, 17, 31, 33, 63, 64, 65, 100, 127, 130, 1280, 1283}) {
    const int64_t rows = 3;
    // An offset mean, as residual streams have: the centred sums matter.
    std::vector<float> x = Random(rows * dim, 2.0f, 21 + dim);
    for (float& v : x) v += 3.0f;
    const std::vector<float> w = Random(dim, 1.0f, 22 + dim), b = Random(dim, 0.5f, 23 + dim);
    std::vector<float> first;
    for (CpuIsa isa : SupportedCpuIsas()) {
      const ScopedCpuIsa level(isa);
      INFO(IsaName() << " dim " << dim);
      std::vector<float> y(x.size());
      LayerNormRows(x.data(), rows, dim, w.data(), b.data(), 1e-6f, y.data());
      double worst = 0;
      for (int64_t r = 0; r < rows; ++r) {
        const std::vector<double> want =
            LayerNormReference(&x[r * dim], dim, w.data(), b.data(), 1e-6f);
        for (int64_t i = 0; i < dim; ++i) {
          worst = std::max(worst, std::fabs(y[r * dim + i] - want[i]));
        }
      }
      CHECK(worst < 2e-5);  // outputs of magnitude ~1-5
      if (first.empty()) {
        first = y;
      } else {
        CHECK(std::memcmp(y.data(), first.data(), y.size() * sizeof(float)) == 0);
      }
    }
  }
}

TEST_CASE("LayerNormRows writes in place and only its rows", "[vision_ops]") {
  const int64_t dim = 21, rows = 2;  // masked tails at both levels
  const std::vector<float> x = Random(rows * dim + 5, 1.0f, 31);
  const std::vector<float> w = Random(dim, 1.0f, 32), b = Random(dim, 1.0f, 33);
  for (CpuIsa isa : SupportedCpuIsas()) {
    const ScopedCpuIsa level(isa);
    INFO(IsaName());
    std::vector<float> apart(x.size(), 7.0f), inplace = x;
    LayerNormRows(x.data(), rows, dim, w.data(), b.data(), 1e-6f, apart.data());
    LayerNormRows(inplace.data(), rows, dim, w.data(), b.data(), 1e-6f, inplace.data());
    CHECK(std::memcmp(apart.data(), inplace.data(), rows * dim * sizeof(float)) == 0);
    for (size_t i = rows * dim; i < x.size(); ++i) {
      CHECK(apart[i] == 7.0f);
      CHECK(inplace[i] == x[i]);
    }
  }
}

TEST_CASE("LayerNormRows maps a constant row to the bias", "[vision_ops]") {
  const int64_t dim = 40;
  const std::vector<float> x(dim, 2.5f), w(dim, 3.0f), b = Random(dim, 1.0f, 41);
  for (CpuIsa isa : SupportedCpuIsas()) {
    const ScopedCpuIsa level(isa);
    INFO(IsaName());
    std::vector<float> y(dim);
    LayerNormRows(x.data(), 1, dim, w.data(), b.data(), 1e-6f, y.data());
    CHECK(std::memcmp(y.data(), b.data(), dim * sizeof(float)) == 0);
  }
}

}  // namespace
}  // namespace mmserve::model::cpu
