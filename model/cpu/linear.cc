#include "model/cpu/linear.h"

#include <cblas.h>
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <mutex>
#include <vector>

#include "common/logging.h"

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

// Every job's column blocks form one task list, so a step's q/k/v (or
// gate/up) projections share one parallel loop.
void DotLinear(ThreadPool& pool, const float* x, int64_t m, const std::vector<LinearJob>& jobs) {
  std::vector<int64_t> first_block(jobs.size() + 1, 0);
  for (size_t j = 0; j < jobs.size(); ++j) {
    first_block[j + 1] = first_block[j] + (jobs[j].w->rows + kNb - 1) / kNb;
  }
  pool.ParallelFor(first_block.back(), 1, [&](int64_t begin, int64_t end) {
    size_t j = 0;
    for (int64_t b = begin; b < end; ++b) {
      while (b >= first_block[j + 1]) ++j;
      const LinearJob& job = jobs[j];
      const int64_t n = job.w->rows, n0 = (b - first_block[j]) * kNb;
      if (job.w->dtype == DType::kF32) {
        DotColumns(x, m, job.w->cols, static_cast<const float*>(job.w->data), job.bias, job.y, n,
                   n0, std::min(kNb, n - n0));
      } else {
        DotColumns(x, m, job.w->cols, static_cast<const uint16_t*>(job.w->data), job.bias, job.y, n,
                   n0, std::min(kNb, n - n0));
      }
    }
  });
}

void BlasLinear(ThreadPool& pool, const float* x, int64_t m, const WeightMatrix& w,
                const float* bias, float* y) {
  static std::once_flag once;
  // The pool supplies the parallelism; OpenBLAS's own threads would fight it.
  std::call_once(once, [] { openblas_set_num_threads(1); });
  const int64_t n = w.rows, k = w.cols;
  // bf16 panels are widened into ~128 KiB of fp32 per call.
  const int64_t nb = w.dtype == DType::kF32
                         ? 256
                         : std::max<int64_t>(16, std::min<int64_t>(256, (32768 / k) / 16 * 16));
  const int64_t blocks = (n + nb - 1) / nb;
  pool.ParallelFor(blocks, 1, [&](int64_t begin, int64_t end) {
    thread_local std::vector<float> panel;
    for (int64_t b = begin; b < end; ++b) {
      const int64_t n0 = b * nb, cols = std::min(nb, n - n0);
      const float* wp;
      if (w.dtype == DType::kF32) {
        wp = static_cast<const float*>(w.data) + n0 * k;
      } else {
        panel.resize(cols * k);
        const uint16_t* src = static_cast<const uint16_t*>(w.data) + n0 * k;
        for (int64_t i = 0; i < cols * k; ++i) panel[i] = Bf16ToF32(src[i]);
        wp = panel.data();
      }
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m),
                  static_cast<int>(cols), static_cast<int>(k), 1.0f, x, static_cast<int>(k), wp,
                  static_cast<int>(k), 0.0f, y + n0, static_cast<int>(n));
      if (bias != nullptr) {
        for (int64_t i = 0; i < m; ++i) {
          for (int64_t j = 0; j < cols; ++j) y[i * n + n0 + j] += bias[n0 + j];
        }
      }
    }
  });
}

}  // namespace

void Linear(ThreadPool& pool, const float* x, int64_t m, const WeightMatrix& w, const float* bias,
            float* y, LinearKernel kernel) {
  LinearMany(pool, x, m, {{&w, bias, y}}, kernel);
}

void LinearMany(ThreadPool& pool, const float* x, int64_t m, const std::vector<LinearJob>& jobs,
                LinearKernel kernel) {
  for (const LinearJob& job : jobs) {
    CHECK(job.w->dtype == DType::kF32 || job.w->dtype == DType::kBF16)
        << "Linear supports F32 and BF16 weights, not " << DTypeName(job.w->dtype);
    CHECK_EQ(job.w->cols, jobs[0].w->cols);
  }
  if (m <= 0 || jobs.empty()) return;
  if (kernel == LinearKernel::kOpenBlas) {
    for (const LinearJob& job : jobs) BlasLinear(pool, x, m, *job.w, job.bias, job.y);
  } else {
    DotLinear(pool, x, m, jobs);
  }
}

}  // namespace mmserve::model::cpu
