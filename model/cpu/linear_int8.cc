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
// of a panel per instruction. vpdpbusd takes one operand unsigned, so x goes
// in offset, x + 128 (QuantizedRows::u8), and each segment's sum is taken
// back by 128 x (the segment's sum of each output's weights): the exact
// integer sum of x_q * w_q, as the other kernels get it.
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

// Columns k .. k + 3 of a panel (k a multiple of 4) as vpdpbusd's signed
// operand: row r's four weights in dword r. A last odd pair (k + 2 >= kp)
// reads zeros for the absent second pair.
inline __m512i LoadQuad(const int8_t* panel, int64_t kp, int64_t k) {
  const __mmask64 valid = k + 2 < kp ? ~0ull : 0xFFFFFFFFull;
  const __m512i raw = _mm512_maskz_loadu_epi8(valid, panel + k * kPanelRows);
  return _mm512_maskz_permutexvar_epi16(0xFFFFFFFFu, QuadIndex(), raw);
}

// 128 in every byte: times the weights, vpdpbusd sums 128 x 4 of them.
inline __m512i Bytes128() { return _mm512_set1_epi8(static_cast<char>(0x80)); }

// The segments of linear_int8_tile.inc's Tile over columns [k0, k1) (k0 a
// segment start): cut at multiples of kSegment and of the group (0: none).
class Segments {
 public:
  Segments(int64_t k0, int64_t k1, int64_t group)
      : k_(k0), k1_(k1), group_(group), group_index_(group > 0 ? k0 / group : 0) {
    group_end_ = group > 0 ? (group_index_ + 1) * group : k1;
    end_ = std::min({k1_, (k_ / kSegment + 1) * kSegment, group_end_});
  }
  bool Done() const { return k_ >= k1_; }
  int64_t begin() const { return k_; }
  int64_t end() const { return end_; }
  int64_t group_index() const { return group_index_; }
  void Next() {
    k_ = end_;
    if (k_ == group_end_) {
      ++group_index_;
      group_end_ += group_;
    }
    end_ = std::min({k1_, (k_ / kSegment + 1) * kSegment, group_end_});
  }

 private:
  int64_t k_, k1_, group_, group_index_, group_end_ = 0, end_ = 0;
};

// c[0:16] after a segment whose exact int32 sums are `sums`: c + float(s),
// or fma(float(s), g, c) with g the segment's 16 group scales; c starts at 0
// (first: the segment begins at k = 0).
inline void AddSegment(__m512i sums, const float* g, bool first, float* c) {
  const __m512 sum = _mm512_maskz_cvtepi32_ps(0xFFFF, sums);  // GCC 12: no undefined source
  const __m512 prev = first ? _mm512_setzero_ps() : _mm512_loadu_ps(c);
  _mm512_storeu_ps(
      c, g != nullptr ? _mm512_fmadd_ps(sum, _mm512_loadu_ps(g), prev) : _mm512_add_ps(prev, sum));
}

// linear_int8_tile.inc's Tile for one row of x (u8: x + 128) and one
// panel, all of k: the same segments, sums and fp32 operations, 16 outputs
// a vector. (One row: decode, which streams the panel once.)
void RowTile(const uint8_t* u8, const Panels& w, int64_t kp, float* c) {
  for (Segments s(0, kp, w.group); !s.Done(); s.Next()) {
    __m512i acc = _mm512_setzero_si512(), offset = _mm512_setzero_si512();
    for (int64_t k = s.begin(); k < s.end(); k += 4) {
      int32_t quad;
      std::memcpy(&quad, u8 + k, sizeof(quad));
      const __m512i wq = LoadQuad(w.first, kp, k);
      acc = _mm512_dpbusd_epi32(acc, _mm512_set1_epi32(quad), wq);
      offset = _mm512_dpbusd_epi32(offset, Bytes128(), wq);
    }
    AddSegment(_mm512_sub_epi32(acc, offset),
               w.group > 0 ? w.scales + s.group_index() * kPanelRows : nullptr, s.begin() == 0, c);
  }
}

// A panel's columns [0, kp) in LoadQuad form, into out[(kp + 3) / 4][16],
// and for each of its segments s (Segments(0, kp, group)), -128 x the
// segment's sum of each row's weights into offset[s][16].
void QuadBlock(const int8_t* panel, int64_t kp, int64_t group, uint32_t* out, int32_t* offset) {
  for (Segments s(0, kp, group); !s.Done(); s.Next(), offset += kPanelRows) {
    __m512i sum = _mm512_setzero_si512();
    for (int64_t k = s.begin(); k < s.end(); k += 4) {
      const __m512i wq = LoadQuad(panel, kp, k);
      _mm512_storeu_si512(out + k / 4 * kPanelRows, wq);
      sum = _mm512_dpbusd_epi32(sum, Bytes128(), wq);
    }
    _mm512_storeu_si512(offset, _mm512_sub_epi32(_mm512_setzero_si512(), sum));
  }
}

