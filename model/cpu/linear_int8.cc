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
#include "model/cpu/linear_int8_act.h"
#include "model/cpu/panel_output.h"
#include "model/cpu/weight_memory.h"

namespace mmserve::model::cpu {
namespace internal {
namespace {

constexpr int64_t kSegment = kInt8Segment;
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

// The x scales a tile multiplies its segments by: with activation blocks
// (block > 0), row i's block b has scale[i * stride + b]; without, the row
// scale is left to Finish.
struct ActScales {
  const float* scale = nullptr;
  int64_t stride = 0;
  int64_t block = 0;
};

using TileFn = void (*)(const int16_t*, int64_t, const ActScales&, const Panels&, int64_t, int64_t,
                        float*, int64_t);

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

// The last operations of an output element, alike in every path, as
// separate vector roundings: y = c * s_row (one scale per output row only),
// then * s_x (the x row's scale; not with activation blocks, sx nullptr),
// then + bias; on `cols` <= 16 columns from column j0, for `rows` rows of c
// (row stride ldc) whose x scales are sx.
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
    const __m256 xs = _mm256_set1_ps(sx != nullptr ? sx[i] : 1.0f);
    _Pragma("GCC unroll 2") for (int h = 0; h < 2; ++h) {
      __m256 r = _mm256_load_ps(v + h * 8);
      if (scales != nullptr) r = _mm256_mul_ps(r, _mm256_load_ps(s + h * 8));
      if (sx != nullptr) r = _mm256_mul_ps(r, xs);
      if (bias != nullptr) r = _mm256_add_ps(r, _mm256_load_ps(b + h * 8));
      _mm256_store_ps(v + h * 8, r);
    }
    std::memcpy(c + i * ldc, v, cols * sizeof(float));
  }
}

// Row i0's activation scales as a tile reads them.
ActScales RowScales(const QuantizedRows& x, int64_t i0) {
  return {x.scale + i0 * x.scale_stride, x.scale_stride, x.block};
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

// Quantizes x[0:n] into q[0:n] with one scale (QuantizeRows' rule).
void QuantizeSpan(const float* x, int64_t n, int16_t* q, float* scale, int max_q) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  __m256 vmax = _mm256_setzero_ps(), unordered = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 8 <= n; k += 8) {
    const __m256 v = _mm256_loadu_ps(x + k);
    vmax = _mm256_max_ps(vmax, _mm256_and_ps(v, abs_mask));
    unordered = _mm256_or_ps(unordered, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, vmax);
  float amax = 0;
  for (float l : lanes) amax = std::max(amax, l);
  bool nan = _mm256_movemask_ps(unordered) != 0;
  for (int64_t t = k; t < n; ++t) {
    amax = std::max(amax, std::fabs(x[t]));
    nan = nan || std::isnan(x[t]);
  }
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
  for (; k + 16 <= n; k += 16) {
    // Round to nearest even (the default MXCSR mode), saturate to int16.
    const __m256i a = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + k), vinv));
    const __m256i b = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + k + 8), vinv));
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packs_epi32(a, b), 0xD8);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + k), packed);
  }
  for (; k < n; ++k) {
    const float v = std::nearbyint(x[k] * inv);
    q[k] = static_cast<int16_t>(std::min(top, std::max(-top, v)));
  }
}

// One row of x: q zero-padded to stride, one scale per block (0: one).
void QuantizeRow(const float* x, int64_t cols, int16_t* q, int64_t stride, float* scale, int max_q,
                 int64_t block) {
  std::memset(q, 0, stride * sizeof(int16_t));
  const int64_t step = block > 0 ? block : cols;
  for (int64_t b = 0; b * step < cols; ++b) {
    const int64_t k = b * step;
    QuantizeSpan(x + k, std::min(step, cols - k), q + k, scale + b, max_q);
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

QuantizedRows QuantizeRows(ThreadPool& pool, const float* x, int64_t m, int64_t cols, int max_q,
                           int64_t block) {
  CHECK(block >= 0 && block % 4 == 0 && (block == 0 || kSegment % block == 0))
      << "activation blocks must be a multiple of 4 that divides " << kSegment << ": " << block;
  if (block >= cols) block = 0;  // one block per row is per-row
  thread_local std::vector<int16_t> q;
  thread_local std::vector<float> scale;
  thread_local std::vector<uint8_t> u8;
  const int64_t stride = (cols + 15) / 16 * 16;
  const int64_t scale_stride = block > 0 ? (cols + block - 1) / block : 1;
  const bool int8 = max_q <= 127;
  q.resize(static_cast<size_t>(m * stride));
  scale.resize(static_cast<size_t>(m * scale_stride));
  u8.resize(int8 ? q.size() : 0);
  // The storage is this thread's (thread_local): workers see it through
  // these pointers.
  int16_t* qp = q.data();
  float* sp = scale.data();
  uint8_t* u8p = u8.data();
  auto rows = [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      QuantizeRow(x + i * cols, cols, qp + i * stride, stride, sp + i * scale_stride, max_q, block);
      if (int8) OffsetBytes(qp + i * stride, stride, u8p + i * stride);
    }
  };
  // A few rows are not worth waking the pool.
  if (m * cols < (1 << 15)) {
    rows(0, m);
  } else {
    pool.ParallelFor(m, 1, rows);
  }
  QuantizedRows out{qp, stride, sp, block, scale_stride};
  if (int8) out.u8 = u8p;
  return out;
}

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
    Finish(c + i0 * ldc, ldc, rows, x.block > 0 ? nullptr : x.scale + i0, p * kPanelRows,
           out.Columns(p), row_scales, job.bias);
  };
  // One row runs the pair kernels below, which stream their panels with
  // prefetching: on the same exact sums as vpdpbusd, so the same results.
  if (m > 1 && x.u8 != nullptr && w.group % 4 == 0 && Int8ActUsesVnni512()) {
    Int8ActPanelColumns(x, m, job, p0, p1);
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
      (vnni ? vnni::Tile<1, 1> : avx2::Tile<1, 1>)(x.q, x.stride, RowScales(x, 0), PanelsAt(w, p),
                                                   0, kp, c, ldc);
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
          tiles[mr - 1](x.q + i0 * x.stride, x.stride, RowScales(x, i0), PanelsAt(w, p), k0, k1,
                        c + i0 * ldc, ldc);
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
