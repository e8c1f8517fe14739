#include "model/cpu/linear_int4.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "common/logging.h"
#include "model/cpu/cpu_isa.h"
#include "model/cpu/panel_output.h"
#include "model/cpu/weight_memory.h"

namespace mmserve::model::cpu {
namespace internal {
namespace {

// One octet of columns of a panel: 16 rows x 8 nibbles.
constexpr int64_t kOctetBytes = 64;
constexpr int kOctetsPerBlock = static_cast<int>(kInt4Block / 8);
// The zero point of symmetric groups.
constexpr int kSymmetricZero = 8;
// One row (decode) streams its panels, prefetching this far ahead (as the
// int8 row kernels do).
constexpr int64_t kPrefetchBytes = 4096;
static_assert(kInt4Block % 8 == 0, "blocks are whole octets");

int64_t PaddedCols(int64_t cols) { return (cols + kInt4Block - 1) / kInt4Block * kInt4Block; }
int64_t Groups(const WeightMatrix& w) { return (w.cols + w.group - 1) / w.group; }
int64_t PanelBytes(const WeightMatrix& w) { return PaddedCols(w.cols) * kPanelRows / 2; }

// Panel p of an int4 matrix as a tile reads it.
struct Panel {
  const uint8_t* data = nullptr;   // octet 0
  const float* scales = nullptr;   // [groups][16]
  const uint8_t* zeros = nullptr;  // [groups][16]; nullptr: symmetric
  int64_t group = 0;
};

Panel PanelAt(const WeightMatrix& w, int64_t p) {
  const int64_t per_panel = Groups(w) * kPanelRows;
  return {static_cast<const uint8_t*>(w.data) + p * PanelBytes(w), w.scales + p * per_panel,
          w.zeros != nullptr ? w.zeros + p * per_panel : nullptr, w.group};
}

// Tile signature: rows [i0, i0 + MR) of x against one panel over all
// `blocks` blocks of k; c[i * ldc + 0:16] = the panel's outputs (+ bias16,
// 16 entries, when given).
using TileFn = void (*)(const Int4Rows&, int64_t, const Panel&, int64_t, const float*, float*,
                        int64_t);

inline int32_t Load4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

namespace avx2 {

// 2 rows: 4 fp32 and 4 int32 accumulators, 4 unpacked weight vectors, 2
// broadcasts and 2 constants fill the 16 ymm registers.
constexpr int kTileRows = 2;

template <int MR>
void Tile(const Int4Rows& x, int64_t i0, const Panel& w, int64_t blocks, const float* bias16,
          float* c, int64_t ldc) {
  const __m256i nib = _mm256_set1_epi8(0x0F);
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[MR][2];
  for (int i = 0; i < MR; ++i) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t g = b * kInt4Block / w.group;
    __m256i s[MR][2];
    for (int i = 0; i < MR; ++i) s[i][0] = s[i][1] = _mm256_setzero_si256();
    for (int j = 0; j < kOctetsPerBlock; ++j) {
      const uint8_t* p = w.data + (b * kOctetsPerBlock + j) * kOctetBytes;
      if constexpr (MR == 1)
        _mm_prefetch(reinterpret_cast<const char*>(p) + kPrefetchBytes, _MM_HINT_T0);
      __m256i lo[2], hi[2];
      for (int h = 0; h < 2; ++h) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32 * h));
        lo[h] = _mm256_and_si256(v, nib);
        hi[h] = _mm256_and_si256(_mm256_srli_epi16(v, 4), nib);
      }
      for (int i = 0; i < MR; ++i) {
        const int8_t* xr = x.q + (i0 + i) * x.stride + b * kInt4Block + j * 8;
        const __m256i xl = _mm256_set1_epi32(Load4(xr)), xh = _mm256_set1_epi32(Load4(xr + 4));
        for (int h = 0; h < 2; ++h) {
          // Pairs of nibble x int8 products: |sum| <= 2 * 2 * 15 * 127 fits int16.
          const __m256i pairs =
              _mm256_add_epi16(_mm256_maddubs_epi16(lo[h], xl), _mm256_maddubs_epi16(hi[h], xh));
          s[i][h] = _mm256_add_epi32(s[i][h], _mm256_madd_epi16(pairs, ones));
        }
      }
    }
    for (int i = 0; i < MR; ++i) {
      const int64_t at = (i0 + i) * x.blocks + b;
      const __m256i sum_x = _mm256_set1_epi32(x.sums[at]);
      const __m256 sx = _mm256_set1_ps(x.scale[at]);
      for (int h = 0; h < 2; ++h) {
        // z * sum(x_q): one vpmaddwd (z and |sum| < 2^15 in the low halves).
        const __m256i zx =
            w.zeros != nullptr
                ? _mm256_madd_epi16(
                      _mm256_cvtepu8_epi32(_mm_loadl_epi64(
                          reinterpret_cast<const __m128i*>(w.zeros + g * kPanelRows + 8 * h))),
                      sum_x)
                : _mm256_set1_epi32(kSymmetricZero * x.sums[at]);
        const __m256i exact = _mm256_sub_epi32(s[i][h], zx);
        const __m256 mult = _mm256_mul_ps(_mm256_loadu_ps(w.scales + g * kPanelRows + 8 * h), sx);
        acc[i][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(exact), mult, acc[i][h]);
      }
    }
  }
  for (int i = 0; i < MR; ++i) {
    for (int h = 0; h < 2; ++h) {
      __m256 r = acc[i][h];
      if (bias16 != nullptr) r = _mm256_add_ps(r, _mm256_loadu_ps(bias16 + 8 * h));
      _mm256_storeu_ps(c + i * ldc + 8 * h, r);
    }
  }
}