// Segments of [0, kp) (QuadBlock's offsets per panel).
int64_t NumSegments(int64_t kp, int64_t group) {
  int64_t n = 0;
  for (Segments s(0, kp, group); !s.Done(); s.Next()) ++n;
  return n;
}

// The x rows, weights and outputs of a block tile.
struct BlockArgs {
  const uint8_t* u8;      // row 0's x + 128
  int64_t ldx;            // row stride of u8
  const uint32_t* block;  // panel 0's QuadBlock
  const int32_t* offset;  // and its segment offsets
  int64_t block_stride;   // words from one panel's block to the next
  int64_t offset_stride;  // ints from one panel's offsets to the next
  const Panels* w;        // panel 0 (its group scales)
  float* const* c;        // each panel's output row 0
  const int64_t* ldc;     // and row stride
};

// acc[i][q] = panel q's offset[0:16] + the products of `quads` quads of row
// i of x (from u8, rows ldx apart) and of panel q (from w, panels
// block_stride words apart). Kept out of line: inlined into BlockTile's
// segment loop, GCC 12 spilled most of the 24 accumulators on every step
// (the tile ran at ~0.33 of the vpdpbusd peak); alone it keeps them in
// registers.
template <int MR, int NP>
__attribute__((noinline)) void QuadSteps(const uint8_t* u8, int64_t ldx, const uint32_t* w,
                                         int64_t block_stride, int64_t quads, const int32_t* offset,
                                         int64_t offset_stride, __m512i (&acc)[MR][NP]) {
  __m512i a[MR][NP];
  _Pragma("GCC unroll 4") for (int q = 0; q < NP; ++q) {
    const __m512i start = _mm512_loadu_si512(offset + q * offset_stride);
    _Pragma("GCC unroll 8") for (int i = 0; i < MR; ++i) a[i][q] = start;
  }
  for (; quads > 0; --quads, w += kPanelRows, u8 += 4) {
    __m512i wv[NP];
    _Pragma("GCC unroll 4") for (int q = 0; q < NP; ++q) {
      wv[q] = _mm512_loadu_si512(w + q * block_stride);
    }
    _Pragma("GCC unroll 8") for (int i = 0; i < MR; ++i) {
      int32_t quad;
      std::memcpy(&quad, u8 + i * ldx, sizeof(quad));
      const __m512i xv = _mm512_set1_epi32(quad);
      _Pragma("GCC unroll 4") for (int q = 0; q < NP; ++q) {
        a[i][q] = _mm512_dpbusd_epi32(a[i][q], xv, wv[q]);
      }
    }
  }
  _Pragma("GCC unroll 8") for (int i = 0; i < MR; ++i) {
    _Pragma("GCC unroll 4") for (int q = 0; q < NP; ++q) acc[i][q] = a[i][q];
  }
}

// RowTile's arithmetic for MR rows and NP panels, all of k, on QuadBlocks.
// 24 accumulators for 6 x 4.
template <int MR, int NP>
void BlockTile(const BlockArgs& b, int64_t kp) {
  const Panels& w = *b.w;
  const int32_t* offset = b.offset;
  for (Segments s(0, kp, w.group); !s.Done(); s.Next(), offset += kPanelRows) {
    __m512i acc[MR][NP];
    QuadSteps<MR, NP>(b.u8 + s.begin(), b.ldx, b.block + s.begin() / 4 * kPanelRows, b.block_stride,
                      (s.end() - s.begin() + 3) / 4, offset, b.offset_stride, acc);
    _Pragma("GCC unroll 8") for (int i = 0; i < MR; ++i) {
      _Pragma("GCC unroll 4") for (int q = 0; q < NP; ++q) {
        const float* g =
            w.group > 0 ? w.scales + q * w.scale_stride + s.group_index() * kPanelRows : nullptr;
        AddSegment(acc[i][q], g, s.begin() == 0, b.c[q] + i * b.ldc[q]);
      }
    }
  }
}

constexpr int kBlockRows = 6;
constexpr int kBlockPanels = 4;
using BlockTileFn = void (*)(const BlockArgs&, int64_t);
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

