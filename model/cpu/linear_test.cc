#include "model/cpu/linear.h"

#include <algorithm>
#include <array>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "model/cpu/cpu_isa.h"
#include "model/cpu/linear_bf16dot.h"
#include "model/cpu/linear_int8.h"
#include "model/dtype.h"

namespace mmserve::model::cpu {
namespace {

// The arithmetic linear.h promises, in scalar code: 8 lane chains of fused
// multiply-adds over k, then ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)), + bias.
float ReferenceDot(const float* x, const float* w, int64_t k, float bias, bool has_bias) {
  float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int64_t i = 0; i < k; ++i) lane[i % 8] = std::fma(x[i], w[i], lane[i % 8]);
  float s0 = lane[0] + lane[4], s1 = lane[1] + lane[5], s2 = lane[2] + lane[6],
        s3 = lane[3] + lane[7];
  float v = (s0 + s2) + (s1 + s3);
  return has_bias ? v + bias : v;
}

// The panel kernel's arithmetic: one fused multiply-add chain over k, + bias.
float ReferenceChain(const float* x, const float* w, int64_t k, float bias, bool has_bias) {
  float acc = 0;
  for (int64_t i = 0; i < k; ++i) acc = std::fma(x[i], w[i], acc);
  return has_bias ? acc + bias : acc;
}

// Outputs y [m][n] whose bits differ from want(i, j).
template <typename Want>
int BitMismatches(const std::vector<float>& y, int64_t m, int64_t n, Want want) {
  int mismatches = 0;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      const float w = want(i, j);
      if (std::memcmp(&w, &y[i * n + j], sizeof(float)) != 0) ++mismatches;
    }
  }
  return mismatches;
}

struct Problem {
  int64_t m, n, k;
  std::vector<float> x, w, bias;
  std::vector<uint16_t> w_bf16;
  std::vector<float> w_bf16_wide;  // the bf16 weights widened back to fp32

  Problem(int64_t m_, int64_t n_, int64_t k_, uint32_t seed) : m(m_), n(n_), k(k_) {
    std::mt19937 gen(seed);
    std::normal_distribution<float> d;
    x.resize(m * k);
    w.resize(n * k);
    bias.resize(n);
    for (float& v : x) v = d(gen);
    for (float& v : w) v = d(gen) * 0.1f;
    for (float& v : bias) v = d(gen);
    for (float v : w) {
      w_bf16.push_back(F32ToBf16(v));
      w_bf16_wide.push_back(Bf16ToF32(w_bf16.back()));
    }
  }
  WeightMatrix F32() const { return {DType::kF32, w.data(), n, k}; }
  WeightMatrix BF16() const { return {DType::kBF16, w_bf16.data(), n, k}; }
};

TEST_CASE("the dot kernel computes exactly the documented fp32 and bf16 sums", "[linear]") {
  ThreadPool pool(2);
  // Shapes exercise every register-tile edge, k tails and several k blocks.
  for (auto [m, n, k] : std::vector<std::array<int64_t, 3>>{
           {1, 1, 1}, {1, 5, 13}, {3, 7, 8}, {5, 50, 37}, {9, 97, 600}, {70, 49, 1030}}) {
    Problem p(m, n, k, static_cast<uint32_t>(m * 1000 + n));
    for (bool bf16 : {false, true}) {
      const std::vector<float>& wref = bf16 ? p.w_bf16_wide : p.w;
      std::vector<float> y(m * n, -1.0f);
      Linear(pool, p.x.data(), m, bf16 ? p.BF16() : p.F32(), p.bias.data(), y.data());
      const int mismatches = BitMismatches(y, m, n, [&](int64_t i, int64_t j) {
        return ReferenceDot(&p.x[i * k], &wref[j * k], k, p.bias[j], true);
      });
      INFO("m=" << m << " n=" << n << " k=" << k << " bf16=" << bf16);
      CHECK(mismatches == 0);
    }
  }
}