constexpr TileFn kTiles[kTileRows] = {&Tile<1>, &Tile<2>};

}  // namespace avx2

// The same sums on AVX512-VNNI: one 512-bit load is the panel's 16 rows x 8
// columns, and vpdpbusd multiplies the nibbles (unsigned) by 4 broadcast
// int8 values of x (signed) into each row's int32 lane.
#if defined(__clang__)
#pragma clang attribute push( \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")
// GCC 12 takes the intrinsics' own `_mm512_undefined_*` (x = x) for a read
// of an uninitialized value once they are inlined here.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
namespace vnni {

// 6 rows: 6 fp32 and 12 int32 accumulators (two chains a row), 2 unpacked
// weight vectors and the broadcasts, of 32 zmm registers.
constexpr int kTileRows = 6;

template <int MR>
void Tile(const Int4Rows& x, int64_t i0, const Panel& w, int64_t blocks, const float* bias16,
          float* c, int64_t ldc) {
  const __m512i nib = _mm512_set1_epi8(0x0F);
  __m512 acc[MR];
  for (int i = 0; i < MR; ++i) acc[i] = _mm512_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t g = b * kInt4Block / w.group;
    __m512i s[MR][2];
    for (int i = 0; i < MR; ++i) s[i][0] = s[i][1] = _mm512_setzero_si512();
    for (int j = 0; j < kOctetsPerBlock; ++j) {
      const uint8_t* p = w.data + (b * kOctetsPerBlock + j) * kOctetBytes;
      if constexpr (MR == 1)
        _mm_prefetch(reinterpret_cast<const char*>(p) + kPrefetchBytes, _MM_HINT_T0);
      const __m512i v = _mm512_loadu_si512(p);
      const __m512i lo = _mm512_and_si512(v, nib);
      const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), nib);
      for (int i = 0; i < MR; ++i) {
        const int8_t* xr = x.q + (i0 + i) * x.stride + b * kInt4Block + j * 8;
        s[i][0] = _mm512_dpbusd_epi32(s[i][0], lo, _mm512_set1_epi32(Load4(xr)));
        s[i][1] = _mm512_dpbusd_epi32(s[i][1], hi, _mm512_set1_epi32(Load4(xr + 4)));
      }
    }
    const __m512i z = w.zeros != nullptr
                          ? _mm512_cvtepu8_epi32(_mm_loadu_si128(
                                reinterpret_cast<const __m128i*>(w.zeros + g * kPanelRows)))
                          : _mm512_setzero_si512();
    const __m512 scales = _mm512_loadu_ps(w.scales + g * kPanelRows);
    for (int i = 0; i < MR; ++i) {
      const int64_t at = (i0 + i) * x.blocks + b;
      // z * sum(x_q): one vpmaddwd (z and |sum| < 2^15 in the low halves).
      const __m512i zx = w.zeros != nullptr ? _mm512_madd_epi16(z, _mm512_set1_epi32(x.sums[at]))
                                            : _mm512_set1_epi32(kSymmetricZero * x.sums[at]);
      const __m512i exact = _mm512_sub_epi32(_mm512_add_epi32(s[i][0], s[i][1]), zx);
      const __m512 mult = _mm512_mul_ps(scales, _mm512_set1_ps(x.scale[at]));
      acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(exact), mult, acc[i]);
    }
  }
  for (int i = 0; i < MR; ++i) {
    __m512 r = acc[i];
    if (bias16 != nullptr) r = _mm512_add_ps(r, _mm512_loadu_ps(bias16));
    _mm512_storeu_ps(c + i * ldc, r);
  }
}

