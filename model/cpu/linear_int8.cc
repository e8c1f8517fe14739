#include "model/cpu/linear_int8.h"

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "common/logging.h"
#include "model/cpu/cpu_isa.h"
#include "model/cpu/panel_output.h"
#include "model/cpu/weight_memory.h"

namespace mmserve::model::cpu {
namespace internal {
namespace {

// The int32 sums of a tile restart every kSegment steps of k (and at every
// scale group's start): 256 products of |q| <= 32767 and |w| <= 127 stay
// below 2^31 (1.07e9), whatever the values.
constexpr int64_t kSegment = 256;
// Multi-row calls walk k in blocks of kKb: a row tile of x (3-6 KiB) and
// the task's panels (4 x 4 KiB) stay in L1.
constexpr int64_t kKb = 256;
static_assert(kKb % kSegment == 0, "blocks must end on segment boundaries");

int64_t PairedCols(int64_t cols) { return (cols + 1) / 2 * 2; }

// A single row streams its panels from memory, prefetching this many bytes
// ahead: the loop alone keeps too few lines in flight (1024 and 2048
// measured slower here, 8192 no faster).
constexpr int64_t kPrefetchBytes = 4096;

// The weights of NP consecutive panels of one matrix as a tile reads them.
struct Panels {
  const int8_t* first = nullptr;  // panel 0's pair 0
  int64_t stride = 0;             // bytes from one panel to the next
  const float* scales = nullptr;  // grouped: panel 0's [groups][16] scales
  int64_t scale_stride = 0;       // floats from one panel's scales to the next
  int64_t group = 0;              // 0: one scale per row, applied in Finish
};

using TileFn = void (*)(const int16_t*, int64_t, const Panels&, int64_t, int64_t, float*, int64_t);

namespace avx2 {
constexpr bool kFusedAccumulate = false;
// 12 accumulators, two widened weight vectors, a broadcast pair of x and one
// product: the 16 ymm registers.
constexpr int kTileRows = 6;
inline __m256i Accumulate(__m256i acc, __m256i x, __m256i w) {
  return _mm256_add_epi32(acc, _mm256_madd_epi16(x, w));
}
#include "model/cpu/linear_int8_tile.inc"
}  // namespace avx2

// The same kernels with vpdpwssd, for CPUs with AVX512-VNNI (Ice Lake and
// later, Zen 4 and later): one instruction for vpmaddwd + vpaddd, on the
// same 256-bit vectors, so the same exact sums and the same results.
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512vl,avx512vnni"))), \
                             apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512vl,avx512vnni")
#endif
namespace vnni {
constexpr bool kFusedAccumulate = true;
// AVX-512's 32 vector registers would hold taller tiles, but 8 rows
// measured no faster than 6, and 12 slower than the AVX2 kernels.
constexpr int kTileRows = 6;
inline __m256i Accumulate(__m256i acc, __m256i x, __m256i w) {
  return _mm256_dpwssd_epi32(acc, x, w);
}
#include "model/cpu/linear_int8_tile.inc"
}  // namespace vnni
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

// Int8 activations on vpdpbusd (AVX512-VNNI, 512-bit): 4 columns x 16 rows
// of a panel per instruction. vpdpbusd takes one operand unsigned, so the
// weights go in offset, w + 128 (a byte's top bit flipped), and each
// segment's sum starts from -128 x (the row's sum of x over the segment):
// the exact integer sum of x_q * w_q, as the other kernels get it (int32
// wraps, but the final sum is in range).
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vnni"))), \
                             apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vnni")
#endif
namespace vnni512 {

// vpermw indices: from pairs j (words 0-15: rows 0-15) and j + 1 (words
// 16-31) of a panel, row r's four values land in dword r.
inline __m512i QuadIndex() {
  alignas(64) static constexpr uint16_t kIndex[32] = {0,  16, 1,  17, 2,  18, 3,  19, 4,  20, 5,
                                                      21, 6,  22, 7,  23, 8,  24, 9,  25, 10, 26,
                                                      11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  return _mm512_load_si512(kIndex);
}

// Quad t of a panel (columns 4t .. 4t + 3 of its 16 rows) as vpdpbusd's
// unsigned operand: row r's four weights + 128 in dword r. A last odd pair
// (4t + 2 >= kp) reads zeros for the absent second pair.
inline __m512i LoadQuad(const int8_t* panel, int64_t kp, int64_t k) {
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  const __mmask64 valid = k + 2 < kp ? ~0ull : 0xFFFFFFFFull;
  const __m512i raw = _mm512_maskz_loadu_epi8(valid, panel + k * kPanelRows);
  return _mm512_xor_si512(_mm512_maskz_permutexvar_epi16(0xFFFFFFFFu, QuadIndex(), raw), flip);
}

// -128 x the sum of row x's int8 values over columns [k0, k1) (k0 a multiple
// of 4), from its prefix sums: the start of a segment's int32 sum.
inline int32_t Offset(const int32_t* prefix, int64_t k0, int64_t k1) {
  return -128 * (prefix[(k1 + 3) / 4] - prefix[k0 / 4]);
}

// c[0:16] after a segment whose exact int32 sums are `sums`: c + float(s),
// or fma(float(s), g, c) with g the segment's 16 group scales; c starts at 0
// (first: the segment begins at k = 0).
inline void AddSegment(__m512i sums, const float* g, bool first, float* c) {
  const __m512 sum = _mm512_maskz_cvtepi32_ps(0xFFFF, sums);  // GCC 12: no undefined source
  const __m512 prev = first ? _mm512_setzero_ps() : _mm512_loadu_ps(c);
  _mm512_storeu_ps(
      c, g != nullptr ? _mm512_fmadd_ps(sum, _mm512_loadu_ps(g), prev) : _mm512_add_ps(prev, sum));
}

// The segment loop of linear_int8_tile.inc's Tile for one row of x (x8 and
// its prefix sums) and one panel, k in [k0, k1): the same segments, sums
// and fp32 operations, 16 outputs a vector. (One row: decode.)
void RowTile(const int8_t* x8, const int32_t* prefix, const Panels& w, int64_t kp, int64_t k0,
             int64_t k1, float* c) {
  int64_t group_index = w.group > 0 ? k0 / w.group : 0;
  int64_t group_end = w.group > 0 ? (group_index + 1) * w.group : k1;
  for (int64_t k = k0; k < k1;) {
    const int64_t seg_begin = k;
    const int64_t seg_end = std::min({k1, (k / kSegment + 1) * kSegment, group_end});
    __m512i acc = _mm512_set1_epi32(Offset(prefix, seg_begin, seg_end));
    for (; k < seg_end; k += 4) {
      int32_t quad;
      std::memcpy(&quad, x8 + k, sizeof(quad));
      acc = _mm512_dpbusd_epi32(acc, LoadQuad(w.first, kp, k), _mm512_set1_epi32(quad));
    }
    k = seg_end;
    AddSegment(acc, w.group > 0 ? w.scales + group_index * kPanelRows : nullptr, seg_begin == 0, c);
    if (k == group_end) {
      ++group_index;
      group_end += w.group;
    }
  }
}

// Columns [k0, k1) of a panel in LoadQuad form, into out[(k1 - k0 + 3) / 4][16].
void QuadBlock(const int8_t* panel, int64_t kp, int64_t k0, int64_t k1, uint32_t* out) {
  for (int64_t k = k0; k < k1; k += 4) {
    _mm512_storeu_si512(out + (k - k0) / 4 * kPanelRows, LoadQuad(panel, kp, k));
  }
}

// The x rows, weights and outputs of a block tile.
struct BlockArgs {
  const int8_t* x8;       // row 0's int8 values
  const int32_t* prefix;  // row 0's prefix sums
  int64_t ldx, ldp;       // row strides of x8 and prefix
  const uint32_t* block;  // panel 0's QuadBlock of columns [k0, k1)
  int64_t block_stride;   // words from one panel's block to the next
  const Panels* w;        // panel 0 (its group scales)
  float* const* c;        // each panel's output row 0
  const int64_t* ldc;     // and row stride
};

// acc[i][q] = offset[i] + the products of `quads` quads of row i of x (from
// x8, rows ldx apart) and panel q's block (from w, panels block_stride words
// apart). Kept out of line: inlined into BlockTile's segment loop, GCC 12
// spilled most of the 24 accumulators on every step (0.33 of the vpdpbusd
// peak); alone it keeps them in registers.
template <int MR, int NP>
__attribute__((noinline)) void QuadSteps(const int8_t* x8, int64_t ldx, const uint32_t* w,
                                         int64_t block_stride, int64_t quads,
                                         const int32_t (&offset)[MR], __m512i (&acc)[MR][NP]) {
  __m512i a[MR][NP];
  _Pragma("GCC unroll 8") for (int i = 0; i < MR; ++i) {
    _Pragma("GCC unroll 4") for (int q = 0; q < NP; ++q) a[i][q] = _mm512_set1_epi32(offset[i]);
  }
  for (; quads > 0; --quads, w += kPanelRows, x8 += 4) {
    __m512i wv[NP];
    _Pragma("GCC unroll 4") for (int q = 0; q < NP; ++q) {
      wv[q] = _mm512_loadu_si512(w + q * block_stride);
    }
    _Pragma("GCC unroll 8") for (int i = 0; i < MR; ++i) {
      int32_t quad;
      std::memcpy(&quad, x8 + i * ldx, sizeof(quad));
      const __m512i xv = _mm512_set1_epi32(quad);
      _Pragma("GCC unroll 4") for (int q = 0; q < NP; ++q) {
        a[i][q] = _mm512_dpbusd_epi32(a[i][q], wv[q], xv);
      }
    }
  }
  _Pragma("GCC unroll 8") for (int i = 0; i < MR; ++i) {
    _Pragma("GCC unroll 4") for (int q = 0; q < NP; ++q) acc[i][q] = a[i][q];
  }
}

// RowTile's arithmetic for MR rows and NP panels over the block's columns
// [k0, k1). 24 accumulators for 6 x 4.
template <int MR, int NP>
void BlockTile(const BlockArgs& b, int64_t k0, int64_t k1) {
  const Panels& w = *b.w;
  int64_t group_index = w.group > 0 ? k0 / w.group : 0;
  int64_t group_end = w.group > 0 ? (group_index + 1) * w.group : k1;
  for (int64_t k = k0; k < k1;) {
    const int64_t seg_begin = k;
    const int64_t seg_end = std::min({k1, (k / kSegment + 1) * kSegment, group_end});
    int32_t offset[MR];
    for (int i = 0; i < MR; ++i) offset[i] = Offset(b.prefix + i * b.ldp, seg_begin, seg_end);
    __m512i acc[MR][NP];
    QuadSteps<MR, NP>(b.x8 + seg_begin, b.ldx, b.block + (seg_begin - k0) / 4 * kPanelRows,
                      b.block_stride, (seg_end - seg_begin + 3) / 4, offset, acc);
    k = seg_end;
    _Pragma("GCC unroll 8") for (int i = 0; i < MR; ++i) {
      _Pragma("GCC unroll 4") for (int q = 0; q < NP; ++q) {
        const float* g =
            w.group > 0 ? w.scales + q * w.scale_stride + group_index * kPanelRows : nullptr;
        AddSegment(acc[i][q], g, seg_begin == 0, b.c[q] + i * b.ldc[q]);
      }
    }
    if (k == group_end) {
      ++group_index;
      group_end += w.group;
    }
  }
}

constexpr int kBlockRows = 6;
constexpr int kBlockPanels = 4;
using BlockTileFn = void (*)(const BlockArgs&, int64_t, int64_t);
template <int MR>
constexpr std::array<BlockTileFn, kBlockPanels> BlockTileRow() {
  return {&BlockTile<MR, 1>, &BlockTile<MR, 2>, &BlockTile<MR, 3>, &BlockTile<MR, 4>};
}
constexpr std::array<std::array<BlockTileFn, kBlockPanels>, kBlockRows> kBlockTiles = {
    BlockTileRow<1>(), BlockTileRow<2>(), BlockTileRow<3>(),
    BlockTileRow<4>(), BlockTileRow<5>(), BlockTileRow<6>()};

}  // namespace vnni512
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

// The last operations of an output element, alike in every path, as
// separate vector roundings: y = c * s_row (one scale per output row only),
// then * s_x (the x row's scale), then + bias; on `cols` <= 16 columns from
// column j0, for `rows` rows of c (row stride ldc) whose x scales are sx.
void Finish(float* c, int64_t ldc, int rows, const float* sx, int64_t j0, int cols,
            const float* scales, const float* bias) {
  alignas(32) float s[kPanelRows], b[kPanelRows];
  for (int j = 0; j < kPanelRows; ++j) {
    s[j] = j < cols && scales != nullptr ? scales[j0 + j] : 1.0f;
    b[j] = j < cols && bias != nullptr ? bias[j0 + j] : 0.0f;
  }
  for (int i = 0; i < rows; ++i) {
    alignas(32) float v[kPanelRows] = {};
    std::memcpy(v, c + i * ldc, cols * sizeof(float));
    const __m256 xs = _mm256_set1_ps(sx[i]);
    _Pragma("GCC unroll 2") for (int h = 0; h < 2; ++h) {
      __m256 r = _mm256_load_ps(v + h * 8);
      if (scales != nullptr) r = _mm256_mul_ps(r, _mm256_load_ps(s + h * 8));
      r = _mm256_mul_ps(r, xs);
      if (bias != nullptr) r = _mm256_add_ps(r, _mm256_load_ps(b + h * 8));
      _mm256_store_ps(v + h * 8, r);
    }
    std::memcpy(c + i * ldc, v, cols * sizeof(float));
  }
}

// Panels [p, p + NP) of w as a tile reads them.
Panels PanelsAt(const WeightMatrix& w, int64_t p) {
  Panels out;
  const int64_t kp = PairedCols(w.cols);
  out.stride = kp * kPanelRows;
  out.first = static_cast<const int8_t*>(w.data) + p * out.stride;
  out.group = w.group;
  if (w.group > 0) {
    out.scale_stride = (w.cols + w.group - 1) / w.group * kPanelRows;
    out.scales = w.scales + p * out.scale_stride;
  }
  return out;
}

void QuantizeRow(const float* x, int64_t cols, int16_t* q, int64_t stride, float* scale,
                 int max_q) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  __m256 vmax = _mm256_setzero_ps(), unordered = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 8 <= cols; k += 8) {
    const __m256 v = _mm256_loadu_ps(x + k);
    vmax = _mm256_max_ps(vmax, _mm256_and_ps(v, abs_mask));
    unordered = _mm256_or_ps(unordered, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, vmax);
  float amax = 0;
  for (float l : lanes) amax = std::max(amax, l);
  bool nan = _mm256_movemask_ps(unordered) != 0;
  for (int64_t t = k; t < cols; ++t) {
    amax = std::max(amax, std::fabs(x[t]));
    nan = nan || std::isnan(x[t]);
  }
  std::memset(q, 0, stride * sizeof(int16_t));
  if (nan || !std::isfinite(amax)) {
    *scale = std::numeric_limits<float>::quiet_NaN();
    return;
  }
  const float top = static_cast<float>(max_q);
  *scale = amax / top;
  if (amax == 0) return;
  const float inv = top / amax;
  const __m256 vinv = _mm256_set1_ps(inv);
  k = 0;
  for (; k + 16 <= cols; k += 16) {
    // Round to nearest even (the default MXCSR mode), saturate to int16.
    const __m256i a = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + k), vinv));
    const __m256i b = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + k + 8), vinv));
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packs_epi32(a, b), 0xD8);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + k), packed);
  }
  for (; k < cols; ++k) {
    const float v = std::nearbyint(x[k] * inv);
    q[k] = static_cast<int16_t>(std::min(top, std::max(-top, v)));
  }
}