TEST_CASE("the panel kernel computes exactly one fma chain per output at every level", "[linear]") {
  ThreadPool pool(2);
  // At each level this CPU runs (the same chain, so the same bits): partial
  // last panels (n % 16), every row-tile height (m up to 13 covers 6 + 6 +
  // 1), tasks and one-row groups of 1-4 panels, several k blocks (k > 256).
  for (CpuIsa isa : SupportedCpuIsas()) {
    ScopedCpuIsa scoped(isa);
    for (auto [m, n, k] : std::vector<std::array<int64_t, 3>>{{1, 1, 1},
                                                              {1, 5, 13},
                                                              {1, 16, 7},
                                                              {1, 100, 300},
                                                              {2, 17, 8},
                                                              {6, 64, 33},
                                                              {7, 80, 600},
                                                              {13, 97, 257},
                                                              {3, 48, 40},
                                                              {19, 33, 300},
                                                              {40, 130, 1030}}) {
      Problem p(m, n, k, static_cast<uint32_t>(m * 1000 + n + 7));
      PanelWeights packed = PanelWeights::Pack(pool, p.BF16());
      REQUIRE(packed.matrix().layout == WeightLayout::kPanels);
      REQUIRE(packed.matrix().stored_rows() == (n + 15) / 16 * 16);
      for (bool has_bias : {false, true}) {
        std::vector<float> y(m * n, -1.0f);
        Linear(pool, p.x.data(), m, packed.matrix(), has_bias ? p.bias.data() : nullptr, y.data());
        const int mismatches = BitMismatches(y, m, n, [&](int64_t i, int64_t j) {
          return ReferenceChain(&p.x[i * k], &p.w_bf16_wide[j * k], k, p.bias[j], has_bias);
        });
        INFO("isa=" << IsaName(isa) << " m=" << m << " n=" << n << " k=" << k
                    << " bias=" << has_bias);
        CHECK(mismatches == 0);
      }
    }
  }
}

// kBf16Dot's arithmetic (linear_bf16dot.h) in scalar code, on row-major
// bf16 weights: x rounded to bf16, pairs along k, the odd product added
// first, subnormals flushed, + bias.
float ReferenceBf16Dot(const float* x, const uint16_t* w, int64_t k, float bias, bool has_bias) {
  auto flush = [](float v) {
    return std::fabs(v) < std::numeric_limits<float>::min() ? std::copysign(0.0f, v) : v;
  };
  auto xb = [&](int64_t i) { return i < k ? flush(Bf16ToF32(F32ToBf16(flush(x[i])))) : 0.0f; };
  auto wb = [&](int64_t i) { return i < k ? flush(Bf16ToF32(w[i])) : 0.0f; };
  float acc = 0;
  for (int64_t j = 0; 2 * j < k; ++j) {
    acc = flush(std::fma(xb(2 * j + 1), wb(2 * j + 1), acc));
    acc = flush(std::fma(xb(2 * j), wb(2 * j), acc));
  }
  return has_bias ? acc + bias : acc;
}

TEST_CASE("the bf16-activation kernel computes exactly its documented chain at every level",
          "[linear][bf16dot]") {
  ThreadPool pool(2);
  for (CpuIsa isa : SupportedCpuIsas()) {
    ScopedCpuIsa scoped(isa);
    // Odd k (an unpaired last step), partial panels, every tile height,
    // tasks of 1-4 panels, several k blocks (k > 256).
    for (auto [m, n, k] : std::vector<std::array<int64_t, 3>>{
             {1, 1, 1}, {1, 5, 13}, {1, 100, 300}, {2, 17, 8}, {7, 80, 601}, {13, 97, 257}}) {
      Problem p(m, n, k, static_cast<uint32_t>(m * 1000 + n + 11));
      PanelWeights packed = PanelWeights::Pack(pool, p.BF16());
      for (bool has_bias : {false, true}) {
        std::vector<float> y(m * n, -1.0f);
        Linear(pool, p.x.data(), m, packed.matrix(), has_bias ? p.bias.data() : nullptr, y.data(),
               LinearKernel::kBf16Dot);
        const int mismatches = BitMismatches(y, m, n, [&](int64_t i, int64_t j) {
          return ReferenceBf16Dot(&p.x[i * k], &p.w_bf16[j * k], k, p.bias[j], has_bias);
        });
        INFO("isa=" << IsaName(isa) << " vdpbf16ps=" << internal::Bf16DotUsesAvx512() << " m=" << m
                    << " n=" << n << " k=" << k << " bias=" << has_bias);
        CHECK(mismatches == 0);
      }
    }
  }
  if (!DetectedCpuFeatures().avx512_bf16) WARN("no AVX512-BF16 on this CPU: only scalar code ran");
}

