#include "model/cpu/linear_avx512.h"

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>

#include "model/cpu/panel_output.h"

namespace mmserve::model::cpu::internal {

// One vector add per 8 columns, in every path and at every level (AVX2
// code, outside the AVX-512 region below). Applied to each tile right
// after its last k block, while its outputs are in L1.
void AddBias(float* c, int64_t ldc, int rows, int64_t j0, int cols, const float* bias) {
  if (bias == nullptr) return;
  alignas(32) float b[kPanelRows] = {};
  std::memcpy(b, bias + j0, cols * sizeof(float));
  for (int i = 0; i < rows; ++i) {
    alignas(32) float v[kPanelRows] = {};
    std::memcpy(v, c + i * ldc, cols * sizeof(float));
    _mm256_store_ps(v, _mm256_add_ps(_mm256_load_ps(v), _mm256_load_ps(b)));
    _mm256_store_ps(v + 8, _mm256_add_ps(_mm256_load_ps(v + 8), _mm256_load_ps(b + 8)));
    std::memcpy(c + i * ldc, v, cols * sizeof(float));
  }
}

namespace {

// Rows of x per tile and panels per tile: 6 x 4 accumulators, 4 panel
// steps and a broadcast x are 29 of the 32 zmm registers. Per k step a tile
// issues 24 FMAs against 10 loads.
constexpr int kMr = 6;
constexpr int kNp = 4;
static_assert(kNp == kPanelsPerTask, "a multi-row tile covers a task's panels");
// The panels of one tile: where step 0 of each is, and where its outputs go.
struct TilePanels {
  const void* at[kNp] = {};
  float* c[kNp] = {};
  int64_t ldc[kNp] = {};
};

#include "model/cpu/avx512_region_begin.inc"

// Weights as a tile reads them: bf16 panels, widened in registers, or a
// block already widened to fp32. Either way a zmm holds one step's 16 rows
// in order.
enum class Format { kBf16, kF32 };
// All lanes: the maskz form of an intrinsic is then the plain instruction
// (GCC 12 warns about the undefined source of some unmasked intrinsics).
constexpr __mmask8 kAll = 0xFF;

// vpshufb control that widens a panel step loaded into both 256-bit halves:
// in the low half each pair's first row (the low word) moves up to the high
// word, in the high half its second row stays there; the rest are zeros.
inline __m512i Bf16PairsToRows() {
  alignas(64) static constexpr int8_t kControl[64] = {
      -1, -1, 0, 1, -1, -1, 4, 5, -1, -1, 8,  9,  -1, -1, 12, 13,   // rows 0-3
      -1, -1, 0, 1, -1, -1, 4, 5, -1, -1, 8,  9,  -1, -1, 12, 13,   // rows 4-7
      -1, -1, 2, 3, -1, -1, 6, 7, -1, -1, 10, 11, -1, -1, 14, 15,   // rows 8-11
      -1, -1, 2, 3, -1, -1, 6, 7, -1, -1, 10, 11, -1, -1, 14, 15};  // rows 12-15
  return _mm512_load_si512(kControl);
}

template <Format F>
inline __m512 LoadStep(const void* panel, int64_t k) {
  if constexpr (F == Format::kBf16) {
    const __m512i both = _mm512_maskz_broadcast_i64x4(
        kAll, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(
                  static_cast<const uint16_t*>(panel) + k * kPanelRows)));
    return _mm512_castsi512_ps(_mm512_shuffle_epi8(both, Bf16PairsToRows()));
  } else {
    return _mm512_loadu_ps(static_cast<const float*>(panel) + k * kPanelRows);
  }
}

// c[p][i][0:16] (+)= x[i][k0:k0+kc] times panel p's 16 rows over the same
// k, for MR rows of x (row stride ldx, x points at k = 0) and NP panels;
// kFirst starts from 0.
template <int MR, int NP, bool kFirst, Format F>
void Tile(const float* x, int64_t ldx, const TilePanels& tp, int64_t k0, int64_t kc) {
  __m512 acc[MR][NP];
  _Pragma("GCC unroll 8") for (int i = 0; i < MR; ++i) {
    _Pragma("GCC unroll 8") for (int p = 0; p < NP; ++p) {
      acc[i][p] = kFirst ? _mm512_setzero_ps() : _mm512_loadu_ps(tp.c[p] + i * tp.ldc[p]);
    }
  }
  const int64_t k_end = k0 + kc;
  for (int64_t k = k0; k < k_end; ++k) {
    __m512 w[NP];
    _Pragma("GCC unroll 8") for (int p = 0; p < NP; ++p) w[p] = LoadStep<F>(tp.at[p], k);
    _Pragma("GCC unroll 8") for (int i = 0; i < MR; ++i) {
      const __m512 xv = _mm512_set1_ps(x[i * ldx + k]);
      _Pragma("GCC unroll 8") for (int p = 0; p < NP; ++p) {
        acc[i][p] = _mm512_fmadd_ps(xv, w[p], acc[i][p]);
      }
    }
  }
  _Pragma("GCC unroll 8") for (int i = 0; i < MR; ++i) {
    _Pragma("GCC unroll 8") for (int p = 0; p < NP; ++p) {
      _mm512_storeu_ps(tp.c[p] + i * tp.ldc[p], acc[i][p]);
    }
  }
}

using TileFn = void (*)(const float*, int64_t, const TilePanels&, int64_t, int64_t);
using TileTable = std::array<std::array<TileFn, kNp>, kMr>;  // [mr - 1][np - 1]

template <int MR, bool kFirst, Format F>
constexpr std::array<TileFn, kNp> TileRow() {
  return {&Tile<MR, 1, kFirst, F>, &Tile<MR, 2, kFirst, F>, &Tile<MR, 3, kFirst, F>,
          &Tile<MR, 4, kFirst, F>};
}
template <bool kFirst, Format F>
constexpr TileTable Tiles() {
  return {TileRow<1, kFirst, F>(), TileRow<2, kFirst, F>(), TileRow<3, kFirst, F>(),
          TileRow<4, kFirst, F>(), TileRow<5, kFirst, F>(), TileRow<6, kFirst, F>()};
}

// Steps [k0, k0 + kc) of a bf16 panel widened to fp32 in row order, into
// out[kc][16]: exact, so a tile over `out` computes bitwise what a tile over
// the panel does.
void WidenBlock(const void* panel, int64_t k0, int64_t kc, float* out) {
  for (int64_t k = k0; k < k0 + kc; ++k) {
    _mm512_storeu_ps(out + (k - k0) * kPanelRows, LoadStep<Format::kBf16>(panel, k));
  }
}

void Columns(const float* x, int64_t m, const LinearJob& job, int64_t p0, int64_t p1, float* wide) {
  static constexpr TileTable kFirst = Tiles<true, Format::kBf16>();
  static constexpr TileTable kNext = Tiles<false, Format::kBf16>();
  static constexpr TileTable kF32First = Tiles<true, Format::kF32>();
  static constexpr TileTable kF32Next = Tiles<false, Format::kF32>();
  const WeightMatrix& w = *job.w;
  const int64_t k_total = w.cols, panel_stride = k_total * kPanelRows;
  const uint16_t* panels = static_cast<const uint16_t*>(w.data);
  const PanelOutput out(job, m, p1);
  const int np = static_cast<int>(p1 - p0);
  // The task's panels at rows [i0, ..) of their outputs; weights from `at`.
  auto tile_panels = [&](int64_t i0, auto at) {
    TilePanels tp;
    for (int q = 0; q < np; ++q) {
      tp.c[q] = out.At(p0 + q, &tp.ldc[q]);
      tp.c[q] += i0 * tp.ldc[q];
      tp.at[q] = at(q);
    }
    return tp;
  };
  auto finish = [&](int64_t i0, int rows) {
    for (int q = 0; q < np; ++q) {
      int64_t ldc;
      float* c = out.At(p0 + q, &ldc);
      AddBias(c + i0 * ldc, ldc, rows, (p0 + q) * kPanelRows, out.Columns(p0 + q), job.bias);
    }
  };
  auto bf16_panel = [&](int q) -> const void* { return panels + (p0 + q) * panel_stride; };
  if (m <= kMr) {
    // One row tile: each panel step is widened once anyway.
    const TilePanels tp = tile_panels(0, bf16_panel);
    for (int64_t k0 = 0; k0 < k_total; k0 += kPanelKb) {
      const int64_t kc = std::min(kPanelKb, k_total - k0);
      (k0 == 0 ? kFirst : kNext)[m - 1][np - 1](x, k_total, tp, k0, kc);
    }
    finish(0, static_cast<int>(m));
  } else {
    // Several row tiles share each k block: widen it to fp32 once (4 x 16
    // KiB, in L2) and run the tiles on it.
    auto block = [&](int q) -> const void* { return wide + q * kPanelKb * kPanelRows; };
    for (int64_t k0 = 0; k0 < k_total; k0 += kPanelKb) {
      const int64_t kc = std::min(kPanelKb, k_total - k0);
      for (int q = 0; q < np; ++q) {
        WidenBlock(bf16_panel(q), k0, kc, wide + q * kPanelKb * kPanelRows);
      }
      for (int64_t i0 = 0; i0 < m; i0 += kMr) {
        const int mr = static_cast<int>(std::min<int64_t>(kMr, m - i0));
        // The block holds steps k0.. from its start: x is offset to match.
        (k0 == 0 ? kF32First : kF32Next)[mr - 1][np - 1](x + i0 * k_total + k0, k_total,
                                                         tile_panels(i0, block), 0, kc);
        if (k0 + kc == k_total) finish(i0, mr);
      }
    }
  }
  out.Flush();
}

#include "model/cpu/avx512_region_end.inc"

}  // namespace

void PanelColumnsAvx512(const float* x, int64_t m, const LinearJob& job, int64_t p0, int64_t p1,
                        float* wide) {
  Columns(x, m, job, p0, p1, wide);
}

}  // namespace mmserve::model::cpu::internal