// Row q (int16 values within +-127) as int8 into q8, and its prefix sums
// over quads: prefix[t] = the sum of columns [0, 4t), t <= stride / 4.
void Int8Row(const int16_t* q, int64_t stride, int8_t* q8, int32_t* prefix) {
  for (int64_t k = 0; k < stride; k += 16) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + k));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q8 + k),
                     _mm_packs_epi16(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1)));
  }
  int32_t run = 0;
  prefix[0] = 0;
  for (int64_t t = 0; t < stride / 4; ++t) {
    run += q[4 * t] + q[4 * t + 1] + q[4 * t + 2] + q[4 * t + 3];
    prefix[t + 1] = run;
  }
}

}  // namespace

QuantizedRows QuantizeRows(ThreadPool& pool, const float* x, int64_t m, int64_t cols, int max_q) {
  thread_local std::vector<int16_t> q;
  thread_local std::vector<float> scale;
  thread_local std::vector<int8_t> q8;
  thread_local std::vector<int32_t> prefix;
  const int64_t stride = (cols + 15) / 16 * 16, ldp = stride / 4 + 1;
  const bool int8 = max_q <= 127;
  q.resize(static_cast<size_t>(m * stride));
  scale.resize(static_cast<size_t>(m));
  q8.resize(int8 ? q.size() : 0);
  prefix.resize(int8 ? static_cast<size_t>(m * ldp) : 0);
  // The storage is this thread's (thread_local): workers see it through
  // these pointers.
  int16_t* qp = q.data();
  float* sp = scale.data();
  int8_t* q8p = q8.data();
  int32_t* pp = prefix.data();
  auto rows = [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      QuantizeRow(x + i * cols, cols, qp + i * stride, stride, sp + i, max_q);
      if (int8) Int8Row(qp + i * stride, stride, q8p + i * stride, pp + i * ldp);
    }
  };
  // A few rows are not worth waking the pool.
  if (m * cols < (1 << 15)) {
    rows(0, m);
  } else {
    pool.ParallelFor(m, 1, rows);
  }
  QuantizedRows out{qp, stride, sp};
  if (int8) {
    out.q8 = q8p;
    out.prefix = pp;
    out.prefix_stride = ldp;
  }
  return out;
}

