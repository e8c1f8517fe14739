#include "model/cpu/linear_int4.h"

#include <algorithm>
#include <array>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "model/cpu/cpu_isa.h"
#include "model/cpu/linear.h"
#include "model/dtype.h"

namespace mmserve::model::cpu {
namespace {

struct Problem {
  int64_t m, n, k;
  std::vector<float> x, w, bias;
  std::vector<uint16_t> w_bf16;

  Problem(int64_t m_, int64_t n_, int64_t k_, uint32_t seed) : m(m_), n(n_), k(k_) {
    std::mt19937 gen(seed);
    std::normal_distribution<float> d;
    x.resize(m * k);
    w.resize(n * k);
    bias.resize(n);
    for (float& v : x) v = d(gen);
    for (float& v : w) v = d(gen) * 0.05f;
    for (float& v : bias) v = d(gen);
    for (float v : w) w_bf16.push_back(F32ToBf16(v));
  }
  WeightMatrix F32() const { return {DType::kF32, w.data(), n, k}; }
  WeightMatrix BF16() const { return {DType::kBF16, w_bf16.data(), n, k}; }
};

// linear_int4.h's quantization rule in scalar code: per row and group, the
// nibbles u, the scale s and the zero point z.
struct Int4Reference {
  int64_t n, k, group, groups;
  std::vector<int> u, z;
  std::vector<float> s;

  Int4Reference(const std::vector<float>& w, int64_t n_, int64_t k_, const Int4Scheme& scheme)
      : n(n_), k(k_), group(scheme.group), groups((k_ + scheme.group - 1) / scheme.group) {
    u.resize(n * k);
    z.resize(n * groups);
    s.resize(n * groups);
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t g = 0; g < groups; ++g) {
        const int64_t b = g * group, e = std::min(k, b + group);
        float amax = 0, lo = 0, hi = 0;
        for (int64_t c = b; c < e; ++c) {
          amax = std::max(amax, std::fabs(w[r * k + c]));
          lo = std::min(lo, w[r * k + c]);
          hi = std::max(hi, w[r * k + c]);
        }
        const float scale = scheme.zero_point ? (hi - lo) / 15.0f : amax / 7.0f;
        int zero = 8;
        if (scheme.zero_point) {
          zero = scale > 0 ? static_cast<int>(std::clamp(std::nearbyint(-lo / scale), 0.0f, 15.0f))
                           : 0;
        }
        s[r * groups + g] = scale;
        z[r * groups + g] = zero;
        for (int64_t c = b; c < e; ++c) {
          int q = zero;
          if (scale > 0) {
            const float v = std::nearbyint(w[r * k + c] / scale);
            q = scheme.zero_point ? static_cast<int>(std::clamp(v + zero, 0.0f, 15.0f))
                                  : static_cast<int>(std::clamp(v, -7.0f, 7.0f)) + 8;
          }
          u[r * k + c] = q;
        }
      }
    }
  }
  float Dequantized(int64_t r, int64_t c) const {
    const int64_t g = r * groups + c / group;
    return static_cast<float>(u[r * k + c] - z[g]) * s[g];
  }
};

// linear_int4.h's arithmetic for one output in scalar code: x's row
// quantized to int8 per block of 32 columns (max|x| / 127), per block the
// exact sum of u * x_q minus z times the sum of x_q, added to c as
// fma(float(S), s_g * s_x, c), then + bias.
float ReferenceInt4(const float* x, const Int4Reference& ref, int64_t j, const float* bias) {
  const int64_t k = ref.k, block = kInt4Block;
  float c = 0;
  for (int64_t b0 = 0; b0 < k; b0 += block) {
    const int64_t b1 = std::min(k, b0 + block);
    float amax = 0;
    for (int64_t t = b0; t < b1; ++t) amax = std::max(amax, std::fabs(x[t]));
    const float sx = amax / 127.0f, inv = amax > 0 ? 127.0f / amax : 0.0f;
    const int64_t g = j * ref.groups + b0 / ref.group;
    int64_t sum = 0, sum_x = 0;
    for (int64_t t = b0; t < b1; ++t) {
      const int64_t q = static_cast<int64_t>(std::nearbyint(x[t] * inv));
      sum += q * ref.u[j * k + t];
      sum_x += q;
    }
    c = std::fma(static_cast<float>(sum - ref.z[g] * sum_x), ref.s[g] * sx, c);
  }
  return bias != nullptr ? c + bias[j] : c;
}

int BitMismatches(const std::vector<float>& y, const Problem& p, const Int4Reference& ref,
                  const float* bias) {
  int mismatches = 0;
  for (int64_t i = 0; i < p.m; ++i) {
    for (int64_t j = 0; j < p.n; ++j) {
      const float want = ReferenceInt4(&p.x[i * p.k], ref, j, bias);
      if (std::memcmp(&want, &y[i * p.n + j], sizeof(float)) != 0) ++mismatches;
    }
  }
  return mismatches;
}

