#include "model/cpu/paged_attention.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/logging.h"
#include "model/cpu/cpu_isa.h"
#include "model/cpu/exp8.h"
#include "model/cpu/paged_attention_tile.h"

namespace mmserve::model::cpu {
namespace {

using internal::QueryTile;
using internal::TileScratch;

// Queries per work item that the vector path aims for: enough to reuse each
// key and value load many times from L1, few enough that their scores (one
// row of floats per query) and outputs stay near the core.
constexpr int64_t kTileQueries = 28;
// Register tiles (16 ymm registers, AVX2): scoring runs 2 queries x 4 keys
// (8 accumulators), weighing 3 queries x 4 output vectors (12).
constexpr int kScoreQueries = 2;
constexpr int kValueQueries = 3;
constexpr int kValueVectors = 4;

// e^x for x <= 0 (scores minus their maximum), 8 lanes (exp8.h); 0 below
// -87.3, where e^x leaves the normal range, and for -inf.
inline __m256 ExpNonPositive(__m256 x) {
  const __m256 lowest = _mm256_set1_ps(-87.3f);
  const __m256 valid = _mm256_cmp_ps(x, lowest, _CMP_GE_OQ);
  x = _mm256_max_ps(x, lowest);
  return _mm256_and_ps(internal::Exp8InRange(x), valid);
}

// The 8 lane sums of a[0..7] in one vector, each ((l0+l1)+(l2+l3)) +
// ((l4+l5)+(l6+l7)) whatever its slot.
inline __m256 SumLanes8(const __m256* a) {
  const __m256 u0 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
  const __m256 u1 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

inline float HorizontalSum(__m256 v) {
  alignas(32) float l[8];
  _mm256_store_ps(l, v);
  return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}

inline float HorizontalMax(__m256 v) {
  alignas(32) float l[8];
  _mm256_store_ps(l, v);
  return std::max(std::max(std::max(l[0], l[1]), std::max(l[2], l[3])),
                  std::max(std::max(l[4], l[5]), std::max(l[6], l[7])));
}

// Keeps a loaded vector in a register: without this, GCC folds the load into
// each FMA that uses it, which costs one load per FMA where one per several
// would do (loads, not FMAs, then bound the kernel).
inline void InRegister(__m256& v) { asm("" : "+x"(v)); }

// a . b over n floats in a fixed order: 8 lanes, then a fixed tree.
inline float Dot(const float* a, const float* b, int64_t n) {
  int64_t i = 0;
  float sum = 0.0f;
  if (n >= 8) {
    __m256 acc = _mm256_setzero_ps();
    for (; i + 8 <= n; i += 8) {
      acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
    }
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    sum = _mm_cvtss_f32(s);
  }
  for (; i < n; ++i) sum = std::fma(a[i], b[i], sum);
  return sum;
}

// y += a * x over n floats.
inline void Axpy(float a, const float* x, float* y, int64_t n) {
  int64_t i = 0;
  const __m256 av = _mm256_set1_ps(a);
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  }
  for (; i < n; ++i) y[i] = std::fma(a, x[i], y[i]);
}

// Any head_dim, one query and one key at a time with a scalar exp.
void AttendTileScalar(const QueryTile& t, const PagedKvLayer& kv, float scale, TileScratch& x) {
  std::vector<float>& scores = x.scores;
  const int64_t hd = kv.head_dim;
  const float* key = kv.key + t.kv_head * hd;
  const float* value = kv.value + t.kv_head * hd;
  for (int64_t r = 0; r < t.rows; ++r) {
    const int64_t num_keys = t.first_keys + r;
    scores.resize(num_keys);
    for (int64_t h = t.first_head; h < t.first_head + t.group; ++h) {
      const float* qh = t.q + r * t.row_stride + h * hd;
      float max_score = -INFINITY;
      for (int64_t j = 0; j < num_keys; ++j) {
        const float s = Dot(qh, key + t.key_offset[j], hd) * scale;
        scores[j] = s;
        max_score = std::max(max_score, s);
      }
      float sum = 0.0f;
      for (int64_t j = 0; j < num_keys; ++j) {
        scores[j] = std::exp(scores[j] - max_score);
        sum += scores[j];
      }
      const float inv = 1.0f / sum;
      float* oh = t.out + r * t.row_stride + h * hd;
      std::fill(oh, oh + hd, 0.0f);
      for (int64_t j = 0; j < num_keys; ++j) Axpy(scores[j] * inv, value + t.key_offset[j], oh, hd);
    }
  }
}

// Scores of 8 keys for QM queries: per (query, key) one 8-lane FMA chain over
// head_dim in order, then SumLanes8 and the scale. This is exactly the
// arithmetic of a single query's scoring, so sharing the key loads between
// queries changes nothing in any query's result. Keys go 4 at a time to keep
// 4 x QM accumulators, QM query vectors and one key vector in 16 registers.
template <int NC, int QM>
inline void ScoreKeys8(const float* const* qs, const float* const* kp, __m256 scale,
                       float* const* s) {
  // SumLanes8's first two hadd levels as soon as each half's 4 chains end.
  __m256 half[QM][2];
  _Pragma("GCC unroll 2") for (int h = 0; h < 2; ++h) {
    __m256 a[QM][4];
    _Pragma("GCC unroll 8") for (int m = 0; m < QM; ++m) {
      _Pragma("GCC unroll 8") for (int t = 0; t < 4; ++t) a[m][t] = _mm256_setzero_ps();
    }
    _Pragma("GCC unroll 16") for (int c = 0; c < NC; ++c) {
      __m256 qv[QM];
      _Pragma("GCC unroll 8") for (int m = 0; m < QM; ++m) qv[m] = _mm256_loadu_ps(qs[m] + 8 * c);
      _Pragma("GCC unroll 8") for (int t = 0; t < 4; ++t) {
        __m256 k = _mm256_loadu_ps(kp[4 * h + t] + 8 * c);
        InRegister(k);
        _Pragma("GCC unroll 8") for (int m = 0; m < QM; ++m) {
          a[m][t] = _mm256_fmadd_ps(qv[m], k, a[m][t]);
        }
      }
    }
    _Pragma("GCC unroll 8") for (int m = 0; m < QM; ++m) {
      half[m][h] =
          _mm256_hadd_ps(_mm256_hadd_ps(a[m][0], a[m][1]), _mm256_hadd_ps(a[m][2], a[m][3]));
    }
  }
  _Pragma("GCC unroll 8") for (int m = 0; m < QM; ++m) {
    const __m256 u0 = half[m][0], u1 = half[m][1];
    const __m256 sum =
        _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
    _mm256_storeu_ps(s[m], _mm256_mul_ps(sum, scale));
  }
}

// out[m][8 * c0 ..][8 * CC floats] += p[m][j] * value j for j in [begin, end),
// QM queries sharing each value load. Per query and lane this is the chain
// o = fma(p_j, v_j, o) in key order, as for a query alone.
template <int QM, int CC>
inline void WeighValues(const float* const* p, float* const* o, const float* value,
                        const int64_t* key_offset, int64_t begin, int64_t end) {
  __m256 acc[QM][CC];
  _Pragma("GCC unroll 8") for (int m = 0; m < QM; ++m) {
    _Pragma("GCC unroll 8") for (int c = 0; c < CC; ++c) acc[m][c] = _mm256_loadu_ps(o[m] + 8 * c);
  }
  for (int64_t j = begin; j < end; ++j) {
    const float* vp = value + key_offset[j];
    __m256 pv[QM];
    _Pragma("GCC unroll 8") for (int m = 0; m < QM; ++m) pv[m] = _mm256_broadcast_ss(p[m] + j);
    _Pragma("GCC unroll 8") for (int c = 0; c < CC; ++c) {
      __m256 v = _mm256_loadu_ps(vp + 8 * c);
      InRegister(v);
      _Pragma("GCC unroll 8") for (int m = 0; m < QM; ++m) {
        acc[m][c] = _mm256_fmadd_ps(pv[m], v, acc[m][c]);
      }
    }
  }
  _Pragma("GCC unroll 8") for (int m = 0; m < QM; ++m) {
    _Pragma("GCC unroll 8") for (int c = 0; c < CC; ++c) _mm256_storeu_ps(o[m] + 8 * c, acc[m][c]);
  }
}

// Scores of every query of the tile against keys [0, last_keys), 8 keys at a
// time, kScoreQueries queries sharing each key load. Keys past a query's own
// range (in its last group of 8, or the tile's later rows) are scored too and
// masked later; a group of 8 entirely past a query's keys is skipped for it.
template <int NC>
void ScoreTile(const QueryTile& t, float scale, int64_t stride, const float* key, TileScratch& x) {
  const int64_t count = t.rows * t.group;
  const int64_t last_keys = t.first_keys + t.rows - 1;
  const __m256 scale_v = _mm256_set1_ps(scale);
  for (int64_t j0 = 0; j0 < last_keys; j0 += 8) {
    const float* kp[8];
    for (int u = 0; u < 8; ++u) kp[u] = key + t.key_offset[std::min(j0 + u, last_keys - 1)];
    // Row r sees key j0 iff first_keys + r > j0 (rows ascend, so a prefix skips).
    int64_t m = std::max<int64_t>(0, j0 - t.first_keys + 1) * t.group;
    float* s[kScoreQueries];
    for (; m + kScoreQueries <= count; m += kScoreQueries) {
      for (int i = 0; i < kScoreQueries; ++i) s[i] = x.scores.data() + (m + i) * stride + j0;
      ScoreKeys8<NC, kScoreQueries>(&x.query[m], kp, scale_v, s);
    }
    for (; m < count; ++m) {
      s[0] = x.scores.data() + m * stride + j0;
      ScoreKeys8<NC, 1>(&x.query[m], kp, scale_v, s);
    }
  }
}

// Turns one query's scores s[0, num_keys) into probabilities in place: the
// lanes past num_keys in the last group of 8 become -inf, then the maximum,
// e^(s - max) with the 8-lane polynomial, their sum over groups of 8 in
// order, and each e times 1 / sum (normalized before weighting V, as HF).
inline void Softmax(float* s, int64_t num_keys) {
  const int64_t padded = (num_keys + 7) / 8 * 8;
  const __m256 minus_inf = _mm256_set1_ps(-INFINITY);
  if (padded != num_keys) {
    const int64_t j0 = padded - 8;
    const __m256 lane = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256 live = _mm256_set1_ps(static_cast<float>(num_keys - j0));
    _mm256_storeu_ps(s + j0, _mm256_blendv_ps(minus_inf, _mm256_loadu_ps(s + j0),
                                              _mm256_cmp_ps(lane, live, _CMP_LT_OQ)));
  }
  __m256 max_v = minus_inf;
  for (int64_t j0 = 0; j0 < padded; j0 += 8) max_v = _mm256_max_ps(max_v, _mm256_loadu_ps(s + j0));
  const __m256 max_score = _mm256_set1_ps(HorizontalMax(max_v));
  __m256 sum_v = _mm256_setzero_ps();
  for (int64_t j0 = 0; j0 < padded; j0 += 8) {
    const __m256 e = ExpNonPositive(_mm256_sub_ps(_mm256_loadu_ps(s + j0), max_score));
    _mm256_storeu_ps(s + j0, e);
    sum_v = _mm256_add_ps(sum_v, e);
  }
  const __m256 inv = _mm256_set1_ps(1.0f / HorizontalSum(sum_v));
  for (int64_t j0 = 0; j0 < padded; j0 += 8) {
    _mm256_storeu_ps(s + j0, _mm256_mul_ps(_mm256_loadu_ps(s + j0), inv));
  }
}

// WeighSchedule (paged_attention_tile.h) on 8-lane registers.
template <int NC>
void WeighTile(const QueryTile& t, int64_t stride, const float* value, TileScratch& x) {
  constexpr int kCc = NC < kValueVectors ? NC : kValueVectors;
  internal::WeighSchedule<kValueQueries>(
      t, stride, 8 * NC, 8 * kCc, x,
      [&](const float* const* p, float* const* o, int64_t c0, int64_t begin, int64_t end, int n) {
        if (n == 1) return WeighValues<1, kCc>(p, o, value + c0, t.key_offset, begin, end);
        WeighValues<kValueQueries, kCc>(p, o, value + c0, t.key_offset, begin, end);
      });
}

// The vector path for head_dim = 8 NC. Each query's result goes through the
// same arithmetic whatever tile it is in: every score is an FMA chain over
// head_dim and a fixed lane tree, the softmax runs over that query's own
// keys only, and each output lane is one FMA chain over the keys in order.
// Tiles only decide which queries share a load, so a row's output does not
// depend on the batch around it (prefill, chunk or decode alike).
template <int NC>
void AttendTileVec(const QueryTile& t, const PagedKvLayer& kv, float scale, TileScratch& x) {
  constexpr int64_t kHd = NC * 8;
  const int64_t count = t.rows * t.group;
  const int64_t last_keys = t.first_keys + t.rows - 1;
  const int64_t stride = (last_keys + 7) / 8 * 8;
  x.query.resize(count);
  x.out.resize(count);
  x.keys.resize(count);
  for (int64_t r = 0, m = 0; r < t.rows; ++r) {
    for (int64_t g = 0; g < t.group; ++g, ++m) {
      x.query[m] = t.q + r * t.row_stride + (t.first_head + g) * kHd;
      x.out[m] = t.out + r * t.row_stride + (t.first_head + g) * kHd;
      x.keys[m] = t.first_keys + r;
    }
  }
  x.scores.resize(count * stride);
  const float* key = kv.key + t.kv_head * kHd;
  const float* value = kv.value + t.kv_head * kHd;
  ScoreTile<NC>(t, scale, stride, key, x);
  for (int64_t m = 0; m < count; ++m) {
    Softmax(x.scores.data() + m * stride, x.keys[m]);
    std::fill(x.out[m], x.out[m] + kHd, 0.0f);
  }
  if (t.avx512) {
    internal::WeighTileAvx512(NC, t, stride, value, x);
  } else {
    WeighTile<NC>(t, stride, value, x);
  }
}

using AttendTileFn = void (*)(const QueryTile&, const PagedKvLayer&, float, TileScratch&);

// The vector kernel for head_dim 8, 16, 32, 64 or 128, else the scalar one.
AttendTileFn PickAttendTile(int64_t head_dim) {
  switch (head_dim) {
    case 8:
      return &AttendTileVec<1>;
    case 16:
      return &AttendTileVec<2>;
    case 32:
      return &AttendTileVec<4>;
    case 64:
      return &AttendTileVec<8>;
    case 128:
      return &AttendTileVec<16>;
    default:
      return &AttendTileScalar;
  }
}

}  // namespace

void PagedAttention(ThreadPool& pool, const float* q, int64_t num_heads, const PagedKvLayer& kv,
                    const std::vector<AttentionSequence>& seqs, float scale, float* out) {
  CHECK_GT(kv.num_kv_heads, 0);
  CHECK_EQ(num_heads % kv.num_kv_heads, 0);
  const int64_t group = num_heads / kv.num_kv_heads;
  const int64_t row_stride = num_heads * kv.head_dim;
  const int64_t token_stride = kv.num_kv_heads * kv.head_dim;
  const int64_t tile_rows = std::max<int64_t>(1, kTileQueries / group);
  // Work items: (tile of tile_rows rows, kv head), numbered sequence by
  // sequence, a sequence's last (most expensive) rows first.
  std::vector<int64_t> first_item(seqs.size() + 1, 0);
  for (size_t s = 0; s < seqs.size(); ++s) {
    const int64_t tiles = (seqs[s].query_len + tile_rows - 1) / tile_rows;
    first_item[s + 1] = first_item[s] + tiles * kv.num_kv_heads;
  }
  const AttendTileFn attend_tile = PickAttendTile(kv.head_dim);
  const bool avx512 =
      ActiveCpuIsa() == CpuIsa::kAvx512 && internal::Avx512AttentionHeadDim(kv.head_dim);
  pool.ParallelFor(first_item.back(), 1, [&](int64_t begin, int64_t end) {
    thread_local TileScratch scratch;
    size_t s =
        std::upper_bound(first_item.begin(), first_item.end(), begin) - first_item.begin() - 1;
    for (int64_t item = begin; item < end; ++item) {
      while (item >= first_item[s + 1]) ++s;
      const AttentionSequence& seq = seqs[s];
      const int64_t tiles = (seq.query_len + tile_rows - 1) / tile_rows;
      const int64_t local = item - first_item[s];
      const int64_t tile = tiles - 1 - local / kv.num_kv_heads, g = local % kv.num_kv_heads;
      const int64_t r0 = tile * tile_rows;
      const int64_t row = seq.query_start + r0;
      QueryTile t;
      t.q = q + row * row_stride;
      t.out = out + row * row_stride;
      t.row_stride = row_stride;
      t.rows = std::min(tile_rows, seq.query_len - r0);
      t.first_keys = seq.context_len - seq.query_len + r0 + 1;
      t.first_head = g * group;
      t.group = group;
      t.kv_head = g;
      t.avx512 = avx512;
      // Where each key the tile sees lives: a division by block_size per
      // block here, not one per key per query in the kernels.
      const int64_t last_keys = t.first_keys + t.rows - 1;
      scratch.key_offset.resize(last_keys);
      for (int64_t b0 = 0; b0 < last_keys; b0 += kv.block_size) {
        const int64_t slot0 =
            static_cast<int64_t>(seq.block_table[b0 / kv.block_size]) * kv.block_size;
        const int64_t n = std::min(kv.block_size, last_keys - b0);
        for (int64_t i = 0; i < n; ++i) scratch.key_offset[b0 + i] = (slot0 + i) * token_stride;
      }
      t.key_offset = scratch.key_offset.data();
      attend_tile(t, kv, scale, scratch);
    }
  });
}

}  // namespace mmserve::model::cpu