TEST_CASE("a bf16-activation row is bitwise the same in any batch and thread count",
          "[linear][bf16dot]") {
  Problem p(37, 130, 300, 8);
  ThreadPool one(1), two(2);
  PanelWeights packed = PanelWeights::Pack(two, p.BF16());
  std::vector<float> all(37 * 130);
  Linear(two, p.x.data(), 37, packed.matrix(), nullptr, all.data(), LinearKernel::kBf16Dot);
  for (int64_t row : {0, 5, 36}) {
    std::vector<float> alone(130);
    Linear(one, &p.x[row * 300], 1, packed.matrix(), nullptr, alone.data(), LinearKernel::kBf16Dot);
    CHECK(std::memcmp(alone.data(), &all[row * 130], 130 * sizeof(float)) == 0);
  }
}

TEST_CASE("WeightRowToF32 reads rows of every layout exactly", "[linear]") {
  ThreadPool pool(2);
  Problem p(1, 37, 19, 4);
  std::vector<float> f32_row(19);
  WeightRowToF32(p.F32(), 5, f32_row.data());
  CHECK(f32_row == std::vector<float>(&p.w[5 * 19], &p.w[5 * 19] + 19));
  PanelWeights packed = PanelWeights::Pack(pool, p.BF16());
  std::vector<float> row(19), from_rows(19);
  for (int64_t r = 0; r < 37; ++r) {
    WeightRowToF32(packed.matrix(), r, row.data());
    WeightRowToF32(p.BF16(), r, from_rows.data());
    CHECK(row == std::vector<float>(&p.w_bf16_wide[r * 19], &p.w_bf16_wide[r * 19] + 19));
    CHECK(row == from_rows);
  }
}

TEST_CASE("a row's output is bitwise the same in any batch, thread count and level", "[linear]") {
  Problem p(37, 130, 300, 7);
  ThreadPool one(1), two(2);
  PanelWeights packed = PanelWeights::Pack(two, p.BF16());
  for (int layout = 0; layout < 3; ++layout) {
    std::vector<float> first;  // the batch's result at the first level
    for (CpuIsa isa : SupportedCpuIsas()) {
      ScopedCpuIsa scoped(isa);
      INFO("isa=" << IsaName(isa) << " layout=" << layout);
      WeightMatrix w = layout == 0 ? p.F32() : layout == 1 ? p.BF16() : packed.matrix();
      std::vector<float> all(37 * 130);
      Linear(two, p.x.data(), 37, w, nullptr, all.data());
      for (int64_t row : {0, 5, 36}) {
        std::vector<float> alone(130);
        Linear(one, &p.x[row * 300], 1, w, nullptr, alone.data());
        CHECK(std::memcmp(alone.data(), &all[row * 130], 130 * sizeof(float)) == 0);
      }
      if (first.empty()) first = all;
      CHECK(std::memcmp(first.data(), all.data(), all.size() * sizeof(float)) == 0);
    }
  }
}

// The int8 scheme of linear.h in scalar code: q and s of row-major w, per
// row (group 0) or per group of columns.
struct Int8Reference {
  std::vector<float> q;  // [n][k], integers
  std::vector<float> s;  // [n][groups]
  int64_t k, group, groups;

