#include "model/rope.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

namespace mmserve::model {
namespace {

std::vector<float> Ramp(int n, float scale) {
  std::vector<float> v(n);
  for (int i = 0; i < n; ++i) v[i] = std::sin(1.3f * i + 0.2f) * scale;
  return v;
}

std::vector<int64_t> TextPositions(const std::vector<int64_t>& p) {
  std::vector<int64_t> out;
  for (int c = 0; c < 3; ++c) out.insert(out.end(), p.begin(), p.end());
  return out;
}

std::vector<float> Rotate(const MRope& rope, std::vector<float> x, int64_t tokens, int64_t heads,
                          const std::vector<int64_t>& positions) {
  RopeAngles angles;
  rope.ComputeAngles(positions.data(), tokens, &angles);
  rope.Apply(angles, x.data(), tokens, heads);
  return x;
}

TEST_CASE("position 0 leaves vectors unchanged", "[rope]") {
  MRope rope(16, 10000.0, {2, 3, 3});
  std::vector<float> x = Ramp(2 * 16, 1.0f);
  CHECK(Rotate(rope, x, 1, 2, {0, 0, 0}) == x);
}

TEST_CASE("pairs (j, j + d/2) rotate by pos * theta^(-2j/d) in HF's rotate_half convention",
          "[rope]") {
  const int d = 8;
  MRope rope(d, 100.0, {});
  std::vector<float> x = Ramp(d, 1.0f);
  const int64_t pos = 7;
  std::vector<float> y = Rotate(rope, x, 1, 1, TextPositions({pos}));
  for (int j = 0; j < d / 2; ++j) {
    const double angle = pos * std::pow(100.0, -2.0 * j / d);
    const double c = std::cos(angle), s = std::sin(angle);
    CHECK(y[j] == Approx(x[j] * c - x[j + d / 2] * s).margin(1e-5));
    CHECK(y[j + d / 2] == Approx(x[j + d / 2] * c + x[j] * s).margin(1e-5));
  }
}

TEST_CASE("q.k after rotation depends only on the position difference", "[rope]") {
  MRope rope(32, 10000.0, {4, 6, 6});
  std::vector<float> q = Ramp(32, 1.0f), k = Ramp(32, -0.7f);
  auto dot_at = [&](int64_t pq, int64_t pk) {
    std::vector<float> rq = Rotate(rope, q, 1, 1, TextPositions({pq}));
    std::vector<float> rk = Rotate(rope, k, 1, 1, TextPositions({pk}));
    double s = 0;
    for (int i = 0; i < 32; ++i) s += double(rq[i]) * rk[i];
    return s;
  };
  CHECK(dot_at(10, 3) == Approx(dot_at(107, 100)).margin(1e-4));
  CHECK(dot_at(5, 5) == Approx(dot_at(0, 0)).margin(1e-5));
}

TEST_CASE("M-RoPE: each pair takes its angle from its section's position component", "[rope]") {
  // head_dim 8: pair 0 -> temporal, pair 1 -> height, pairs 2-3 -> width.
  MRope rope(8, 10000.0, {1, 1, 2});
  std::vector<float> x = Ramp(8, 1.0f);
  const std::vector<int64_t> pos = {3, 11, 40};  // t, h, w of one token
  std::vector<float> y = Rotate(rope, x, 1, 1, pos);
  const int component[4] = {0, 1, 2, 2};
  for (int j = 0; j < 4; ++j) {
    // Rotating with all components equal to this pair's component must give
    // the same pair.
    const int64_t p = pos[component[j]];
    std::vector<float> z = Rotate(rope, x, 1, 1, {p, p, p});
    CHECK(y[j] == z[j]);
    CHECK(y[j + 4] == z[j + 4]);
  }
  // And the components differ, so the result differs from plain RoPE at t.
  CHECK(y != Rotate(rope, x, 1, 1, {3, 3, 3}));
}

TEST_CASE("every head of a token gets the same rotation; tokens get their own", "[rope]") {
  MRope rope(8, 10000.0, {1, 1, 2});
  std::vector<float> one = Ramp(8, 1.0f);
  std::vector<float> x;
  for (int t = 0; t < 2; ++t) {
    for (int h = 0; h < 3; ++h) x.insert(x.end(), one.begin(), one.end());
  }
  // Positions [3][2]: token 0 at (2, 2, 2), token 1 at (5, 6, 7).
  std::vector<float> y = Rotate(rope, x, 2, 3, {2, 5, 2, 6, 2, 7});
  std::vector<float> t0 = Rotate(rope, one, 1, 1, {2, 2, 2});
  std::vector<float> t1 = Rotate(rope, one, 1, 1, {5, 6, 7});
  for (int h = 0; h < 3; ++h) {
    CHECK(std::vector<float>(y.begin() + h * 8, y.begin() + h * 8 + 8) == t0);
    CHECK(std::vector<float>(y.begin() + 24 + h * 8, y.begin() + 32 + h * 8) == t1);
  }
}

// Which component (0 t, 1 h, 2 w) each rotary pair reads: with positions
// t 0, h 1, w 2 its angle is c(j) x inv_freq[j].
std::vector<int> Components(const MRope& rope, double theta) {
  const int d = rope.head_dim(), half = d / 2;
  const std::vector<int64_t> pos = {0, 1, 2};  // t, h, w of one token
  RopeAngles angles;
  rope.ComputeAngles(pos.data(), 1, &angles);
  std::vector<int> out(half, -1);
  for (int j = 0; j < half; ++j) {
    const double inv_freq = std::pow(theta, -2.0 * j / d);
    double best = 1e9;
    for (int c = 0; c < 3; ++c) {
      const double err = std::abs(std::cos(c * inv_freq) - angles.cos[j]) +
                         std::abs(std::sin(c * inv_freq) - angles.sin[j]);
      if (err < best) best = err, out[j] = c;
    }
  }
  return out;
}

TEST_CASE("interleaved M-RoPE takes h and w pairs in turn with t (transformers' layout)",
          "[rope]") {
  // transformers' Qwen3VLTextRotaryEmbedding.apply_interleaved_mrope on
  // sections {4, 3, 3} of head_dim 20 gives pairs t h w t h w t h w t.
  CHECK(Components(MRope(20, 10000.0, {4, 3, 3}, /*interleaved=*/true), 10000.0) ==
        std::vector<int>{0, 1, 2, 0, 1, 2, 0, 1, 2, 0});
  // The chunked layout of Qwen2-VL keeps its sections in blocks.
  CHECK(Components(MRope(20, 10000.0, {4, 3, 3}), 10000.0) ==
        std::vector<int>{0, 0, 0, 0, 1, 1, 1, 2, 2, 2});
  // Qwen3-VL's {24, 20, 20}: t h w repeated 20 times, then four t pairs.
  std::vector<int> want;
  for (int i = 0; i < 20; ++i) want.insert(want.end(), {0, 1, 2});
  want.insert(want.end(), {0, 0, 0, 0});
  CHECK(Components(MRope(128, 5e6, {24, 20, 20}, /*interleaved=*/true), 5e6) == want);
}

}  // namespace
}  // namespace mmserve::model