namespace {

// Row tiles of at most kBlockRows rows, as even as they go (32 rows: 6, 6,
// 5, 5, 5, 5): rows of the next tile when `rows` remain.
int NextTileRows(int64_t rows) {
  const int64_t tiles = (rows + vnni512::kBlockRows - 1) / vnni512::kBlockRows;
  return static_cast<int>((rows + tiles - 1) / tiles);
}

// Int8 activations, 2+ rows: panels [p0, p1) in groups of up to 4, each k
// block of a group put in vpdpbusd form once (QuadBlock) for all the row
// tiles that use it.
template <typename Finish>
void Vnni512BlockColumns(const QuantizedRows& x, int64_t m, const WeightMatrix& w, int64_t p0,
                         int64_t p1, const PanelOutput& out, Finish& finish) {
  const int64_t kp = PairedCols(w.cols);
  const int64_t block_stride = kKb / 4 * kPanelRows;
  thread_local std::vector<uint32_t> block;
  block.resize(static_cast<size_t>(vnni512::kBlockPanels * block_stride));
  for (int64_t g0 = p0; g0 < p1; g0 += vnni512::kBlockPanels) {
    const int np = static_cast<int>(std::min<int64_t>(vnni512::kBlockPanels, p1 - g0));
    const Panels first = PanelsAt(w, g0);
    float* c[vnni512::kBlockPanels];
    int64_t ldc[vnni512::kBlockPanels];
    vnni512::BlockArgs args{x.q8,   x.prefix, x.stride, x.prefix_stride, block.data(), block_stride,
                            &first, c,        ldc};
    for (int64_t k0 = 0; k0 < kp; k0 += kKb) {
      const int64_t k1 = std::min(kp, k0 + kKb);
      for (int q = 0; q < np; ++q) {
        vnni512::QuadBlock(first.first + q * first.stride, kp, k0, k1, &block[q * block_stride]);
      }
      for (int64_t i0 = 0; i0 < m;) {
        const int mr = NextTileRows(m - i0);
        for (int q = 0; q < np; ++q) c[q] = out.At(g0 + q, &ldc[q]) + i0 * ldc[q];
        args.x8 = x.q8 + i0 * x.stride;
        args.prefix = x.prefix + i0 * x.prefix_stride;
        vnni512::kBlockTiles[mr - 1][np - 1](args, k0, k1);
        if (k1 == kp) {
          for (int q = 0; q < np; ++q) finish(g0 + q, i0, mr);
        }
        i0 += mr;
      }
    }
  }
  out.Flush();
}

}  // namespace