  Int8Reference(const std::vector<float>& w, int64_t n, int64_t k_, int64_t group_)
      : k(k_), group(group_ == 0 || group_ >= k_ ? k_ : group_) {
    groups = (k + group - 1) / group;
    q.resize(n * k);
    s.resize(n * groups);
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t g = 0; g < groups; ++g) {
        float amax = 0;
        for (int64_t c = g * group; c < std::min(k, (g + 1) * group); ++c) {
          amax = std::max(amax, std::fabs(w[r * k + c]));
        }
        const float sc = amax / 127.0f;
        s[r * groups + g] = sc;
        for (int64_t c = g * group; c < std::min(k, (g + 1) * group); ++c) {
          q[r * k + c] =
              sc > 0 ? std::min(127.0f, std::max(-127.0f, std::nearbyint(w[r * k + c] / sc))) : 0;
        }
      }
    }
  }
  float Scale(int64_t r, int64_t c) const { return s[r * groups + c / group]; }
  float Dequantized(int64_t r, int64_t c) const { return q[r * k + c] * Scale(r, c); }
};

TEST_CASE("int8 quantization rounds each weight to its nearest step of max|w| / 127",
          "[linear][int8]") {
  ThreadPool pool(2);
  Problem p(1, 37, 70, 11);
  p.w[3 * 70 + 5] = 0;
  for (int64_t c = 0; c < 70; ++c) p.w[9 * 70 + c] = 0;  // an all-zero row: scale 0
  for (int64_t group : {0, 32, 16, 6}) {
    INFO("group=" << group);
    Int8Weights q = Int8Weights::Quantize(pool, p.F32(), group);
    REQUIRE(q.matrix().dtype == DType::kI8);
    REQUIRE(q.matrix().layout == WeightLayout::kPanels);
    const Int8Reference ref(p.w, 37, 70, group);
    const int64_t groups = group == 0 ? 1 : (70 + group - 1) / group;
    CHECK(q.matrix().num_scales() == 48 * groups);
    CHECK(q.matrix().bytes() == static_cast<size_t>(48 * 70 + 48 * groups * 4));
    std::vector<float> row(70);
    int mismatches = 0;
    for (int64_t r = 0; r < 37; ++r) {
      WeightRowToF32(q.matrix(), r, row.data());
      for (int64_t c = 0; c < 70; ++c) {
        if (row[c] != ref.Dequantized(r, c)) ++mismatches;
        CHECK(std::fabs(row[c] - p.w[r * 70 + c]) <= 0.5f * ref.Scale(r, c) * (1 + 1e-5f));
      }
    }
    CHECK(mismatches == 0);
    WeightRowToF32(q.matrix(), 9, row.data());
    CHECK(row == std::vector<float>(70, 0.0f));
  }
  // bf16 sources quantize their widened values.
  Int8Weights from_bf16 = Int8Weights::Quantize(pool, p.BF16(), 32);
  const Int8Reference ref(p.w_bf16_wide, 37, 70, 32);
  std::vector<float> row(70);
  WeightRowToF32(from_bf16.matrix(), 20, row.data());
  for (int64_t c = 0; c < 70; ++c) CHECK(row[c] == ref.Dequantized(20, c));
}

// linear.h's int8 arithmetic in scalar code for one output: x's row
// quantized to int16 (max_q 32767) with one scale, or (kInt8Act: max_q 127)
// to int8 with one scale per block of kInt8ActBlock columns; exact integer
// sums per segment (cut at multiples of 256, of the group and of the
// block), each added to c once in fp32 (times the group scale, the block
// scale or their product), then the remaining scales and the bias as
// separate roundings.
float ReferenceInt8(const float* x, const Int8Reference& ref, int64_t j, float bias, bool has_bias,
                    float max_q = 32767.0f) {
  const int64_t k = ref.k;
  const int64_t block =
      max_q == 127.0f && internal::kInt8ActBlock < k ? internal::kInt8ActBlock : k;
  const bool blocked = block < k;
  std::vector<float> sx((k + block - 1) / block), inv(sx.size());
  for (size_t b = 0; b < sx.size(); ++b) {
    float amax = 0;
    for (int64_t c = b * block; c < std::min<int64_t>(k, (b + 1) * block); ++c) {
      amax = std::max(amax, std::fabs(x[c]));
    }
    sx[b] = amax / max_q;
    inv[b] = amax > 0 ? max_q / amax : 0;
  }
  const bool per_row = ref.group == k;
  float c = 0;
  for (int64_t seg = 0; seg < k;) {
    int64_t end = std::min(k, (seg / 256 + 1) * 256);
    if (!per_row) end = std::min(end, (seg / ref.group + 1) * ref.group);
    end = std::min(end, (seg / block + 1) * block);
    int64_t sum = 0;
    for (int64_t t = seg; t < end; ++t) {
      sum += static_cast<int64_t>(std::nearbyint(x[t] * inv[t / block])) *
             static_cast<int64_t>(ref.q[j * k + t]);
    }
    REQUIRE(std::llabs(sum) < (int64_t{1} << 31));
    const float s = static_cast<float>(sum);
    const float b = sx[seg / block];
    if (per_row) {
      c = blocked ? std::fma(s, b, c) : c + s;
    } else {
      const float g = ref.s[j * ref.groups + seg / ref.group];
      c = std::fma(s, blocked ? g * b : g, c);
    }
    seg = end;
  }
  if (per_row) c *= ref.s[j];
  if (!blocked) c *= sx[0];
  return has_bias ? c + bias : c;
}