// Row q (int16 values within +-127) as bytes q + 128 into u8.
void OffsetBytes(const int16_t* q, int64_t stride, uint8_t* u8) {
  const __m128i flip = _mm_set1_epi8(static_cast<char>(0x80));
  for (int64_t k = 0; k < stride; k += 16) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + k));
    const __m128i bytes =
        _mm_packs_epi16(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(u8 + k), _mm_xor_si128(bytes, flip));
  }
}

}  // namespace

QuantizedRows QuantizeRows(ThreadPool& pool, const float* x, int64_t m, int64_t cols, int max_q) {
  thread_local std::vector<int16_t> q;
  thread_local std::vector<float> scale;
  thread_local std::vector<uint8_t> u8;
  const int64_t stride = (cols + 15) / 16 * 16;
  const bool int8 = max_q <= 127;
  q.resize(static_cast<size_t>(m * stride));
  scale.resize(static_cast<size_t>(m));
  u8.resize(int8 ? q.size() : 0);
  // The storage is this thread's (thread_local): workers see it through
  // these pointers.
  int16_t* qp = q.data();
  float* sp = scale.data();
  uint8_t* u8p = u8.data();
  auto rows = [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      QuantizeRow(x + i * cols, cols, qp + i * stride, stride, sp + i, max_q);
      if (int8) OffsetBytes(qp + i * stride, stride, u8p + i * stride);
    }
  };
  // A few rows are not worth waking the pool.
  if (m * cols < (1 << 15)) {
    rows(0, m);
  } else {
    pool.ParallelFor(m, 1, rows);
  }
  QuantizedRows out{qp, stride, sp};
  if (int8) out.u8 = u8p;
  return out;
}

namespace {

// Row tiles of at most kBlockRows rows, as even as they go (32 rows: 6, 6,
// 5, 5, 5, 5): rows of the next tile when `rows` remain.
int NextTileRows(int64_t rows) {
  const int64_t tiles = (rows + vnni512::kBlockRows - 1) / vnni512::kBlockRows;
  return static_cast<int>((rows + tiles - 1) / tiles);
}

// Int8 activations, 2+ rows: panels [p0, p1) in groups of up to 4, each
// group put in vpdpbusd form once (QuadBlock, all of k) for all its row
// tiles; a tile then runs all of k with its outputs in L1.
template <typename Finish>
void Vnni512BlockColumns(const QuantizedRows& x, int64_t m, const WeightMatrix& w, int64_t p0,
                         int64_t p1, const PanelOutput& out, Finish& finish) {
  const int64_t kp = PairedCols(w.cols);
  const int64_t block_stride = (kp + 3) / 4 * kPanelRows;
  const int64_t offset_stride = vnni512::NumSegments(kp, w.group) * kPanelRows;
  thread_local std::vector<uint32_t> block;
  thread_local std::vector<int32_t> offsets;
  block.resize(static_cast<size_t>(vnni512::kBlockPanels * block_stride));
  offsets.resize(static_cast<size_t>(vnni512::kBlockPanels * offset_stride));
  for (int64_t g0 = p0; g0 < p1; g0 += vnni512::kBlockPanels) {
    const int np = static_cast<int>(std::min<int64_t>(vnni512::kBlockPanels, p1 - g0));
    const Panels first = PanelsAt(w, g0);
    for (int q = 0; q < np; ++q) {
      vnni512::QuadBlock(first.first + q * first.stride, kp, w.group, &block[q * block_stride],
                         &offsets[q * offset_stride]);
    }
    float* c[vnni512::kBlockPanels];
    int64_t ldc[vnni512::kBlockPanels];
    vnni512::BlockArgs args{
        x.u8, x.stride, block.data(), offsets.data(), block_stride, offset_stride, &first, c, ldc};
    for (int64_t i0 = 0; i0 < m;) {
      const int mr = NextTileRows(m - i0);
      for (int q = 0; q < np; ++q) c[q] = out.At(g0 + q, &ldc[q]) + i0 * ldc[q];
      args.u8 = x.u8 + i0 * x.stride;
      vnni512::kBlockTiles[mr - 1][np - 1](args, kp);
      for (int q = 0; q < np; ++q) finish(g0 + q, i0, mr);
      i0 += mr;
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
  if (x.u8 != nullptr && w.group % 4 == 0 && Int8ActUsesVnni512()) {
    if (m > 1) {
      Vnni512BlockColumns(x, m, w, p0, p1, out, finish);
      return;
    }
    // Int8 activations, one row: panel by panel, k in one run.
    for (int64_t p = p0; p < p1; ++p) {
      int64_t ldc;
      vnni512::RowTile(x.u8, PanelsAt(w, p), kp, out.At(p, &ldc));
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
