#include "model/cpu/linear_bf16dot.h"

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cfloat>
#include <cmath>
#include <cstring>

#include "model/cpu/cpu_isa.h"
#include "model/cpu/linear_avx512.h"
#include "model/cpu/panel_output.h"
#include "model/dtype.h"

namespace mmserve::model::cpu::internal {
namespace {

// x rounded to bf16 pairs: row i's pair j is q[i * stride + j], the low half
// x[2j] and the high half x[2j + 1].
struct Bf16Rows {
  std::vector<uint32_t> q;
  int64_t stride = 0;  // pairs per row
};

uint16_t RoundToBf16(float f) {
  if (std::fpclassify(f) == FP_SUBNORMAL) f = std::copysign(0.0f, f);
  return F32ToBf16(f);
}

Bf16Rows PairRows(ThreadPool& pool, const float* x, int64_t m, int64_t cols) {
  Bf16Rows r;
  r.stride = (cols + 1) / 2;
  r.q.assign(static_cast<size_t>(m * r.stride), 0);
  auto rows = [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      for (int64_t k = 0; k < cols; ++k) {
        r.q[i * r.stride + k / 2] |= static_cast<uint32_t>(RoundToBf16(x[i * cols + k]))
                                     << (16 * (k % 2));
      }
    }
  };
  // A few rows are not worth waking the pool.
  if (m * cols < (1 << 15)) {
    rows(0, m);
  } else {
    pool.ParallelFor(m, 1, rows);
  }
  return r;
}

// Pair steps per cache block (256 k steps), rows and panels per tile.
constexpr int64_t kPairKb = kPanelKb / 2;
constexpr int kMr = 6;
constexpr int kNp = 4;

// Weight pairs of panel p, steps [2 j0, 2 (j0 + jc)), into out[jc][16]: row
// r's pair is (w[r][2j], w[r][2j + 1]) as one word, a zero past an odd k.
void PairBlockScalar(const uint16_t* panel, int64_t k_total, int64_t j0, int64_t jc,
                     uint32_t* out) {
  for (int64_t j = j0; j < j0 + jc; ++j) {
    for (int r = 0; r < kPanelRows; ++r) {
      const int at = r < 8 ? 2 * r : 2 * (r - 8) + 1;  // the kPanels pairs
      const uint32_t even = panel[2 * j * kPanelRows + at];
      const uint32_t odd = 2 * j + 1 < k_total ? panel[(2 * j + 1) * kPanelRows + at] : 0;
      out[(j - j0) * kPanelRows + r] = even | (odd << 16);
    }
  }
}

float Flush(float v) { return std::fabs(v) < FLT_MIN ? std::copysign(0.0f, v) : v; }
float Widen(uint32_t pair, int half) { return Flush(Bf16ToF32((pair >> (16 * half)) & 0xFFFF)); }

// The arithmetic of linear_bf16dot.h in scalar code: c[i][r] (+)= over the
// block's jc pair steps, for `rows` rows of x pairs (row stride ldx,
// pointing at the block's first pair) and one panel's block.
void TileScalar(const uint32_t* x, int64_t ldx, int rows, const uint32_t* block, int64_t jc,
                bool first, float* c, int64_t ldc) {
  for (int i = 0; i < rows; ++i) {
    for (int r = 0; r < kPanelRows; ++r) {
      float acc = first ? 0.0f : c[i * ldc + r];
      for (int64_t j = 0; j < jc; ++j) {
        const uint32_t xp = x[i * ldx + j], wp = block[j * kPanelRows + r];
        acc = Flush(std::fma(Widen(xp, 1), Widen(wp, 1), acc));
        acc = Flush(std::fma(Widen(xp, 0), Widen(wp, 0), acc));
      }
      c[i * ldc + r] = acc;
    }
  }
}

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))), \
                             apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512bf16")
#endif

// vpermw indices: from steps 2j (words 0-15) and 2j + 1 (words 16-31) of a
// panel, row r's pair lands in word pair (2r, 2r + 1).
inline __m512i PairIndex() {
  alignas(64) static constexpr uint16_t kIndex[32] = {0,  16, 2,  18, 4,  20, 6,  22, 8,  24, 10,
                                                      26, 12, 28, 14, 30, 1,  17, 3,  19, 5,  21,
                                                      7,  23, 9,  25, 11, 27, 13, 29, 15, 31};
  return _mm512_load_si512(kIndex);
}

void PairBlockAvx512(const uint16_t* panel, int64_t k_total, int64_t j0, int64_t jc,
                     uint32_t* out) {
  const __m512i index = PairIndex();
  for (int64_t j = j0; j < j0 + jc; ++j) {
    // The last step of an odd k has no partner: its half of the load is 0.
    const __mmask32 valid = 2 * j + 1 < k_total ? 0xFFFFFFFFu : 0xFFFFu;
    const __m512i steps = _mm512_maskz_loadu_epi16(valid, panel + 2 * j * kPanelRows);
    _mm512_storeu_si512(out + (j - j0) * kPanelRows,
                        _mm512_maskz_permutexvar_epi16(0xFFFFFFFFu, index, steps));
  }
}