TEST_CASE("the int8 kernels compute exactly their documented integer sums", "[linear][int8]") {
  ThreadPool pool(2);
  // Each level this CPU runs (AVX512-VNNI where present: the same sums, so
  // each must give the documented bits).
  for (CpuIsa isa : SupportedCpuIsas()) {
    ScopedCpuIsa scoped(isa);
    INFO("isa=" << IsaName(isa) << " vnni=" << internal::Int8UsesVnni());
    // Odd k (a padded pair), segments cut by 256 and by groups that do not
    // divide it (48), every row-tile height and one-row panel group.
    for (auto [m, n, k] : std::vector<std::array<int64_t, 3>>{{1, 1, 1},
                                                              {1, 5, 13},
                                                              {1, 100, 300},
                                                              {1, 70, 1031},
                                                              {2, 17, 40},
                                                              {7, 80, 600},
                                                              {13, 97, 257},
                                                              {40, 130, 1030}}) {
      Problem p(m, n, k, static_cast<uint32_t>(m * 1000 + n + 9));
      // Group 6 is no multiple of 4: kInt8Act's vpdpbusd tiles pass it on.
      for (int64_t group : {0, 32, 48, 6}) {
        Int8Weights q = Int8Weights::Quantize(pool, p.F32(), group);
        const Int8Reference ref(p.w, n, k, group);
        for (LinearKernel kernel : {LinearKernel::kDot, LinearKernel::kInt8Act}) {
          const float max_q = kernel == LinearKernel::kInt8Act ? 127.0f : 32767.0f;
          for (bool has_bias : {false, true}) {
            std::vector<float> y(m * n, -1.0f);
            Linear(pool, p.x.data(), m, q.matrix(), has_bias ? p.bias.data() : nullptr, y.data(),
                   kernel);
            const int mismatches = BitMismatches(y, m, n, [&](int64_t i, int64_t j) {
              return ReferenceInt8(&p.x[i * k], ref, j, p.bias[j], has_bias, max_q);
            });
            INFO("m=" << m << " n=" << n << " k=" << k << " group=" << group << " bias=" << has_bias
                      << " int8 activations=" << (max_q == 127.0f));
            CHECK(mismatches == 0);
          }
        }
      }
    }
  }
  if (!DetectedCpuFeatures().avx512_vnni) {
    WARN("no AVX512-VNNI on this CPU: only the AVX2 kernels ran");
  }
}