constexpr std::array<Int4Scheme, 4> kSchemes = {
    {{32, false}, {32, true}, {128, false}, {128, true}}};

TEST_CASE("int4 quantization gives each weight its documented nibble, scale and zero point",
          "[linear][int4]") {
  ThreadPool pool(2);
  // 37 rows: a partial last panel; 70 columns: a short last group and block.
  Problem p(1, 37, 70, 11);
  for (int64_t c = 0; c < 70; ++c) p.w[9 * 70 + c] = 0;      // an all-zero row: scale 0
  for (int64_t c = 0; c < 70; ++c) p.w[4 * 70 + c] = 0.01f;  // one sign: z = 0 with zero points
  for (const Int4Scheme& scheme : kSchemes) {
    INFO("group=" << scheme.group << " zero_point=" << scheme.zero_point);
    Int4Weights q = Int4Weights::Quantize(pool, p.F32(), scheme);
    REQUIRE(q.matrix().dtype == DType::kI4);
    REQUIRE(q.matrix().layout == WeightLayout::kPanels);
    const Int4Reference ref(p.w, 37, 70, scheme);
    const int64_t groups = (70 + scheme.group - 1) / scheme.group;
    CHECK(q.matrix().num_scales() == 48 * groups);
    // Nibbles of k padded to 96, fp32 scales, one byte per zero point.
    CHECK(q.matrix().bytes() ==
          static_cast<size_t>(48 * 96 / 2 + 48 * groups * (4 + (scheme.zero_point ? 1 : 0))));
    std::vector<float> row(70);
    int mismatches = 0;
    for (int64_t r = 0; r < 37; ++r) {
      WeightRowToF32(q.matrix(), r, row.data());
      for (int64_t c = 0; c < 70; ++c) {
        if (row[c] != ref.Dequantized(r, c)) ++mismatches;
        // Round to nearest: within half a step (zero points: the clamped
        // ends of the range can lose up to one step).
        const float step = ref.s[r * ref.groups + c / scheme.group];
        CHECK(std::fabs(row[c] - p.w[r * 70 + c]) <=
              (scheme.zero_point ? 1.0f : 0.5f) * step * (1 + 1e-5f));
      }
    }
    CHECK(mismatches == 0);
    WeightRowToF32(q.matrix(), 9, row.data());
    CHECK(row == std::vector<float>(70, 0.0f));
    if (scheme.zero_point) CHECK(ref.z[4 * ref.groups] == 0);
  }
  // bf16 sources quantize their widened values.
  std::vector<float> wide;
  for (uint16_t v : p.w_bf16) wide.push_back(Bf16ToF32(v));
  Int4Weights from_bf16 = Int4Weights::Quantize(pool, p.BF16(), {32, true});
  const Int4Reference ref(wide, 37, 70, {32, true});
  std::vector<float> row(70);
  WeightRowToF32(from_bf16.matrix(), 20, row.data());
  for (int64_t c = 0; c < 70; ++c) CHECK(row[c] == ref.Dequantized(20, c));
}

TEST_CASE("the int4 kernels compute exactly their documented integer sums at every level",
          "[linear][int4]") {
  ThreadPool pool(2);
  // Both levels this CPU runs (AVX2 always; AVX512-VNNI where present): the
  // same exact sums, so each must give the documented bits. Shapes: rows
  // and columns off the 16-row panel, the 32-column block and both groups
  // (k 1, 13, 33, 200, 1031), every row-tile height (m up to 13: 6 + 6 + 1
  // and 2-row AVX2 tiles), one-row panel groups and partial panels.
  for (CpuIsa isa : SupportedCpuIsas()) {
    ScopedCpuIsa scoped(isa);
    INFO("isa=" << IsaName(isa) << " vnni=" << internal::Int4UsesVnni());
    for (auto [m, n, k] : std::vector<std::array<int64_t, 3>>{{1, 1, 1},
                                                              {1, 5, 13},
                                                              {1, 300, 200},
                                                              {1, 70, 1031},
                                                              {2, 17, 33},
                                                              {7, 80, 130},
                                                              {13, 97, 257},
                                                              {40, 33, 700}}) {
      Problem p(m, n, k, static_cast<uint32_t>(m * 1000 + n + k));
      for (const Int4Scheme& scheme : kSchemes) {
        Int4Weights q = Int4Weights::Quantize(pool, p.F32(), scheme);
        const Int4Reference ref(p.w, n, k, scheme);
        for (bool has_bias : {false, true}) {
          // The kernel argument is ignored: int4 layers always take int8 x.
          for (LinearKernel kernel : {LinearKernel::kDot, LinearKernel::kBf16Dot}) {
            std::vector<float> y(m * n, -1.0f);
            const float* bias = has_bias ? p.bias.data() : nullptr;
            Linear(pool, p.x.data(), m, q.matrix(), bias, y.data(), kernel);
            INFO("m=" << m << " n=" << n << " k=" << k << " group=" << scheme.group
                      << " zero_point=" << scheme.zero_point << " bias=" << has_bias);
            CHECK(BitMismatches(y, p, ref, bias) == 0);
          }
        }
      }
    }
  }
  if (!DetectedCpuFeatures().avx512_vnni) {
    WARN("no AVX512-VNNI on this CPU: only the AVX2 int4 kernels ran");
  }
}