// The tile of TileScalar for MR rows and NP panels (blocks jc * 16 words
// apart) on vdpbf16ps.
template <int MR, int NP>
void TileAvx512(const uint32_t* x, int64_t ldx, const uint32_t* blocks, int64_t block_stride,
                int64_t jc, bool first, float* const* c, const int64_t* ldc) {
  __m512 acc[MR][NP];
  _Pragma("GCC unroll 8") for (int i = 0; i < MR; ++i) {
    _Pragma("GCC unroll 4") for (int p = 0; p < NP; ++p) {
      acc[i][p] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(c[p] + i * ldc[p]);
    }
  }
  for (int64_t j = 0; j < jc; ++j) {
    __m512bh w[NP];
    _Pragma("GCC unroll 4") for (int p = 0; p < NP; ++p) {
      w[p] = reinterpret_cast<__m512bh>(
          _mm512_loadu_si512(blocks + p * block_stride + j * kPanelRows));
    }
    _Pragma("GCC unroll 8") for (int i = 0; i < MR; ++i) {
      const __m512bh xv =
          reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(x[i * ldx + j])));
      _Pragma("GCC unroll 4") for (int p = 0; p < NP; ++p) {
        acc[i][p] = _mm512_dpbf16_ps(acc[i][p], xv, w[p]);
      }
    }
  }
  _Pragma("GCC unroll 8") for (int i = 0; i < MR; ++i) {
    _Pragma("GCC unroll 4") for (int p = 0; p < NP; ++p) {
      _mm512_storeu_ps(c[p] + i * ldc[p], acc[i][p]);
    }
  }
}

// One row against NP panels (panel_stride words apart) over all pairs,
// re-pairing each step in registers: c[p][0:16] = the chains. NP up to 8
// keeps 8 independent chains in flight (a single row has no x block to
// share a widened block with).
template <int NP>
void RowAvx512(const uint32_t* x, int64_t pairs, const uint16_t* panel, int64_t panel_stride,
               int64_t k_total, float* const* c) {
  const __m512i index = PairIndex();
  __m512 acc[NP];
  _Pragma("GCC unroll 8") for (int p = 0; p < NP; ++p) acc[p] = _mm512_setzero_ps();
  for (int64_t j = 0; j < pairs; ++j) {
    const __mmask32 valid = 2 * j + 1 < k_total ? 0xFFFFFFFFu : 0xFFFFu;
    const __m512bh xv = reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(x[j])));
    _Pragma("GCC unroll 8") for (int p = 0; p < NP; ++p) {
      const __m512i steps =
          _mm512_maskz_loadu_epi16(valid, panel + p * panel_stride + 2 * j * kPanelRows);
      const __m512bh w =
          reinterpret_cast<__m512bh>(_mm512_maskz_permutexvar_epi16(0xFFFFFFFFu, index, steps));
      acc[p] = _mm512_dpbf16_ps(acc[p], xv, w);
    }
  }
  _Pragma("GCC unroll 8") for (int p = 0; p < NP; ++p) _mm512_storeu_ps(c[p], acc[p]);
}

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

using TileFn = void (*)(const uint32_t*, int64_t, const uint32_t*, int64_t, int64_t, bool,
                        float* const*, const int64_t*);
template <int MR>
constexpr std::array<TileFn, kNp> TileRow() {
  return {&TileAvx512<MR, 1>, &TileAvx512<MR, 2>, &TileAvx512<MR, 3>, &TileAvx512<MR, 4>};
}
constexpr std::array<std::array<TileFn, kNp>, kMr> kTiles = {
    TileRow<1>(), TileRow<2>(), TileRow<3>(), TileRow<4>(), TileRow<5>(), TileRow<6>()};

// Panels per task of a one-row call, and its tiles by panel count.
constexpr int kRowNp = 8;
using RowFn = void (*)(const uint32_t*, int64_t, const uint16_t*, int64_t, int64_t, float* const*);
constexpr std::array<RowFn, kRowNp> kRows = {&RowAvx512<1>, &RowAvx512<2>, &RowAvx512<3>,
                                             &RowAvx512<4>, &RowAvx512<5>, &RowAvx512<6>,
                                             &RowAvx512<7>, &RowAvx512<8>};