TEST_CASE("the int8-activation tiles give the documented sums off every tile edge",
          "[linear][int8]") {
  ThreadPool pool(2);
  for (CpuIsa isa : SupportedCpuIsas()) {
    ScopedCpuIsa scoped(isa);
    INFO("isa=" << IsaName(isa) << " vnni=" << internal::Int8UsesVnni());
    // m around the 6-row tiles and their even split (11: 6 + 5; 31: 6, 5, 5,
    // 5, 5, 5; 97), k off multiples of 4 and 64 (a padded pair, half a last
    // 4-column group), n off 16 and 64 (partial panels, groups of 1-3
    // panels), and groups that cut segments short of 256 (20, 64).
    for (auto [m, n, k] : std::vector<std::array<int64_t, 3>>{
             {3, 16, 4}, {6, 33, 6}, {11, 65, 62}, {31, 200, 130}, {64, 48, 515}, {97, 20, 1100}}) {
      Problem p(m, n, k, static_cast<uint32_t>(m * 7919 + n + k));
      for (int64_t group : {0, 20, 64}) {
        Int8Weights q = Int8Weights::Quantize(pool, p.F32(), group);
        const Int8Reference ref(p.w, n, k, group);
        for (bool has_bias : {false, true}) {
          std::vector<float> y(m * n, -1.0f);
          Linear(pool, p.x.data(), m, q.matrix(), has_bias ? p.bias.data() : nullptr, y.data(),
                 LinearKernel::kInt8Act);
          const int mismatches = BitMismatches(y, m, n, [&](int64_t i, int64_t j) {
            return ReferenceInt8(&p.x[i * k], ref, j, p.bias[j], has_bias, /*max_q=*/127.0f);
          });
          INFO("m=" << m << " n=" << n << " k=" << k << " group=" << group << " bias=" << has_bias);
          CHECK(mismatches == 0);
        }
      }
    }
  }
}

TEST_CASE("int8 integer sums cannot overflow at the extremes", "[linear][int8]") {
  // Every weight +-127 and every activation +-32767 with equal signs: each
  // segment's sum is its maximum, 256 * 32767 * 127 < 2^31.
  ThreadPool pool(2);
  const int64_t m = 3, n = 20, k = 2000;
  std::vector<float> x(m * k), w(n * k, 1.0f);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t c = 0; c < k; ++c) x[i * k + c] = i == 1 ? -2.5f : 2.5f;
  }
  for (int64_t c = 0; c < k; c += 3) w[5 * k + c] = -1.0f;  // a mixed-sign row
  for (int64_t group : {0, 32}) {
    Int8Weights q = Int8Weights::Quantize(pool, {DType::kF32, w.data(), n, k}, group);
    // kInt8Act: activations +-127 (x + 128 at 255 and 1 on vpdpbusd).
    for (LinearKernel kernel : {LinearKernel::kDot, LinearKernel::kInt8Act}) {
      std::vector<float> y(m * n);
      Linear(pool, x.data(), m, q.matrix(), nullptr, y.data(), kernel);
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < n; ++j) {
          double want = 0;
          for (int64_t c = 0; c < k; ++c) want += static_cast<double>(x[i * k + c]) * w[j * k + c];
          INFO("group=" << group << " i=" << i << " j=" << j
                        << " int8 activations=" << (kernel == LinearKernel::kInt8Act));
          CHECK(std::fabs(y[i * n + j] - want) <= 1e-5 * std::fabs(want) + 1e-3);
        }
      }
    }
  }
}

TEST_CASE("int8 rows holding zeros, infinities or NaN", "[linear][int8]") {
  ThreadPool pool(2);
  Problem p(3, 20, 64, 5);
  for (int64_t c = 0; c < 64; ++c) p.x[c] = 0;             // row 0: all zero
  p.x[64 + 7] = std::numeric_limits<float>::infinity();    // row 1
  p.x[128 + 9] = std::numeric_limits<float>::quiet_NaN();  // row 2
  Int8Weights q = Int8Weights::Quantize(pool, p.F32(), 0);
  // kInt8Act: the bad value's block gets a NaN scale, and its sum poisons
  // the whole output.
  for (LinearKernel kernel : {LinearKernel::kDot, LinearKernel::kInt8Act}) {
    std::vector<float> y(3 * 20);
    Linear(pool, p.x.data(), 3, q.matrix(), p.bias.data(), y.data(), kernel);
    for (int64_t j = 0; j < 20; ++j) {
      INFO("int8 activations=" << (kernel == LinearKernel::kInt8Act) << " j=" << j);
      CHECK(y[j] == p.bias[j]);  // zero times anything, plus the bias
      CHECK(std::isnan(y[20 + j]));
      CHECK(std::isnan(y[40 + j]));
    }
  }
}