void Int8PanelColumns(const QuantizedRows& x, int64_t m, const LinearJob& job, int64_t p0,
                      int64_t p1) {
  const WeightMatrix& w = *job.w;
  const int64_t kp = PairedCols(w.cols);
  const float* row_scales = w.group == 0 ? w.scales : nullptr;
  const PanelOutput out(job, m, p1);
  // Rows [i0, i0 + rows) of panel p's outputs are final.
  auto finish = [&](int64_t p, int64_t i0, int rows) {
    int64_t ldc;
    float* c = out.At(p, &ldc);
    Finish(c + i0 * ldc, ldc, rows, x.scale + i0, p * kPanelRows, out.Columns(p), row_scales,
           job.bias);
  };
  if (x.q8 != nullptr && w.group % 4 == 0 && Int8ActUsesVnni512()) {
    if (m > 1) {
      Vnni512BlockColumns(x, m, w, p0, p1, out, finish);
      return;
    }
    // Int8 activations, one row: panel by panel, k in one run.
    for (int64_t p = p0; p < p1; ++p) {
      int64_t ldc;
      vnni512::RowTile(x.q8, x.prefix, PanelsAt(w, p), kp, 0, kp, out.At(p, &ldc));
      finish(p, 0, 1);
    }
    out.Flush();
    return;
  }
  const bool vnni = Int8UsesVnni();
  const TileFn* tiles = vnni ? vnni::kRowTiles.data() : avx2::kRowTiles.data();
  const int tile_rows = vnni ? vnni::kTileRows : avx2::kTileRows;
  if (m == 1) {
    // One panel at a time: a single sequential stream per thread, which
    // measured faster than 2 or 4 interleaved ones.
    for (int64_t p = p0; p < p1; ++p) {
      int64_t ldc;
      float* c = out.At(p, &ldc);
      (vnni ? vnni::Tile<1, 1> : avx2::Tile<1, 1>)(x.q, x.stride, PanelsAt(w, p), 0, kp, c, ldc);
      finish(p, 0, 1);
    }
  } else {
    for (int64_t k0 = 0; k0 < kp; k0 += kKb) {
      const int64_t k1 = std::min(kp, k0 + kKb);
      for (int64_t i0 = 0; i0 < m; i0 += tile_rows) {
        const int mr = static_cast<int>(std::min<int64_t>(tile_rows, m - i0));
        for (int64_t p = p0; p < p1; ++p) {
          int64_t ldc;
          float* c = out.At(p, &ldc);
          tiles[mr - 1](x.q + i0 * x.stride, x.stride, PanelsAt(w, p), k0, k1, c + i0 * ldc, ldc);
          if (k1 == kp) finish(p, i0, mr);
        }
      }
    }
  }
  out.Flush();
}

