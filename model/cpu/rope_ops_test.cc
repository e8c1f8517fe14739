#include "model/cpu/rope_ops.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "model/cpu/cpu_isa.h"

namespace mmserve::model::cpu {
namespace {

std::vector<float> Uniform(int64_t n, float lo, float hi, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = d(gen);
  return v;
}

// The formula of rope_ops.h, one rounding per operation (volatile keeps the
// compiler from fusing the product and the add).
void Reference(const RotaryRows& r, float* x) {
  const int half = r.head_dim / 2;
  for (int64_t t = 0; t < r.tokens; ++t) {
    for (int64_t h = 0; h < r.heads; ++h) {
      float* v = x + (t * r.heads + h) * r.head_dim;
      for (int j = 0; j < half; ++j) {
        const float c = r.cos[t * half + j], s = r.sin[t * half + j];
        const float a = v[j], b = v[j + half];
        volatile float ac = a * c, bs = b * s, bc = b * c, as = a * s;
        v[j] = ac - bs;
        v[j + half] = bc + as;
      }
    }
  }
}

TEST_CASE("RotateHalf rounds each product and sum once, at every level, any head width",
          "[rope_ops]") {
  for (int head_dim : {2, 8, 16, 30, 32, 48, 64, 80, 128}) {
    const int64_t tokens = 5, heads = 3, half = head_dim / 2;
    const std::vector<float> angle = Uniform(tokens * half, -50.0f, 50.0f, head_dim);
    std::vector<float> c(angle.size()), s(angle.size());
    for (size_t i = 0; i < angle.size(); ++i) {
      c[i] = std::cos(angle[i]);
      s[i] = std::sin(angle[i]);
    }
    const RotaryRows rows{c.data(), s.data(), tokens, heads, head_dim};
    const std::vector<float> x = Uniform(tokens * heads * head_dim, -4.0f, 4.0f, 7 + head_dim);
    std::vector<float> want = x;
    Reference(rows, want.data());
    for (CpuIsa isa : SupportedCpuIsas()) {
      const ScopedCpuIsa level(isa);
      INFO(IsaName() << " head_dim " << head_dim);
      std::vector<float> got = x;
      RotateHalf(rows, got.data());
      CHECK(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) == 0);
    }
  }
}

TEST_CASE("RotateHalf leaves the other heads' memory alone past the last pair", "[rope_ops]") {
  // One head of 20 (half 10: a masked tail at kAvx512) inside a longer buffer.
  std::vector<float> c(10, 0.0f), s(10, 1.0f), x(32);
  for (int i = 0; i < 32; ++i) x[i] = static_cast<float>(i + 1);
  for (CpuIsa isa : SupportedCpuIsas()) {
    const ScopedCpuIsa level(isa);
    INFO(IsaName());
    std::vector<float> v = x;
    RotateHalf({c.data(), s.data(), 1, 1, 20}, v.data());
    for (int j = 0; j < 10; ++j) {
      CHECK(v[j] == -x[j + 10]);  // a * 0 - b * 1
      CHECK(v[j + 10] == x[j]);   // b * 0 + a * 1
    }
    for (int i = 20; i < 32; ++i) CHECK(v[i] == x[i]);
  }
}

// The vision tower's rotation before it moved here: HF's full-width tables
// (each pair's angle in both halves) and x * cos + rotate_half(x) * sin, each
// product and the sum rounded (volatile: no fused multiply-add).
void FullWidthReference(const float* cos_full, const float* sin_full, int head_dim, float* x) {
  const int half = head_dim / 2;
  std::vector<float> tmp(x, x + head_dim);
  for (int i = 0; i < head_dim; ++i) {
    const float rot = i < half ? -tmp[i + half] : tmp[i - half];
    volatile float xc = tmp[i] * cos_full[i], rs = rot * sin_full[i];
    x[i] = xc + rs;
  }
}

TEST_CASE("RotateHalf on half tables gives the bits of the full-width rotate_half formula",
          "[rope_ops]") {
  // A patch's q and k heads (2 x 4 heads) at its 2-D angles, as the vision
  // tower rotates them in one call.
  for (int head_dim : {16, 20, 40, 64, 80}) {
    const int half = head_dim / 2, vectors = 8;
    const std::vector<float> angle = Uniform(half, -60.0f, 60.0f, 50 + head_dim);
    std::vector<float> c(half), s(half), c_full(head_dim), s_full(head_dim);
    for (int j = 0; j < half; ++j) {
      c[j] = c_full[j] = c_full[j + half] = std::cos(angle[j]);
      s[j] = s_full[j] = s_full[j + half] = std::sin(angle[j]);
    }
    const std::vector<float> x = Uniform(vectors * head_dim, -8.0f, 8.0f, 60 + head_dim);
    std::vector<float> want = x;
    for (int h = 0; h < vectors; ++h) {
      FullWidthReference(c_full.data(), s_full.data(), head_dim, &want[h * head_dim]);
    }
    for (CpuIsa isa : SupportedCpuIsas()) {
      const ScopedCpuIsa level(isa);
      INFO(IsaName() << " head_dim " << head_dim);
      std::vector<float> got = x;
      RotateHalf({c.data(), s.data(), 1, vectors, head_dim}, got.data());
      CHECK(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) == 0);
    }
  }
}

}  // namespace
}  // namespace mmserve::model::cpu