constexpr TileFn kTiles[kTileRows] = {&Tile<1>, &Tile<2>, &Tile<3>, &Tile<4>, &Tile<5>, &Tile<6>};

}  // namespace vnni
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC diagnostic pop
#pragma GCC pop_options
#endif

// The nibbles of one group's values v[0:n] and its scale and zero point
// (linear_int4.h's rule).
void QuantizeGroup(const float* v, int64_t n, bool zero_point, uint8_t* u, float* scale,
                   int* zero) {
  if (!zero_point) {
    float amax = 0;
    for (int64_t k = 0; k < n; ++k) amax = std::max(amax, std::fabs(v[k]));
    const float s = amax / 7.0f;
    for (int64_t k = 0; k < n; ++k) {
      const float q = s > 0 ? std::min(7.0f, std::max(-7.0f, std::nearbyint(v[k] / s))) : 0.0f;
      u[k] = static_cast<uint8_t>(static_cast<int>(q) + kSymmetricZero);
    }
    *scale = s;
    *zero = kSymmetricZero;
    return;
  }
  float lo = 0, hi = 0;
  for (int64_t k = 0; k < n; ++k) {
    lo = std::min(lo, v[k]);
    hi = std::max(hi, v[k]);
  }
  const float s = (hi - lo) / 15.0f;
  const float z = s > 0 ? std::min(15.0f, std::max(0.0f, std::nearbyint(-lo / s))) : 0.0f;
  for (int64_t k = 0; k < n; ++k) {
    const float q = s > 0 ? std::min(15.0f, std::max(0.0f, std::nearbyint(v[k] / s) + z)) : z;
    u[k] = static_cast<uint8_t>(q);
  }
  *scale = s;
  *zero = static_cast<int>(z);
}

// The byte of a panel holding row l's column k, and whether in its high
// nibble.
int64_t NibbleByte(int64_t l, int64_t k) { return (k / 8) * kOctetBytes + 4 * l + k % 4; }
bool HighNibble(int64_t k) { return k % 8 >= 4; }

}  // namespace

Int4Rows PrepareInt4Rows(ThreadPool& pool, const QuantizedRows& x, int64_t m, int64_t cols) {
  CHECK(x.u8 != nullptr && (x.block == kInt4Block || x.block == 0))
      << "int4 layers take int8 activations in blocks of " << kInt4Block;
  thread_local std::vector<int8_t> q;
  thread_local std::vector<float> scale;
  thread_local std::vector<int32_t> sums;
  Int4Rows out;
  out.stride = PaddedCols(cols);
  out.blocks = out.stride / kInt4Block;
  q.assign(static_cast<size_t>(m * out.stride), 0);
  scale.resize(static_cast<size_t>(m * out.blocks));
  sums.resize(scale.size());
  // The storage is this thread's (thread_local): workers see it through
  // these pointers.
  int8_t* qp = q.data();
  float* sp = scale.data();
  int32_t* sump = sums.data();
  auto rows = [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      for (int64_t b = 0; b < out.blocks; ++b) {
        const int64_t k0 = b * kInt4Block, k1 = std::min(cols, k0 + kInt4Block);
        int32_t sum = 0;
        for (int64_t k = k0; k < k1; ++k) {
          const int16_t v = x.q[i * x.stride + k];
          qp[i * out.stride + k] = static_cast<int8_t>(v);
          sum += v;
        }
        sump[i * out.blocks + b] = sum;
        sp[i * out.blocks + b] = *x.ScaleAt(i, k0);
      }
    }
  };
  if (m * cols < (1 << 15)) {
    rows(0, m);
  } else {
    pool.ParallelFor(m, 1, rows);
  }
  out.q = qp;
  out.scale = sp;
  out.sums = sump;
  return out;
}

void Int4PanelColumns(const Int4Rows& x, int64_t m, const LinearJob& job, int64_t p0, int64_t p1) {
  const WeightMatrix& w = *job.w;
  const PanelOutput out(job, m, p1);
  const bool vnni = Int4UsesVnni();
  const TileFn* tiles = vnni ? vnni::kTiles : avx2::kTiles;
  const int tile_rows = vnni ? vnni::kTileRows : avx2::kTileRows;
  const int64_t blocks = PaddedCols(w.cols) / kInt4Block;
  for (int64_t p = p0; p < p1; ++p) {
    alignas(64) float bias16[kPanelRows] = {};
    if (job.bias != nullptr) {
      std::memcpy(bias16, job.bias + p * kPanelRows, out.Columns(p) * sizeof(float));
    }
    int64_t ldc;
    float* c = out.At(p, &ldc);
    const Panel panel = PanelAt(w, p);
    for (int64_t i0 = 0; i0 < m; i0 += tile_rows) {
      const int mr = static_cast<int>(std::min<int64_t>(tile_rows, m - i0));
      tiles[mr - 1](x, i0, panel, blocks, job.bias != nullptr ? bias16 : nullptr, c + i0 * ldc,
                    ldc);
    }
  }
  out.Flush();
}

