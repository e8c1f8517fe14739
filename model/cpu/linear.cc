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
// Cache blocks: a task owns kNb output columns; x is walked in kMb-row blocks
// and k in kKb steps, keeping an x block and a w block in L2.
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

// acc[i][j] (+)= x[i][0:kc] . w[j][0:kc], kept as 8 lanes in c8 (row stride
// c8_stride floats, 8 floats per (i, j)).
template <int MR, int NR, typename W>
void DotTile(const float* x, int64_t ldx, const W* w, int64_t ldw, int64_t kc, float* c8,
             int64_t c8_stride, bool first) {
  __m256 acc[MR][NR];
  _Pragma("GCC unroll 4") for (int i = 0; i < MR; ++i) {
    _Pragma("GCC unroll 4") for (int j = 0; j < NR; ++j) {
      acc[i][j] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(c8 + i * c8_stride + j * 8);
    }
  }
  int64_t k = 0;
  for (; k + 8 <= kc; k += 8) {
    __m256 wv[NR];
    _Pragma("GCC unroll 4") for (int j = 0; j < NR; ++j) wv[j] = LoadW(w + j * ldw + k);
    _Pragma("GCC unroll 4") for (int i = 0; i < MR; ++i) {
      __m256 xv = _mm256_loadu_ps(x + i * ldx + k);
      _Pragma("GCC unroll 4") for (int j = 0; j < NR; ++j) acc[i][j] =
          _mm256_fmadd_ps(xv, wv[j], acc[i][j]);
    }
  }
  if (k < kc) {
    int r = static_cast<int>(kc - k);
    __m256 wv[NR];
    _Pragma("GCC unroll 4") for (int j = 0; j < NR; ++j) wv[j] = LoadTail(w + j * ldw + k, r);
    _Pragma("GCC unroll 4") for (int i = 0; i < MR; ++i) {
      __m256 xv = LoadTail(x + i * ldx + k, r);
      _Pragma("GCC unroll 4") for (int j = 0; j < NR; ++j) acc[i][j] =
          _mm256_fmadd_ps(xv, wv[j], acc[i][j]);
    }
  }
  _Pragma("GCC unroll 4") for (int i = 0; i < MR; ++i) {
    _Pragma("GCC unroll 4") for (int j = 0; j < NR; ++j)
        _mm256_storeu_ps(c8 + i * c8_stride + j * 8, acc[i][j]);
  }
}

template <typename W>
using DotTileFn = void (*)(const float*, int64_t, const W*, int64_t, int64_t, float*, int64_t,
                           bool);

template <typename W, int MR>
constexpr std::array<DotTileFn<W>, kNr> RowOfTiles() {
  return {&DotTile<MR, 1, W>, &DotTile<MR, 2, W>, &DotTile<MR, 3, W>};
}

// kTiles<W>[mr - 1][nr - 1].
template <typename W>
const std::array<std::array<DotTileFn<W>, kNr>, kMr> kTiles = {
    RowOfTiles<W, 1>(), RowOfTiles<W, 2>(), RowOfTiles<W, 3>(), RowOfTiles<W, 4>()};

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
    for (int64_t k0 = 0; k0 < k_total; k0 += kKb) {
      const int64_t kc = std::min(kKb, k_total - k0);
      for (int64_t nt = 0; nt < nb; nt += kNr) {
        const int nr = static_cast<int>(std::min<int64_t>(kNr, nb - nt));
        const W* wt = w + (n0 + nt) * k_total + k0;
        for (int64_t mt = 0; mt < mb; mt += kMr) {
          const int mr = static_cast<int>(std::min<int64_t>(kMr, mb - mt));
          kTiles<W>[mr - 1][nr - 1](x + (m0 + mt) * k_total + k0, k_total, wt, k_total, kc,
                                    c8 + mt * c8_stride + nt * 8, c8_stride, k0 == 0);
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

template <typename W>
void DotLinear(ThreadPool& pool, const float* x, int64_t m, const WeightMatrix& w,
               const float* bias, float* y) {
  const W* wd = static_cast<const W*>(w.data);
  const int64_t n = w.rows;
  const int64_t blocks = (n + kNb - 1) / kNb;
  pool.ParallelFor(blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const int64_t n0 = b * kNb;
      DotColumns<W>(x, m, w.cols, wd, bias, y, n, n0, std::min(kNb, n - n0));
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
  CHECK(w.dtype == DType::kF32 || w.dtype == DType::kBF16)
      << "Linear supports F32 and BF16 weights, not " << DTypeName(w.dtype);
  if (m <= 0 || w.rows <= 0) return;
  if (kernel == LinearKernel::kOpenBlas) {
    BlasLinear(pool, x, m, w, bias, y);
  } else if (w.dtype == DType::kF32) {
    DotLinear<float>(pool, x, m, w, bias, y);
  } else {
    DotLinear<uint16_t>(pool, x, m, w, bias, y);
  }
}

}  // namespace mmserve::model::cpu