TEST_CASE("int4 outputs stay within the weight and activation rounding of the fp32 product",
          "[linear][int4]") {
  ThreadPool pool(2);
  Problem p(5, 64, 896, 3);
  std::vector<float> exact(p.m * p.n);
  Linear(pool, p.x.data(), p.m, p.F32(), nullptr, exact.data());
  for (const Int4Scheme& scheme : kSchemes) {
    Int4Weights q = Int4Weights::Quantize(pool, p.F32(), scheme);
    const Int4Reference ref(p.w, p.n, p.k, scheme);
    std::vector<float> y(p.m * p.n);
    Linear(pool, p.x.data(), p.m, q.matrix(), nullptr, y.data());
    for (int64_t i = 0; i < p.m; ++i) {
      for (int64_t j = 0; j < p.n; ++j) {
        // |sum x w - sum x_q' w_q'| <= sum |x| |w - w_q| + sum |w_q| |x - x_q|:
        // each weight within one step of its group, each x within half a
        // step (max|x| / 127 of its block) of its own.
        double bound = 0;
        for (int64_t t = 0; t < p.k; ++t) {
          const int64_t g = j * ref.groups + t / scheme.group;
          float amax = 0;
          for (int64_t c = t / 32 * 32; c < std::min<int64_t>(p.k, t / 32 * 32 + 32); ++c) {
            amax = std::max(amax, std::fabs(p.x[i * p.k + c]));
          }
          bound += std::fabs(p.x[i * p.k + t]) * ref.s[g] +
                   std::fabs(ref.Dequantized(j, t)) * 0.5 * amax / 127.0;
        }
        INFO("group=" << scheme.group << " zero_point=" << scheme.zero_point);
        REQUIRE(std::fabs(y[i * p.n + j] - exact[i * p.n + j]) <= bound * 1.001 + 1e-5);
      }
    }
  }
}

TEST_CASE("int4 rows holding zeros, infinities or NaN, and a row in any batch", "[linear][int4]") {
  ThreadPool pool(2);
  Problem p(9, 40, 100, 5);
  for (int64_t t = 0; t < 100; ++t) p.x[2 * 100 + t] = 0;  // row 2: zero
  p.x[4 * 100 + 70] = std::numeric_limits<float>::infinity();
  p.x[6 * 100 + 3] = std::numeric_limits<float>::quiet_NaN();
  Int4Weights q = Int4Weights::Quantize(pool, p.F32(), {32, true});
  std::vector<float> y(9 * 40);
  Linear(pool, p.x.data(), 9, q.matrix(), p.bias.data(), y.data());
  for (int64_t j = 0; j < 40; ++j) {
    CHECK(y[2 * 40 + j] == p.bias[j]);
    CHECK(std::isnan(y[4 * 40 + j]));
    CHECK(std::isnan(y[6 * 40 + j]));
    CHECK(std::isfinite(y[5 * 40 + j]));
  }
  // Each row alone (decode) gives its batched bits.
  for (int64_t i : {0, 5, 8}) {
    std::vector<float> one(40);
    Linear(pool, &p.x[i * 100], 1, q.matrix(), p.bias.data(), one.data());
    CHECK(std::memcmp(one.data(), &y[i * 40], 40 * sizeof(float)) == 0);
  }
}

TEST_CASE("LinearMany gives each int4 job exactly Linear's result", "[linear][int4]") {
  ThreadPool pool(2);
  Problem a(3, 50, 96, 1), b(3, 20, 96, 2);
  Int4Weights qa = Int4Weights::Quantize(pool, a.F32(), {32, false});
  Int4Weights qb = Int4Weights::Quantize(pool, b.F32(), {32, true});
  std::vector<float> ya(3 * 50), yb(3 * 20), want_a(3 * 50), want_b(3 * 20);
  LinearMany(pool, a.x.data(), 3,
             {{&qa.matrix(), a.bias.data(), ya.data()}, {&qb.matrix(), nullptr, yb.data()}});
  Linear(pool, a.x.data(), 3, qa.matrix(), a.bias.data(), want_a.data());
  Linear(pool, a.x.data(), 3, qb.matrix(), nullptr, want_b.data());
  CHECK(ya == want_a);
  CHECK(yb == want_b);
}

}  // namespace
}  // namespace mmserve::model::cpu