TEST_CASE("an int8 row's output is bitwise the same in any batch and thread count",
          "[linear][int8]") {
  Problem p(37, 130, 300, 8);
  ThreadPool one(1), two(2);
  for (int64_t group : {0, 32}) {
    Int8Weights q = Int8Weights::Quantize(two, p.F32(), group);
    for (LinearKernel kernel : {LinearKernel::kDot, LinearKernel::kInt8Act}) {
      std::vector<float> all(37 * 130);
      Linear(two, p.x.data(), 37, q.matrix(), p.bias.data(), all.data(), kernel);
      for (int64_t row : {0, 5, 36}) {
        std::vector<float> alone(130);
        Linear(one, &p.x[row * 300], 1, q.matrix(), p.bias.data(), alone.data(), kernel);
        INFO("group=" << group << " row=" << row
                      << " int8 activations=" << (kernel == LinearKernel::kInt8Act));
        CHECK(std::memcmp(alone.data(), &all[row * 130], 130 * sizeof(float)) == 0);
      }
    }
  }
}

TEST_CASE("the OpenBLAS kernel agrees with the dot kernel to rounding", "[linear]") {
  ThreadPool pool(2);
  Problem p(33, 300, 257, 3);
  PanelWeights packed = PanelWeights::Pack(pool, p.BF16());
  for (int layout = 0; layout < 3; ++layout) {
    WeightMatrix w = layout == 0 ? p.F32() : layout == 1 ? p.BF16() : packed.matrix();
    std::vector<float> a(33 * 300), b(33 * 300);
    Linear(pool, p.x.data(), 33, w, p.bias.data(), a.data(), LinearKernel::kDot);
    Linear(pool, p.x.data(), 33, w, p.bias.data(), b.data(), LinearKernel::kOpenBlas);
    float worst = 0;
    for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::fabs(a[i] - b[i]));
    INFO("layout=" << layout);
    CHECK(worst < 1e-4f);  // |y| ~ 1.6: a few fp32 ulps of the 257-term sums
  }
}

TEST_CASE("LinearMany gives each job exactly Linear's result", "[linear]") {
  ThreadPool pool(2);
  Problem a(5, 100, 64, 1), b(5, 7, 64, 2), c(5, 90, 64, 3);
  PanelWeights packed = PanelWeights::Pack(pool, c.BF16());
  for (LinearKernel kernel : {LinearKernel::kDot, LinearKernel::kOpenBlas}) {
    WeightMatrix wa = a.F32(), wb = b.BF16(), wc = packed.matrix();
    std::vector<float> ya(5 * 100), yb(5 * 7), yc(5 * 90), ra(5 * 100), rb(5 * 7), rc(5 * 90);
    LinearMany(pool, a.x.data(), 5,
               {{&wa, a.bias.data(), ya.data()},
                {&wb, nullptr, yb.data()},
                {&wc, c.bias.data(), yc.data()}},
               kernel);
    Linear(pool, a.x.data(), 5, wa, a.bias.data(), ra.data(), kernel);
    Linear(pool, a.x.data(), 5, wb, nullptr, rb.data(), kernel);
    Linear(pool, a.x.data(), 5, wc, c.bias.data(), rc.data(), kernel);
    CHECK(ya == ra);
    CHECK(yb == rb);
    CHECK(yc == rc);
  }
}

TEST_CASE("bias is optional", "[linear]") {
  ThreadPool pool(2);
  Problem p(2, 3, 16, 9);
  std::vector<float> with(6), without(6);
  Linear(pool, p.x.data(), 2, p.F32(), p.bias.data(), with.data());
  Linear(pool, p.x.data(), 2, p.F32(), nullptr, without.data());
  for (int i = 0; i < 6; ++i) CHECK(with[i] == without[i] + p.bias[i % 3]);
}

}  // namespace
}  // namespace mmserve::model::cpu
