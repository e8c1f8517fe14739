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

}  // namespace
}  // namespace mmserve::model::cpu