// One row, panels [p0, p1) (at most kRowNp) of one job, on vdpbf16ps.
void RowColumns(const Bf16Rows& x, const LinearJob& job, int64_t p0, int64_t p1) {
  const WeightMatrix& w = *job.w;
  const PanelOutput out(job, 1, p1);
  const int np = static_cast<int>(p1 - p0);
  float* c[kRowNp];
  int64_t ldc;
  for (int q = 0; q < np; ++q) c[q] = out.At(p0 + q, &ldc);
  const int64_t panel_stride = w.cols * kPanelRows;
  kRows[np - 1](x.q.data(), x.stride, static_cast<const uint16_t*>(w.data) + p0 * panel_stride,
                panel_stride, w.cols, c);
  for (int q = 0; q < np; ++q) {
    AddBias(c[q], ldc, 1, (p0 + q) * kPanelRows, out.Columns(p0 + q), job.bias);
  }
  out.Flush();
}

// Output columns of panels [p0, p1) (at most kNp) of one job, all m rows.
void Columns(const Bf16Rows& x, int64_t m, const LinearJob& job, int64_t p0, int64_t p1,
             bool avx512) {
  const WeightMatrix& w = *job.w;
  const int64_t k_total = w.cols, pairs = x.stride;
  const uint16_t* panels = static_cast<const uint16_t*>(w.data);
  const PanelOutput out(job, m, p1);
  const int np = static_cast<int>(p1 - p0);
  thread_local std::vector<uint32_t> block;
  block.resize(static_cast<size_t>(kNp * kPairKb * kPanelRows));
  for (int64_t j0 = 0; j0 < pairs; j0 += kPairKb) {
    const int64_t jc = std::min(kPairKb, pairs - j0);
    const int64_t stride = jc * kPanelRows;
    for (int q = 0; q < np; ++q) {
      const uint16_t* panel = panels + (p0 + q) * k_total * kPanelRows;
      (avx512 ? PairBlockAvx512 : PairBlockScalar)(panel, k_total, j0, jc, &block[q * stride]);
    }
    for (int64_t i0 = 0; i0 < m; i0 += kMr) {
      const int mr = static_cast<int>(std::min<int64_t>(kMr, m - i0));
      float* c[kNp];
      int64_t ldc[kNp];
      for (int q = 0; q < np; ++q) c[q] = out.At(p0 + q, &ldc[q]) + i0 * ldc[q];
      const uint32_t* xt = &x.q[i0 * x.stride + j0];
      if (avx512) {
        kTiles[mr - 1][np - 1](xt, x.stride, block.data(), stride, jc, j0 == 0, c, ldc);
      } else {
        for (int q = 0; q < np; ++q) {
          TileScalar(xt, x.stride, mr, &block[q * stride], jc, j0 == 0, c[q], ldc[q]);
        }
      }
      if (j0 + jc < pairs) continue;
      for (int q = 0; q < np; ++q) {
        AddBias(c[q], ldc[q], mr, (p0 + q) * kPanelRows, out.Columns(p0 + q), job.bias);
      }
    }
  }
  out.Flush();
}

}  // namespace

bool Bf16DotUsesAvx512() {
  return ActiveCpuIsa() == CpuIsa::kAvx512 && DetectedCpuFeatures().avx512_bf16;
}

void Bf16DotLinear(ThreadPool& pool, const float* x, int64_t m,
                   const std::vector<LinearJob>& jobs) {
  std::vector<LinearJob> others, panels;
  for (const LinearJob& job : jobs) {
    const bool bf16_panels = job.w->dtype == DType::kBF16 && job.w->layout == WeightLayout::kPanels;
    (bf16_panels ? panels : others).push_back(job);
  }
  if (!others.empty()) LinearMany(pool, x, m, others, LinearKernel::kDot);
  if (panels.empty()) return;
  const Bf16Rows xq = PairRows(pool, x, m, panels[0].w->cols);
  const bool avx512 = Bf16DotUsesAvx512();
  const bool row = avx512 && m == 1;
  const int64_t per_task = row ? kRowNp : kNp;
  std::vector<int64_t> first_task(panels.size() + 1, 0);
  for (size_t j = 0; j < panels.size(); ++j) {
    const int64_t num_panels = panels[j].w->stored_rows() / kPanelRows;
    first_task[j + 1] = first_task[j] + (num_panels + per_task - 1) / per_task;
  }
  pool.ParallelFor(first_task.back(), 1, [&](int64_t begin, int64_t end) {
    size_t j = 0;
    for (int64_t b = begin; b < end; ++b) {
      while (b >= first_task[j + 1]) ++j;
      const int64_t p0 = (b - first_task[j]) * per_task;
      const int64_t p1 = std::min(panels[j].w->stored_rows() / kPanelRows, p0 + per_task);
      if (row) {
        RowColumns(xq, panels[j], p0, p1);
      } else {
        Columns(xq, m, panels[j], p0, p1, avx512);
      }
    }
  });
}

}  // namespace mmserve::model::cpu::internal