bool Int8ActUsesVnni512() { return Int8UsesVnni(); }

bool Int8UsesVnni() {
  return ActiveCpuIsa() == CpuIsa::kAvx512 && DetectedCpuFeatures().avx512_vnni;
}

void Int8RowToF32(const WeightMatrix& w, int64_t row, float* out) {
  const int64_t p = row / kPanelRows, l = row % kPanelRows;
  const int8_t* panel = static_cast<const int8_t*>(w.data) + p * PairedCols(w.cols) * kPanelRows;
  // Pair k / 2 holds rows 0-7 then 8-15, each row's two values together.
  const int64_t at = (l / 8) * 16 + (l % 8) * 2;
  const float* s = w.group == 0
                       ? w.scales + row
                       : w.scales + p * ((w.cols + w.group - 1) / w.group) * kPanelRows + l;
  for (int64_t k = 0; k < w.cols; ++k) {
    const float scale = w.group == 0 ? *s : s[(k / w.group) * kPanelRows];
    out[k] = panel[(k / 2) * 32 + at + (k & 1)] * scale;
  }
}

}  // namespace internal

void Int8Weights::Free::operator()(void* p) const { std::free(p); }

Int8Weights Int8Weights::Quantize(ThreadPool& pool, const WeightMatrix& w, int64_t group) {
  CHECK(w.layout == WeightLayout::kRows &&
        (w.dtype == DType::kF32 || w.dtype == DType::kBF16 || w.dtype == DType::kF16))
      << "Int8Weights quantizes row-major F32, BF16 or F16 matrices, not " << DTypeName(w.dtype);
  CHECK(group >= 0 && group % 2 == 0) << "int8 groups are an even number of columns: " << group;
  Int8Weights q;
  q.matrix_ = w;
  q.matrix_.dtype = DType::kI8;
  q.matrix_.layout = WeightLayout::kPanels;
  q.matrix_.group = group >= w.cols ? 0 : group;  // one group per row is per-row
  group = q.matrix_.group;
  const int64_t k = w.cols, kp = internal::PairedCols(k),
                panels = q.matrix_.stored_rows() / kPanelRows;
  const int64_t groups = group == 0 ? 1 : (k + group - 1) / group;
  const size_t bytes = static_cast<size_t>(q.matrix_.stored_rows() * kp);
  const size_t scale_bytes =
      (static_cast<size_t>(q.matrix_.num_scales()) * sizeof(float) + 63) / 64 * 64;
  q.data_.reset(static_cast<int8_t*>(AllocateWeightMemory(bytes)));
  q.scales_.reset(static_cast<float*>(std::aligned_alloc(64, scale_bytes)));
  CHECK(q.data_ != nullptr && q.scales_ != nullptr) << "out of memory quantizing " << bytes;
  int8_t* dst = q.data_.get();
  float* scales = q.scales_.get();
  pool.ParallelFor(panels, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> row_values(k);
    for (int64_t p = begin; p < end; ++p) {
      int8_t* out = dst + p * kp * kPanelRows;
      std::memset(out, 0, kp * kPanelRows);
      for (int64_t l = 0; l < kPanelRows; ++l) {
        const int64_t row = p * kPanelRows + l;
        const bool real = row < w.rows;
        if (real) WeightRowToF32(w, row, row_values.data());
        const int64_t at = (l / 8) * 16 + (l % 8) * 2;
        for (int64_t g = 0; g < groups; ++g) {
          const int64_t b = group == 0 ? 0 : g * group, e = group == 0 ? k : std::min(k, b + group);
          float amax = 0;
          for (int64_t kk = b; real && kk < e; ++kk)
            amax = std::max(amax, std::fabs(row_values[kk]));
          const float s = amax / 127.0f;
          (group == 0 ? scales[row] : scales[(p * groups + g) * kPanelRows + l]) = s;
          for (int64_t kk = b; kk < e; ++kk) {
            float v = 0;
            if (real && s > 0)
              v = std::min(127.0f, std::max(-127.0f, std::nearbyint(row_values[kk] / s)));
            out[(kk / 2) * 32 + at + (kk & 1)] = static_cast<int8_t>(v);
          }
        }
      }
    }
  });
  q.matrix_.data = dst;
  q.matrix_.scales = scales;
  return q;
}

}  // namespace mmserve::model::cpu
