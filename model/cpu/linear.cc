#include "model/cpu/linear.h"

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "common/logging.h"
#include "model/cpu/cpu_isa.h"
#include "model/cpu/linear_avx512.h"
#include "model/cpu/linear_bf16dot.h"
#include "model/cpu/linear_blas.h"
#include "model/cpu/linear_int4.h"
#include "model/cpu/linear_int8.h"
#include "model/cpu/panel_output.h"
#include "model/cpu/weight_memory.h"

namespace mmserve::model::cpu {
namespace {

// Register tile of the dot kernel: kMr rows of x by kNr rows of w, each an
// 8-lane accumulator (12 + 3 + 1 of the 16 ymm registers).
constexpr int kMr = 4;
constexpr int kNr = 3;
// A lone row (decode of one sequence) is memory bound: it streams kWideNr
// weight rows at once (13 registers), which keeps more loads in flight.
constexpr int kWideNr = 6;
// Cache blocks: a task owns kNb output columns; x is walked in kMb-row blocks
// and k in kKb steps. Within a block each 4-row x tile (8 KiB) stays in L1
// while the task's weight tiles stream past it from L2 (weights are the
// cheaper operand to re-read: 2 bytes per element in bf16, and 3 rows per
// tile against x's 4).
constexpr int64_t kNb = 48;
constexpr int64_t kMb = 64;
constexpr int64_t kKb = 512;

inline __m256 LoadW(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 LoadW(const uint16_t* p) {
  __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}

// The last r < 8 values of a row, zero-padded to 8 lanes. Adding 0 * 0 to a
// lane leaves it unchanged, so the padding does not perturb the sums.
inline __m256 LoadTail(const float* p, int r) {
  alignas(32) float tmp[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  std::memcpy(tmp, p, r * sizeof(float));
  return _mm256_load_ps(tmp);
}
inline __m256 LoadTail(const uint16_t* p, int r) {
  alignas(16) uint16_t tmp[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  std::memcpy(tmp, p, r * sizeof(uint16_t));
  return LoadW(tmp);
}

// acc[i][j] (+)= x[i][0:kc] . w[j][0:kc] for kc a multiple of 8, kept as 8
// lanes in c8 (row stride c8_stride floats, 8 floats per (i, j)); kFirst
// starts from zero instead of c8. The hot loop holds 12 accumulators, NR
// weight vectors and one x vector: 16 ymm registers for the 4 x 3 tile.
//
// Single-row tiles (MR == 1) are memory bound and read whole rows (kc == ldw):
// their NR rows are one contiguous run, and `ahead` is the start of the next
// tile's run, which they prefetch at the pace they consume their own (the
// rows are too short for the hardware prefetcher to ramp up on).
template <int MR, int NR, typename W, bool kFirst>
void DotTile(const float* x, int64_t ldx, const W* w, int64_t ldw, int64_t kc, float* c8,
             int64_t c8_stride, const char* ahead) {
  __m256 acc[MR][NR];
  _Pragma("GCC unroll 4") for (int i = 0; i < MR; ++i) {
    _Pragma("GCC unroll 4") for (int j = 0; j < NR; ++j) {
      acc[i][j] = kFirst ? _mm256_setzero_ps() : _mm256_loadu_ps(c8 + i * c8_stride + j * 8);
    }
  }
  for (int64_t k = 0; k < kc; k += 8) {
    if constexpr (MR == 1) {
      constexpr int kBytesPerStep = NR * 8 * sizeof(W);
      const char* p = ahead + k * NR * sizeof(W);
      _Pragma("GCC unroll 4") for (int b = 0; b < kBytesPerStep; b += 64) {
        _mm_prefetch(p + b, _MM_HINT_T0);
      }
    }
    __m256 wv[NR];
    _Pragma("GCC unroll 4") for (int j = 0; j < NR; ++j) wv[j] = LoadW(w + j * ldw + k);
    _Pragma("GCC unroll 4") for (int i = 0; i < MR; ++i) {
      const __m256 xv = _mm256_loadu_ps(x + i * ldx + k);
      _Pragma("GCC unroll 4") for (int j = 0; j < NR; ++j) {
        acc[i][j] = _mm256_fmadd_ps(xv, wv[j], acc[i][j]);
      }
    }
  }
  _Pragma("GCC unroll 4") for (int i = 0; i < MR; ++i) {
    _Pragma("GCC unroll 4") for (int j = 0; j < NR; ++j) {
      _mm256_storeu_ps(c8 + i * c8_stride + j * 8, acc[i][j]);
    }
  }
}

// Adds the last r < 8 values of each row as one more zero-padded chunk.
template <int MR, int NR, typename W>
void DotTail(const float* x, int64_t ldx, const W* w, int64_t ldw, int r, float* c8,
             int64_t c8_stride) {
  for (int i = 0; i < MR; ++i) {
    const __m256 xv = LoadTail(x + i * ldx, r);
    for (int j = 0; j < NR; ++j) {
      float* c = c8 + i * c8_stride + j * 8;
      _mm256_storeu_ps(c, _mm256_fmadd_ps(xv, LoadTail(w + j * ldw, r), _mm256_loadu_ps(c)));
    }
  }
}

template <typename W>
using DotTileFn = void (*)(const float*, int64_t, const W*, int64_t, int64_t, float*, int64_t,
                           const char*);
template <typename W>
using DotTailFn = void (*)(const float*, int64_t, const W*, int64_t, int, float*, int64_t);

// Function tables indexed [mr - 1][nr - 1].
template <typename W>
struct Tiles {
  template <int MR, bool kFirst>
  static constexpr std::array<DotTileFn<W>, kNr> Row() {
    return {&DotTile<MR, 1, W, kFirst>, &DotTile<MR, 2, W, kFirst>, &DotTile<MR, 3, W, kFirst>};
  }
  template <int MR>
  static constexpr std::array<DotTailFn<W>, kNr> TailRow() {
    return {&DotTail<MR, 1, W>, &DotTail<MR, 2, W>, &DotTail<MR, 3, W>};
  }
  static constexpr std::array<std::array<DotTileFn<W>, kNr>, kMr> kFirst = {
      Row<1, true>(), Row<2, true>(), Row<3, true>(), Row<4, true>()};
  static constexpr std::array<std::array<DotTileFn<W>, kNr>, kMr> kNext = {
      Row<1, false>(), Row<2, false>(), Row<3, false>(), Row<4, false>()};
  static constexpr std::array<std::array<DotTailFn<W>, kNr>, kMr> kTail = {
      TailRow<1>(), TailRow<2>(), TailRow<3>(), TailRow<4>()};
  // Single-row tiles, indexed [nr - 1].
  static constexpr std::array<DotTileFn<W>, kWideNr> kWideFirst = {
      &DotTile<1, 1, W, true>, &DotTile<1, 2, W, true>, &DotTile<1, 3, W, true>,
      &DotTile<1, 4, W, true>, &DotTile<1, 5, W, true>, &DotTile<1, 6, W, true>};
  static constexpr std::array<DotTileFn<W>, kWideNr> kWideNext = {
      &DotTile<1, 1, W, false>, &DotTile<1, 2, W, false>, &DotTile<1, 3, W, false>,
      &DotTile<1, 4, W, false>, &DotTile<1, 5, W, false>, &DotTile<1, 6, W, false>};
  static constexpr std::array<DotTailFn<W>, kWideNr> kWideTail = {
      &DotTail<1, 1, W>, &DotTail<1, 2, W>, &DotTail<1, 3, W>,
      &DotTail<1, 4, W>, &DotTail<1, 5, W>, &DotTail<1, 6, W>};
};

// The fixed reduction order promised in linear.h.
inline float SumLanes(const float* a) {
  float s0 = a[0] + a[4], s1 = a[1] + a[5], s2 = a[2] + a[6], s3 = a[3] + a[7];
  return (s0 + s2) + (s1 + s3);
}

// Columns [n0, n0 + nb) of y for every row.
template <typename W>
void DotColumns(const float* x, int64_t m, int64_t k_total, const W* w, const float* bias, float* y,
                int64_t ldy, int64_t n0, int64_t nb) {
  thread_local std::vector<float> c8_storage;
  c8_storage.resize(kMb * kNb * 8);
  float* c8 = c8_storage.data();
  const int64_t c8_stride = kNb * 8;
  for (int64_t m0 = 0; m0 < m; m0 += kMb) {
    const int64_t mb = std::min(kMb, m - m0);
    // One row has no x block to keep in cache: it reads whole weight rows.
    const int64_t kb = mb == 1 ? k_total : kKb;
    for (int64_t k0 = 0; k0 < k_total; k0 += kb) {
      const int64_t kc = std::min(kb, k_total - k0);
      const int64_t kc8 = kc / 8 * 8;  // the tail (k_total % 8) is in the last block
      // The tile shape changes only the grouping, never an element's sums.
      const int64_t step = mb == 1 ? kWideNr : kNr;
      for (int64_t mt = 0; mt < mb; mt += kMr) {
        const int mr = static_cast<int>(std::min<int64_t>(kMr, mb - mt));
        const float* xt = x + (m0 + mt) * k_total + k0;
        for (int64_t nt = 0; nt < nb; nt += step) {
          const int nr = static_cast<int>(std::min<int64_t>(step, nb - nt));
          const W* wt = w + (n0 + nt) * k_total + k0;
          float* ct = c8 + mt * c8_stride + nt * 8;
          DotTileFn<W> tile;
          DotTailFn<W> tail;
          if (mb == 1) {
            tile = (k0 == 0 ? Tiles<W>::kWideFirst : Tiles<W>::kWideNext)[nr - 1];
            tail = Tiles<W>::kWideTail[nr - 1];
          } else {
            tile = (k0 == 0 ? Tiles<W>::kFirst : Tiles<W>::kNext)[mr - 1][nr - 1];
            tail = Tiles<W>::kTail[mr - 1][nr - 1];
          }
          tile(xt, k_total, wt, k_total, kc8, ct, c8_stride,
               reinterpret_cast<const char*>(wt + nr * k_total));
          if (kc8 < kc) {
            tail(xt + kc8, k_total, wt + kc8, k_total, static_cast<int>(kc - kc8), ct, c8_stride);
          }
        }
      }
    }
    for (int64_t i = 0; i < mb; ++i) {
      float* yrow = y + (m0 + i) * ldy + n0;
      const float* crow = c8 + i * c8_stride;
      for (int64_t j = 0; j < nb; ++j) {
        float v = SumLanes(crow + j * 8);
        yrow[j] = bias != nullptr ? v + bias[n0 + j] : v;
      }
    }
  }
}

// ---- kPanels ----

// Panel kernel blocks: k in kPanelKb steps (a 6-row x tile of 6 KiB stays in
// L1 while the task's panels, 4 x 8 KiB, stay in L2), and tasks of
// kPanelsPerTask panels (64 output columns); both in linear_avx512.h.
using internal::kPanelKb;
using internal::kPanelsPerTask;
constexpr int kPanelMr = 6;
// One row reads kRowPanels panels at once: 8 independent chains cover the
// fused multiply-add latency and keep four weight streams in flight.
constexpr int kRowPanels = 4;

// The weight formats of the panel kernels: bf16, and fp32: a bf16 block
// widened once (WidenBlock) for all the row tiles that use it. (int8 panels
// have their own integer kernels, linear_int8.cc.)
enum class PanelFormat { kBf16, kF32 };

// One panel's weights as a tile reads them.
struct PanelSource {
  const void* panel = nullptr;  // k = 0 of the panel
};

inline void WidenPanelStep(const uint16_t* p, __m256i mask, __m256* lo, __m256* hi) {
  const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  *lo = _mm256_castsi256_ps(_mm256_slli_epi32(raw, 16));
  *hi = _mm256_castsi256_ps(_mm256_and_si256(raw, mask));
}

// Step k of a panel widened to fp32: rows 0-7 in lo, 8-15 in hi (bf16: the
// interleaved pairs, see PanelWeights).
template <PanelFormat F>
inline void LoadPanelStep(const void* panel, int64_t k, __m256i mask, __m256* lo, __m256* hi) {
  if constexpr (F == PanelFormat::kBf16) {
    WidenPanelStep(static_cast<const uint16_t*>(panel) + k * kPanelRows, mask, lo, hi);
  } else {
    *lo = _mm256_loadu_ps(static_cast<const float*>(panel) + k * kPanelRows);
    *hi = _mm256_loadu_ps(static_cast<const float*>(panel) + k * kPanelRows + 8);
  }
}

// c[i][0:16] (+)= x[i][k0:k0+kc] times the panel's 16 rows over the same k,
// for MR rows of x (row stride ldx, x points at k = 0) and c (row stride
// ldc); kFirst starts from 0. 12 accumulators, the widened panel step (2)
// and a broadcast x (1), plus the bf16 mask: the 16 ymm registers.
template <int MR, bool kFirst, PanelFormat F>
void PanelTile(const float* x, int64_t ldx, const PanelSource& src, int64_t k0, int64_t kc,
               float* c, int64_t ldc) {
  __m256 acc[MR][2];
  _Pragma("GCC unroll 8") for (int i = 0; i < MR; ++i) {
    acc[i][0] = kFirst ? _mm256_setzero_ps() : _mm256_loadu_ps(c + i * ldc);
    acc[i][1] = kFirst ? _mm256_setzero_ps() : _mm256_loadu_ps(c + i * ldc + 8);
  }
  const __m256i mask = _mm256_set1_epi32(static_cast<int>(0xFFFF0000u));
  const int64_t k_end = k0 + kc;
  for (int64_t k = k0; k < k_end; ++k) {
    __m256 lo, hi;
    LoadPanelStep<F>(src.panel, k, mask, &lo, &hi);
    _Pragma("GCC unroll 8") for (int i = 0; i < MR; ++i) {
      const __m256 xv = _mm256_broadcast_ss(x + i * ldx + k);
      acc[i][0] = _mm256_fmadd_ps(xv, lo, acc[i][0]);
      acc[i][1] = _mm256_fmadd_ps(xv, hi, acc[i][1]);
    }
  }
  _Pragma("GCC unroll 8") for (int i = 0; i < MR; ++i) {
    _mm256_storeu_ps(c + i * ldc, acc[i][0]);
    _mm256_storeu_ps(c + i * ldc + 8, acc[i][1]);
  }
}

using PanelTileFn = void (*)(const float*, int64_t, const PanelSource&, int64_t, int64_t, float*,
                             int64_t);
template <bool kFirst, PanelFormat F>
constexpr std::array<PanelTileFn, kPanelMr> PanelTiles() {
  return {&PanelTile<1, kFirst, F>, &PanelTile<2, kFirst, F>, &PanelTile<3, kFirst, F>,
          &PanelTile<4, kFirst, F>, &PanelTile<5, kFirst, F>, &PanelTile<6, kFirst, F>};
}

// One row of x against NP consecutive panels over the whole of k: c[p][0:16].
// Panel p's values are panel_stride elements after panel 0's.
template <int NP, PanelFormat F>
void PanelRow(const float* x, const PanelSource& src, int64_t k_total, float* c, int64_t ldc) {
  const uint16_t* base = static_cast<const uint16_t*>(src.panel);
  const int64_t panel_stride = k_total * kPanelRows;
  __m256 acc[NP][2];
  _Pragma("GCC unroll 8") for (int p = 0; p < NP; ++p) {
    acc[p][0] = _mm256_setzero_ps();
    acc[p][1] = _mm256_setzero_ps();
  }
  const __m256i mask = _mm256_set1_epi32(static_cast<int>(0xFFFF0000u));
  for (int64_t k = 0; k < k_total; ++k) {
    const __m256 xv = _mm256_broadcast_ss(x + k);
    _Pragma("GCC unroll 8") for (int p = 0; p < NP; ++p) {
      __m256 lo, hi;
      LoadPanelStep<F>(base + p * panel_stride, k, mask, &lo, &hi);
      acc[p][0] = _mm256_fmadd_ps(xv, lo, acc[p][0]);
      acc[p][1] = _mm256_fmadd_ps(xv, hi, acc[p][1]);
    }
  }
  _Pragma("GCC unroll 8") for (int p = 0; p < NP; ++p) {
    _mm256_storeu_ps(c + p * ldc, acc[p][0]);
    _mm256_storeu_ps(c + p * ldc + 8, acc[p][1]);
  }
}

using PanelRowFn = void (*)(const float*, const PanelSource&, int64_t, float*, int64_t);
template <PanelFormat F>
constexpr std::array<PanelRowFn, kRowPanels> PanelRows() {
  return {&PanelRow<1, F>, &PanelRow<2, F>, &PanelRow<3, F>, &PanelRow<4, F>};
}

int64_t NumPanels(const WeightMatrix& w) { return w.stored_rows() / kPanelRows; }

// Panel p of a bf16 w as the kernels read it.
PanelSource PanelAt(const WeightMatrix& w, int64_t p) {
  PanelSource src;
  src.panel = static_cast<const uint16_t*>(w.data) + p * w.cols * kPanelRows;
  return src;
}

// Steps [k0, k0 + kc) of a bf16 panel as the tiles see them (rows 0-7 then
// 8-15 of each step), into out[kc][16]: the same fp32 values the tile would
// widen in registers, so a tile over `out` computes bitwise what a tile over
// the panel does.
void WidenBlock(const PanelSource& src, int64_t k0, int64_t kc, float* out) {
  const __m256i mask = _mm256_set1_epi32(static_cast<int>(0xFFFF0000u));
  for (int64_t k = k0; k < k0 + kc; ++k) {
    __m256 lo, hi;
    LoadPanelStep<PanelFormat::kBf16>(src.panel, k, mask, &lo, &hi);
    _mm256_storeu_ps(out + (k - k0) * kPanelRows, lo);
    _mm256_storeu_ps(out + (k - k0) * kPanelRows + 8, hi);
  }
}

using internal::AddBias;

// Output columns of bf16 panels [p0, p1) of one job, for every row. Full
// panels write straight into y; a last partial panel goes through a 16-wide
// scratch from which its real columns are copied. The bias is added last,
// tile by tile.
void PanelColumns(const float* x, int64_t m, const LinearJob& job, int64_t p0, int64_t p1) {
  static constexpr std::array<PanelTileFn, kPanelMr> kFirstTiles =
      PanelTiles<true, PanelFormat::kBf16>();
  static constexpr std::array<PanelTileFn, kPanelMr> kNextTiles =
      PanelTiles<false, PanelFormat::kBf16>();
  static constexpr std::array<PanelRowFn, kRowPanels> kRowFns = PanelRows<PanelFormat::kBf16>();
  const WeightMatrix& w = *job.w;
  const int64_t k_total = w.cols;
  const internal::PanelOutput out(job, m, p1);
  // Rows [i0, i0 + rows) of panel p's outputs are final.
  auto finish = [&](int64_t p, int64_t i0, int rows) {
    int64_t ldc;
    float* c = out.At(p, &ldc);
    AddBias(c + i0 * ldc, ldc, rows, p * kPanelRows, out.Columns(p), job.bias);
  };
  if (m == 1) {
    for (int64_t p = p0; p < p1;) {
      // Full panels in groups of kRowPanels; the partial one alone.
      int np = static_cast<int>(std::min<int64_t>(kRowPanels, p1 - p));
      if (out.Partial(p + np - 1) && np > 1) --np;
      int64_t ldc;
      float* c = out.At(p, &ldc);
      (void)ldc;  // consecutive panels' columns are kPanelRows apart in y
      kRowFns[np - 1](x, PanelAt(w, p), k_total, c, kPanelRows);
      for (int q = 0; q < np; ++q) finish(p + q, 0, 1);
      p += np;
    }
  } else if (m <= kPanelMr) {
    // One row tile: each panel step is widened once anyway.
    for (int64_t k0 = 0; k0 < k_total; k0 += kPanelKb) {
      const int64_t kc = std::min(kPanelKb, k_total - k0);
      const auto& tiles = k0 == 0 ? kFirstTiles : kNextTiles;
      for (int64_t p = p0; p < p1; ++p) {
        int64_t ldc;
        float* c = out.At(p, &ldc);
        tiles[m - 1](x, k_total, PanelAt(w, p), k0, kc, c, ldc);
        if (k0 + kc == k_total) finish(p, 0, static_cast<int>(m));
      }
    }
  } else {
    // Several row tiles share each k block of the task's panels: widen the
    // block to fp32 once (kPanelsPerTask x 16 KiB, in L2) and run the tiles
    // on it, with no widening left in their inner loop.
    static constexpr std::array<PanelTileFn, kPanelMr> kF32First =
        PanelTiles<true, PanelFormat::kF32>();
    static constexpr std::array<PanelTileFn, kPanelMr> kF32Next =
        PanelTiles<false, PanelFormat::kF32>();
    thread_local std::vector<float> wide;
    wide.resize(static_cast<size_t>((p1 - p0) * kPanelKb * kPanelRows));
    for (int64_t k0 = 0; k0 < k_total; k0 += kPanelKb) {
      const int64_t kc = std::min(kPanelKb, k_total - k0);
      const bool last = k0 + kc == k_total;
      for (int64_t p = p0; p < p1; ++p) {
        WidenBlock(PanelAt(w, p), k0, kc, &wide[(p - p0) * kPanelKb * kPanelRows]);
      }
      const auto& tiles = k0 == 0 ? kF32First : kF32Next;
      for (int64_t i0 = 0; i0 < m; i0 += kPanelMr) {
        const int mr = static_cast<int>(std::min<int64_t>(kPanelMr, m - i0));
        for (int64_t p = p0; p < p1; ++p) {
          int64_t ldc;
          float* c = out.At(p, &ldc);
          PanelSource block;
          block.panel = &wide[(p - p0) * kPanelKb * kPanelRows];
          // The block holds steps k0.. from its start: x is offset to match.
          tiles[mr - 1](x + i0 * k_total + k0, k_total, block, 0, kc, c + i0 * ldc, ldc);
          if (last) finish(p, i0, mr);
        }
      }
    }
  }
  out.Flush();
}

// The panel kernels of the level in force, for one task.
void PanelTask(CpuIsa isa, const float* x, int64_t m, const LinearJob& job, int64_t p0,
               int64_t p1) {
  if (isa == CpuIsa::kAvx512 && m > 1) {
    thread_local std::vector<float> wide;
    wide.resize(static_cast<size_t>(kPanelsPerTask * kPanelKb * kPanelRows));
    internal::PanelColumnsAvx512(x, m, job, p0, p1, wide.data());
  } else {
    PanelColumns(x, m, job, p0, p1);
  }
}

// ---- kRows ----

// Every job's column blocks form one task list, so a step's q/k/v (or
// gate/up) projections share one parallel loop.
void DotLinear(ThreadPool& pool, const float* x, int64_t m, const std::vector<LinearJob>& jobs,
               int max_q) {
  // int8 layers take x quantized to int16 (kInt8Act: int8 in blocks of
  // kInt8ActBlock columns, as int4 layers always are), once for all of them.
  internal::QuantizedRows xq;
  internal::Int4Rows x4;
  for (const LinearJob& job : jobs) {
    const bool int4 = job.w->dtype == DType::kI4;
    if (int4 || job.w->dtype == DType::kI8) {
      xq = internal::QuantizeRows(pool, x, m, job.w->cols, max_q,
                                  max_q <= 127 ? internal::kInt8ActBlock : 0);
      if (int4) x4 = internal::PrepareInt4Rows(pool, xq, m, job.w->cols);
      break;
    }
  }
  // One level for the whole call, whatever a concurrent SetCpuIsa does.
  const CpuIsa isa = ActiveCpuIsa();
  // Panels per task: one row of int8 reads longer runs (fewer, longer
  // streams measured 15% faster; bf16's four-stream rows are best at 4).
  auto panels_per_task = [m](const WeightMatrix& w) {
    return m == 1 && w.dtype != DType::kBF16 ? internal::kRowPanelsPerTask : kPanelsPerTask;
  };
  std::vector<int64_t> first_task(jobs.size() + 1, 0);
  for (size_t j = 0; j < jobs.size(); ++j) {
    const WeightMatrix& w = *jobs[j].w;
    const int64_t ppt = panels_per_task(w);
    const int64_t tasks = w.layout == WeightLayout::kPanels ? (NumPanels(w) + ppt - 1) / ppt
                                                            : (w.rows + kNb - 1) / kNb;
    first_task[j + 1] = first_task[j] + tasks;
  }
  pool.ParallelFor(first_task.back(), 1, [&](int64_t begin, int64_t end) {
    size_t j = 0;
    for (int64_t b = begin; b < end; ++b) {
      while (b >= first_task[j + 1]) ++j;
      const LinearJob& job = jobs[j];
      const WeightMatrix& w = *job.w;
      const int64_t task = b - first_task[j];
      if (w.layout == WeightLayout::kPanels) {
        const int64_t ppt = panels_per_task(w);
        const int64_t p0 = task * ppt, p1 = std::min(NumPanels(w), p0 + ppt);
        if (w.dtype == DType::kI8) {
          internal::Int8PanelColumns(xq, m, job, p0, p1);
        } else if (w.dtype == DType::kI4) {
          internal::Int4PanelColumns(x4, m, job, p0, p1);
        } else {
          PanelTask(isa, x, m, job, p0, p1);
        }
        continue;
      }
      const int64_t n = w.rows, n0 = task * kNb;
      if (w.dtype == DType::kF32) {
        DotColumns(x, m, w.cols, static_cast<const float*>(w.data), job.bias, job.y, n, n0,
                   std::min(kNb, n - n0));
      } else {
        DotColumns(x, m, w.cols, static_cast<const uint16_t*>(w.data), job.bias, job.y, n, n0,
                   std::min(kNb, n - n0));
      }
    }
  });
}

}  // namespace

void PanelWeights::Free::operator()(uint16_t* p) const { std::free(p); }

PanelWeights PanelWeights::Pack(ThreadPool& pool, const WeightMatrix& w) {
  CHECK(w.dtype == DType::kBF16 && w.layout == WeightLayout::kRows)
      << "PanelWeights packs row-major BF16 matrices, not " << DTypeName(w.dtype);
  PanelWeights packed;
  packed.matrix_ = w;
  packed.matrix_.layout = WeightLayout::kPanels;
  const int64_t k = w.cols, panels = NumPanels(packed.matrix_);
  const size_t bytes = packed.matrix_.bytes();
  packed.data_.reset(static_cast<uint16_t*>(AllocateWeightMemory(bytes)));
  CHECK(packed.data_ != nullptr) << "out of memory packing " << bytes << " bytes";
  uint16_t* dst = packed.data_.get();
  const uint16_t* src = static_cast<const uint16_t*>(w.data);
  pool.ParallelFor(panels, 1, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      uint16_t* out = dst + p * k * kPanelRows;
      for (int64_t half = 0; half < 2; ++half) {
        for (int64_t l = 0; l < kPanelRows / 2; ++l) {
          const int64_t row = p * kPanelRows + half * (kPanelRows / 2) + l;
          const int64_t at = 2 * l + half;
          if (row >= w.rows) {
            for (int64_t kk = 0; kk < k; ++kk) out[kk * kPanelRows + at] = 0;
            continue;
          }
          const uint16_t* r = src + row * k;
          for (int64_t kk = 0; kk < k; ++kk) out[kk * kPanelRows + at] = r[kk];
        }
      }
    }
  });
  packed.matrix_.data = dst;
  return packed;
}

void WeightRowToF32(const WeightMatrix& w, int64_t row, float* out) {
  if (w.dtype == DType::kI8 || w.dtype == DType::kI4) {
    (w.dtype == DType::kI8 ? internal::Int8RowToF32 : internal::Int4RowToF32)(w, row, out);
    return;
  }
  if (w.layout == WeightLayout::kRows) {
    if (w.dtype == DType::kF32) {
      std::memcpy(out, static_cast<const float*>(w.data) + row * w.cols, w.cols * sizeof(float));
    } else if (w.dtype == DType::kF16) {
      const uint16_t* src = static_cast<const uint16_t*>(w.data) + row * w.cols;
      for (int64_t k = 0; k < w.cols; ++k) out[k] = F16ToF32(src[k]);
    } else {
      const uint16_t* src = static_cast<const uint16_t*>(w.data) + row * w.cols;
      for (int64_t k = 0; k < w.cols; ++k) out[k] = Bf16ToF32(src[k]);
    }
    return;
  }
  const int64_t l = row % kPanelRows;
  const uint16_t* src = static_cast<const uint16_t*>(w.data) +
                        (row / kPanelRows) * w.cols * kPanelRows + 2 * (l % (kPanelRows / 2)) +
                        l / (kPanelRows / 2);
  for (int64_t k = 0; k < w.cols; ++k) out[k] = Bf16ToF32(src[k * kPanelRows]);
}

void Linear(ThreadPool& pool, const float* x, int64_t m, const WeightMatrix& w, const float* bias,
            float* y, LinearKernel kernel) {
  LinearMany(pool, x, m, {{&w, bias, y}}, kernel);
}

void LinearMany(ThreadPool& pool, const float* x, int64_t m, const std::vector<LinearJob>& jobs,
                LinearKernel kernel) {
  for (const LinearJob& job : jobs) {
    CHECK(job.w->dtype == DType::kF32 || job.w->dtype == DType::kBF16 ||
          job.w->layout == WeightLayout::kPanels)
        << "Linear supports F32 and BF16 weights and int8 or int4 panels, not "
        << DTypeName(job.w->dtype);
    CHECK(job.w->layout == WeightLayout::kRows || job.w->dtype != DType::kF32);
    CHECK_EQ(job.w->cols, jobs[0].w->cols);
    CHECK((job.w->dtype == DType::kI4) == (jobs[0].w->dtype == DType::kI4));  // one x quantization
  }
  if (m <= 0 || jobs.empty()) return;
  if (jobs[0].w->dtype == DType::kI4) kernel = LinearKernel::kInt8Act;  // int4 takes int8 x
  if (kernel == LinearKernel::kBf16Dot) {
    internal::Bf16DotLinear(pool, x, m, jobs);
  } else if (kernel == LinearKernel::kOpenBlas) {
    for (const LinearJob& job : jobs) internal::BlasLinear(pool, x, m, *job.w, job.bias, job.y);
  } else {
    DotLinear(pool, x, m, jobs, kernel == LinearKernel::kInt8Act ? 127 : 32767);
  }
}

}  // namespace mmserve::model::cpu
