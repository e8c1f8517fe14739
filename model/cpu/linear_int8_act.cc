#include "model/cpu/linear_int8_act.h"

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <vector>

#include "model/cpu/panel_output.h"

namespace mmserve::model::cpu::internal {
namespace {

int64_t PairedCols(int64_t cols) { return (cols + 1) / 2 * 2; }

// Panel p of an int8 matrix (linear.h's Int8Weights layout) and its group
// scales ([groups][16]; nullptr with one scale per row).
const int8_t* PanelData(const WeightMatrix& w, int64_t p) {
  return static_cast<const int8_t*>(w.data) + p * PairedCols(w.cols) * kPanelRows;
}
int64_t GroupScaleStride(const WeightMatrix& w) {
  return w.group > 0 ? (w.cols + w.group - 1) / w.group * kPanelRows : 0;
}
const float* GroupScales(const WeightMatrix& w, int64_t p) {
  return w.group > 0 ? w.scales + p * GroupScaleStride(w) : nullptr;
}

// The last operations of one panel's outputs, as linear_int8.cc's Finish
// does them: y = c * s_row (one scale per output row only), then * s_x (the
// x row's scale), then + bias, as separate roundings. Lanes past the
// panel's real columns get 1 and 0 (PanelOutput never copies them to y).
struct PanelFinish {
  alignas(64) float scale[kPanelRows];
  alignas(64) float bias[kPanelRows];
  bool has_scale = false;
  bool has_bias = false;

  void Set(const WeightMatrix& w, const float* b, int64_t p, int cols) {
    const float* row_scales = w.group == 0 ? w.scales : nullptr;
    has_scale = row_scales != nullptr;
    has_bias = b != nullptr;
    for (int j = 0; j < kPanelRows; ++j) {
      scale[j] = j < cols && has_scale ? row_scales[p * kPanelRows + j] : 1.0f;
      bias[j] = j < cols && has_bias ? b[p * kPanelRows + j] : 0.0f;
    }
  }
};

// The segments of linear_int8_tile.inc's Tile over columns [0, kp): cut at
// multiples of kInt8Segment, of the weight group and of the activation
// block (0: none).
class Segments {
 public:
  Segments(int64_t kp, int64_t group, int64_t block)
      : k1_(kp),
        group_(group),
        block_(block),
        group_end_(group > 0 ? group : kp),
        block_end_(block > 0 ? block : kp) {
    end_ = std::min({k1_, kInt8Segment, group_end_, block_end_});
  }
  bool Done() const { return k_ >= k1_; }
  int64_t begin() const { return k_; }
  int64_t end() const { return end_; }
  bool last() const { return end_ == k1_; }
  int64_t group_index() const { return group_index_; }
  int64_t block_index() const { return block_index_; }
  void Next() {
    k_ = end_;
    if (k_ == group_end_) {
      ++group_index_;
      group_end_ += group_;
    }
    if (k_ == block_end_) {
      ++block_index_;
      block_end_ += block_;
    }
    end_ = std::min({k1_, (k_ / kInt8Segment + 1) * kInt8Segment, group_end_, block_end_});
  }