bool Int4UsesVnni() {
  return ActiveCpuIsa() == CpuIsa::kAvx512 && DetectedCpuFeatures().avx512_vnni;
}

void Int4RowToF32(const WeightMatrix& w, int64_t row, float* out) {
  const int64_t p = row / kPanelRows, l = row % kPanelRows;
  const Panel panel = PanelAt(w, p);
  for (int64_t k = 0; k < w.cols; ++k) {
    const uint8_t byte = panel.data[NibbleByte(l, k)];
    const int u = HighNibble(k) ? byte >> 4 : byte & 0x0F;
    const int64_t at = (k / w.group) * kPanelRows + l;
    const int z = panel.zeros != nullptr ? panel.zeros[at] : kSymmetricZero;
    out[k] = static_cast<float>(u - z) * panel.scales[at];
  }
}

}  // namespace internal

void Int4Weights::Free::operator()(void* p) const { std::free(p); }

Int4Weights Int4Weights::Quantize(ThreadPool& pool, const WeightMatrix& w,
                                  const Int4Scheme& scheme) {
  CHECK(w.layout == WeightLayout::kRows &&
        (w.dtype == DType::kF32 || w.dtype == DType::kBF16 || w.dtype == DType::kF16))
      << "Int4Weights quantizes row-major F32, BF16 or F16 matrices, not " << DTypeName(w.dtype);
  CHECK(scheme.group > 0 && scheme.group % kInt4Block == 0)
      << "int4 groups are a positive multiple of " << kInt4Block << " columns: " << scheme.group;
  Int4Weights q;
  q.matrix_ = w;
  q.matrix_.dtype = DType::kI4;
  q.matrix_.layout = WeightLayout::kPanels;
  q.matrix_.group = scheme.group;
  const int64_t k = w.cols, groups = internal::Groups(q.matrix_);
  const int64_t panels = q.matrix_.stored_rows() / kPanelRows;
  const int64_t panel_bytes = internal::PanelBytes(q.matrix_);
  const size_t n_scales = static_cast<size_t>(q.matrix_.num_scales());
  q.data_.reset(static_cast<uint8_t*>(AllocateWeightMemory(panels * panel_bytes)));
  q.scales_.reset(
      static_cast<float*>(std::aligned_alloc(64, (n_scales * sizeof(float) + 63) / 64 * 64)));
  if (scheme.zero_point) {
    q.zeros_.reset(static_cast<uint8_t*>(std::aligned_alloc(64, (n_scales + 63) / 64 * 64)));
  }
  CHECK(q.data_ != nullptr && q.scales_ != nullptr && (q.zeros_ != nullptr || !scheme.zero_point))
      << "out of memory quantizing " << panels * panel_bytes << " bytes";
  uint8_t* dst = q.data_.get();
  float* scales = q.scales_.get();
  uint8_t* zeros = q.zeros_.get();
  pool.ParallelFor(panels, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> values(k);
    std::vector<uint8_t> u(k);
    for (int64_t p = begin; p < end; ++p) {
      uint8_t* out = dst + p * panel_bytes;
      std::memset(out, 0, panel_bytes);
      for (int64_t l = 0; l < kPanelRows; ++l) {
        const int64_t row = p * kPanelRows + l;
        if (row < w.rows) {
          WeightRowToF32(w, row, values.data());
        } else {
          std::fill(values.begin(), values.end(), 0.0f);  // padding rows: s = 0
        }
        for (int64_t g = 0; g < groups; ++g) {
          const int64_t b = g * scheme.group, e = std::min(k, b + scheme.group);
          const int64_t at = (p * groups + g) * kPanelRows + l;
          int zero;
          internal::QuantizeGroup(values.data() + b, e - b, scheme.zero_point, u.data() + b,
                                  &scales[at], &zero);
          if (zeros != nullptr) zeros[at] = static_cast<uint8_t>(zero);
        }
        for (int64_t kk = 0; kk < k; ++kk) {
          out[internal::NibbleByte(l, kk)] |=
              static_cast<uint8_t>(u[kk] << (internal::HighNibble(kk) ? 4 : 0));
        }
      }
    }
  });
  q.matrix_.data = dst;
  q.matrix_.scales = scales;
  q.matrix_.zeros = zeros;
  return q;
}

}  // namespace mmserve::model::cpu
