#include "model/cpu/ops.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <vector>

#include "model/cpu/cpu_isa.h"
#include "model/cpu/test_vectors.h"

namespace mmserve::model::cpu {
namespace {

TEST_CASE("RMSNorm scales each row to unit root-mean-square times the weight", "[ops]") {
  ThreadPool pool(2);
  const int64_t rows = 5, n = 37;
  std::vector<float> x(rows * n), w(n), y(rows * n);
  for (int64_t i = 0; i < rows * n; ++i) x[i] = std::sin(0.37f * i) * (1 + i % 5);
  for (int64_t j = 0; j < n; ++j) w[j] = 0.5f + 0.01f * j;
  RmsNorm(pool, x.data(), rows, n, w.data(), 1e-6f, y.data());
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t j = 0; j < n; ++j) ss += double(x[r * n + j]) * x[r * n + j];
    const double inv = 1.0 / std::sqrt(ss / n + 1e-6);
    for (int64_t j = 0; j < n; ++j) {
      REQUIRE(y[r * n + j] == Approx(w[j] * x[r * n + j] * inv).epsilon(1e-5));
    }
  }
  // In place gives the same bits.
  RmsNorm(pool, x.data(), rows, n, w.data(), 1e-6f, x.data());
  CHECK(x == y);
}

TEST_CASE("RMSNorm's eps keeps an all-zero row finite", "[ops]") {
  ThreadPool pool(1);
  std::vector<float> x(8, 0.0f), w(8, 1.0f), y(8, 1.0f);
  RmsNorm(pool, x.data(), 1, 8, w.data(), 1e-6f, y.data());
  for (float v : y) CHECK(v == 0.0f);
}

TEST_CASE("SiluMul is silu(gate) * up", "[ops]") {
  ThreadPool pool(2);
  std::vector<float> g = {-20.0f, -1.0f, 0.0f, 0.5f, 3.0f, 40.0f}, u = {1, 2, 3, 4, 5, 6}, out(6);
  SiluMul(pool, g.data(), u.data(), 6, out.data());
  for (int i = 0; i < 6; ++i) {
    double want = g[i] / (1.0 + std::exp(-double(g[i]))) * u[i];
    CHECK(out[i] == Approx(want).epsilon(1e-6).margin(1e-12));
  }
}

TEST_CASE("SiluMul over a wide range, at any offset and count, is silu(gate) * up", "[ops]") {
  ThreadPool pool(2);
  // 40003 elements: several 16384-element chunks and a tail of 3 past the
  // last group of 8; gates from -100 to 100 (e^-gate overflows and
  // underflows at the ends), plus the infinities.
  const int64_t n = 40003;
  std::vector<float> g(n), u(n), out(n);
  for (int64_t i = 0; i < n; ++i) {
    g[i] = -100.0f + 200.0f * static_cast<float>(i) / (n - 1);
    u[i] = 0.5f + static_cast<float>(i % 7);
  }
  g[17] = INFINITY;
  g[18] = -INFINITY;
  SiluMul(pool, g.data(), u.data(), n, out.data());
  for (int64_t i = 0; i < n; ++i) {
    if (i == 17 || i == 18) continue;
    const double want = g[i] / (1.0 + std::exp(-double(g[i]))) * u[i];
    INFO("gate " << g[i]);
    REQUIRE(out[i] == Approx(want).epsilon(1e-6).margin(1e-30));
  }
  CHECK(out[17] == INFINITY);
  CHECK(std::isnan(out[18]));  // -inf / inf, as the scalar formula
  // An element's result does not depend on the elements around it: each
  // one alone (a tail of 1) gives the same bits as inside the long call.
  for (int64_t i : {0, 5, 7, 8, 16383, 16384, 40000, 40002}) {
    float one = 0;
    SiluMul(pool, &g[i], &u[i], 1, &one);
    CHECK(std::memcmp(&one, &out[i], sizeof(float)) == 0);
  }
}

using testing::NormalVector;

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST_CASE("RMSNorm gives the kAvx2 bits at every level, any width", "[ops]") {
  ThreadPool pool(2);
  for (int64_t n : {1, 7, 8, 15, 16, 17, 37, 896, 1027, 1536}) {
    const int64_t rows = 19;
    const std::vector<float> x = NormalVector(rows * n, 3.0f, 3 + n),
                             w = NormalVector(n, 1.0f, 5 + n);
    std::vector<float> want(rows * n);
    {
      const ScopedCpuIsa level(CpuIsa::kAvx2);
      RmsNorm(pool, x.data(), rows, n, w.data(), 1e-6f, want.data());
    }
    for (CpuIsa isa : SupportedCpuIsas()) {
      const ScopedCpuIsa level(isa);
      INFO(IsaName() << " n " << n);
      std::vector<float> y(rows * n);
      RmsNorm(pool, x.data(), rows, n, w.data(), 1e-6f, y.data());
      CHECK(SameBits(y, want));
      std::vector<float> in_place = x;  // out aliasing x
      RmsNorm(pool, in_place.data(), rows, n, w.data(), 1e-6f, in_place.data());
      CHECK(SameBits(in_place, want));
    }
  }
}

TEST_CASE("SiluMul gives the kAvx2 bits at every level, any count", "[ops]") {
  ThreadPool pool(2);
  std::vector<float> g = NormalVector(40037, 8.0f, 7), u = NormalVector(40037, 2.0f, 8);
  const float special[] = {0.0f,    -0.0f, 87.0f,  -87.0f,   88.5f,     -88.5f, 100.0f,
                           -100.0f, 1e30f, -1e30f, INFINITY, -INFINITY, 1e-30f};
  std::copy(std::begin(special), std::end(special), g.begin() + 100);
  for (int64_t count : {1, 7, 8, 15, 16, 17, 16384 + 5, 40037}) {
    std::vector<float> want(count);
    {
      const ScopedCpuIsa level(CpuIsa::kAvx2);
      SiluMul(pool, g.data(), u.data(), count, want.data());
    }
    for (CpuIsa isa : SupportedCpuIsas()) {
      const ScopedCpuIsa level(isa);
      INFO(IsaName() << " count " << count);
      std::vector<float> out(count);
      SiluMul(pool, g.data(), u.data(), count, out.data());
      CHECK(SameBits(out, want));
    }
  }
}

TEST_CASE("AddInPlace adds element-wise across chunk boundaries", "[ops]") {
  ThreadPool pool(2);
  const int64_t n = 40000;
  std::vector<float> x(n, 1.0f), y(n);
  for (int64_t i = 0; i < n; ++i) y[i] = static_cast<float>(i);
  AddInPlace(pool, x.data(), y.data(), n);
  for (int64_t i = 0; i < n; ++i) REQUIRE(x[i] == 1.0f + i);
}

}  // namespace
}  // namespace mmserve::model::cpu