 private:
  int64_t k_ = 0, k1_, group_, block_, group_index_ = 0, block_index_ = 0, group_end_, block_end_,
          end_;
};

// Row tiles of at most kBlockRows rows, as even as they go (32 rows: 6, 6,
// 5, 5, 5, 5): rows of the next tile when `rows` remain.
constexpr int kBlockRows = 6;
constexpr int kBlockPanels = 4;
int NextTileRows(int64_t rows) {
  const int64_t tiles = (rows + kBlockRows - 1) / kBlockRows;
  return static_cast<int>((rows + tiles - 1) / tiles);
}

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vnni"))), \
                             apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vnni")
#endif

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

// c after a segment whose exact int32 sums are `sums`: c + float(s), or
// fma(float(s), m, c) with m the segment's 16 group scales g (g !=
// nullptr), its x block scale b (block), or g * b (both).
inline __m512 AddSegment(__m512 c, __m512i sums, const float* g, bool block, __m512 b) {
  const __m512 sum = _mm512_maskz_cvtepi32_ps(0xFFFF, sums);  // GCC 12: no undefined source
  if (g != nullptr) {
    const __m512 gv = _mm512_loadu_ps(g);
    return _mm512_fmadd_ps(sum, block ? _mm512_mul_ps(gv, b) : gv, c);
  }
  return block ? _mm512_fmadd_ps(sum, b, c) : _mm512_add_ps(c, sum);
}

// y = c * s_row, * sx (without activation blocks), + bias.
inline __m512 ApplyFinish(const PanelFinish& f, __m512 c, bool block, __m512 sx) {
  if (f.has_scale) c = _mm512_mul_ps(c, _mm512_load_ps(f.scale));
  if (!block) c = _mm512_mul_ps(c, sx);
  return f.has_bias ? _mm512_add_ps(c, _mm512_load_ps(f.bias)) : c;
}

// A panel's columns [0, kp) in LoadQuad form, into out[(kp + 3) / 4][16],
// and for each of its segments s (Segments(kp, group, block)), -128 x the
// segment's sum of each row's weights into offset[s][16].
void QuadBlock(const int8_t* panel, int64_t kp, int64_t group, int64_t block, uint32_t* out,
               int32_t* offset) {
  for (Segments s(kp, group, block); !s.Done(); s.Next(), offset += kPanelRows) {
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
int64_t NumSegments(int64_t kp, int64_t group, int64_t block) {
  int64_t n = 0;
  for (Segments s(kp, group, block); !s.Done(); s.Next()) ++n;
  return n;
}

// What a block tile reads and writes: rows of x, panels in QuadBlock form
// (panel q at block + q * block_stride, its segment offsets at offset + q *
// offset_stride, its group scales at scales + q * scale_stride) and each
// panel's outputs (row 0 at c[q], rows ldc[q] apart).
struct BlockArgs {
  const uint8_t* u8;  // row 0's x + 128, rows ldx apart
  int64_t ldx;
  const float* sx;  // row 0's x scales, rows sx_stride apart
  int64_t sx_stride;
  int64_t x_block;  // activation block (0: one x scale per row)
  const uint32_t* block;
  int64_t block_stride;
  const int32_t* offset;
  int64_t offset_stride;
  int64_t group;
  const float* scales;  // group scales (group > 0)
  int64_t scale_stride;
  const PanelFinish* finish;
  float* const* c;
  const int64_t* ldc;
};

// acc[i][q] = panel q's offset[0:16] + the products of `quads` quads of row
// i of x (from u8, rows ldx apart) and of panel q (from w, panels
// block_stride words apart). Kept out of line: inlined into BlockTile's
// segment loop, GCC 12 spilled most of the 24 accumulators on every step
// (the tile ran at ~0.33 of the vpdpbusd peak); alone it keeps them in
// registers (0.94 of the peak from L1).
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

// linear_int8_tile.inc's Tile's arithmetic for MR rows and NP panels, all
// of k, on QuadBlocks (16 outputs a vector);
// the outputs hold c between segments and y after the last.
template <int MR, int NP>
void BlockTile(const BlockArgs& b, int64_t kp) {
  // The outputs' lines, for writing, while the first segment runs (their
  // first stores otherwise wait on the lines from memory).
  _Pragma("GCC unroll 8") for (int i = 0; i < MR; ++i) {
    _Pragma("GCC unroll 4") for (int q = 0; q < NP; ++q) {
      __builtin_prefetch(b.c[q] + i * b.ldc[q], 1, 3);
    }
  }
  const int32_t* offset = b.offset;
  for (Segments s(kp, b.group, b.x_block); !s.Done(); s.Next(), offset += kPanelRows) {
    __m512i acc[MR][NP];
    QuadSteps<MR, NP>(b.u8 + s.begin(), b.ldx, b.block + s.begin() / 4 * kPanelRows, b.block_stride,
                      (s.end() - s.begin() + 3) / 4, offset, b.offset_stride, acc);
    const bool block = b.x_block > 0;
    _Pragma("GCC unroll 8") for (int i = 0; i < MR; ++i) {
      const __m512 sx = _mm512_set1_ps(b.sx[i * b.sx_stride + (block ? s.block_index() : 0)]);
      _Pragma("GCC unroll 4") for (int q = 0; q < NP; ++q) {
        float* out = b.c[q] + i * b.ldc[q];
        const float* g =
            b.group > 0 ? b.scales + q * b.scale_stride + s.group_index() * kPanelRows : nullptr;
        __m512 c = AddSegment(s.begin() == 0 ? _mm512_setzero_ps() : _mm512_loadu_ps(out),
                              acc[i][q], g, block, sx);
        if (s.last()) c = ApplyFinish(b.finish[q], c, block, sx);
        _mm512_storeu_ps(out, c);
      }
    }
  }
}

using BlockTileFn = void (*)(const BlockArgs&, int64_t);
template <int MR>
constexpr std::array<BlockTileFn, kBlockPanels> BlockTileRow() {
  return {&BlockTile<MR, 1>, &BlockTile<MR, 2>, &BlockTile<MR, 3>, &BlockTile<MR, 4>};
}
constexpr std::array<std::array<BlockTileFn, kBlockPanels>, kBlockRows> kBlockTiles = {
    BlockTileRow<1>(), BlockTileRow<2>(), BlockTileRow<3>(),
    BlockTileRow<4>(), BlockTileRow<5>(), BlockTileRow<6>()};

// Panels [g0, g0 + np) (np <= 4) of the job for all m rows: put in
// QuadBlock form once, for all of k, then every row tile over them.
void BlockColumns(const QuantizedRows& x, int64_t m, const LinearJob& job, const PanelOutput& out,
                  int64_t g0, int np) {
  const WeightMatrix& w = *job.w;
  const int64_t kp = PairedCols(w.cols);
  const int64_t block_stride = (kp + 3) / 4 * kPanelRows;
  const int64_t offset_stride = NumSegments(kp, w.group, x.block) * kPanelRows;
  thread_local std::vector<uint32_t> block;
  thread_local std::vector<int32_t> offsets;
  block.resize(static_cast<size_t>(kBlockPanels * block_stride));
  offsets.resize(static_cast<size_t>(kBlockPanels * offset_stride));
  PanelFinish finish[kBlockPanels];
  for (int q = 0; q < np; ++q) {
    QuadBlock(PanelData(w, g0 + q), kp, w.group, x.block, &block[q * block_stride],
              &offsets[q * offset_stride]);
    finish[q].Set(w, job.bias, g0 + q, out.Columns(g0 + q));
  }
  float* c[kBlockPanels];
  int64_t ldc[kBlockPanels];
  BlockArgs args{x.u8,
                 x.stride,
                 x.scale,
                 x.scale_stride,
                 x.block,
                 block.data(),
                 block_stride,
                 offsets.data(),
                 offset_stride,
                 w.group,
                 GroupScales(w, g0),
                 GroupScaleStride(w),
                 finish,
                 c,
                 ldc};
  for (int64_t i0 = 0; i0 < m;) {
    const int mr = NextTileRows(m - i0);
    for (int q = 0; q < np; ++q) c[q] = out.At(g0 + q, &ldc[q]) + i0 * ldc[q];
    args.u8 = x.u8 + i0 * x.stride;
    args.sx = x.scale + i0 * x.scale_stride;
    kBlockTiles[mr - 1][np - 1](args, kp);
    i0 += mr;
  }
}

}  // namespace

double Int8ActInnerLoop(int64_t reps) {
  constexpr int64_t kQuads = kInt8Segment / 4;
  constexpr int kRows = kBlockRows, kPanels = kBlockPanels;
  alignas(64) static thread_local uint32_t w[kPanels * kQuads * kPanelRows];
  alignas(64) static thread_local uint8_t x[kRows * kInt8Segment];
  alignas(64) static thread_local int32_t offset[kPanels * kPanelRows];
  for (size_t i = 0; i < sizeof(w) / sizeof(w[0]); ++i)
    w[i] = static_cast<uint32_t>(i * 2654435761u);
  for (size_t i = 0; i < sizeof(x); ++i) x[i] = static_cast<uint8_t>(i * 131);
  for (int32_t& o : offset) o = 0;
  __m512i acc[kRows][kPanels];
  __m512i keep = _mm512_setzero_si512();
  for (int64_t r = 0; r < reps; ++r) {
    QuadSteps<kRows, kPanels>(x, kInt8Segment, w, kQuads * kPanelRows, kQuads, offset, kPanelRows,
                              acc);
    keep = _mm512_add_epi32(keep, acc[r % kRows][r % kPanels]);
  }
  alignas(64) int32_t lanes[16];
  _mm512_store_si512(lanes, keep);
  // Something the caller cannot see through keeps the loop alive.
  offset[0] = lanes[0];
  return 2.0 * 4 * kPanelRows * kRows * kPanels * kQuads * static_cast<double>(reps);
}

void Int8ActPanelColumns(const QuantizedRows& x, int64_t m, const LinearJob& job, int64_t p0,
                         int64_t p1) {
  const PanelOutput out(job, m, p1);
  for (int64_t g0 = p0; g0 < p1; g0 += kBlockPanels) {
    BlockColumns(x, m, job, out, g0, static_cast<int>(std::min<int64_t>(kBlockPanels, p1 - g0)));
  }
  out.Flush();
}

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

}  // namespace mmserve::model::cpu::internal
