#include "model/cpu/paged_attention.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/logging.h"

namespace mmserve::model::cpu {
namespace {

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

// One query row against keys [0, num_keys) for the heads of one KV group.
void AttendRow(const float* q_row, int64_t first_head, int64_t group, int64_t kv_head,
               int64_t num_keys, const int32_t* table, const PagedKvLayer& kv, float scale,
               float* out_row, std::vector<float>& scores) {
  const int64_t hd = kv.head_dim;
  const int64_t token_stride = kv.num_kv_heads * hd;
  scores.resize(num_keys);
  for (int64_t h = first_head; h < first_head + group; ++h) {
    const float* qh = q_row + h * hd;
    float max_score = -INFINITY;
    for (int64_t j = 0; j < num_keys; ++j) {
      const int64_t slot =
          static_cast<int64_t>(table[j / kv.block_size]) * kv.block_size + j % kv.block_size;
      const float s = Dot(qh, kv.key + slot * token_stride + kv_head * hd, hd) * scale;
      scores[j] = s;
      max_score = std::max(max_score, s);
    }
    float sum = 0.0f;
    for (int64_t j = 0; j < num_keys; ++j) {
      scores[j] = std::exp(scores[j] - max_score);
      sum += scores[j];
    }
    const float inv = 1.0f / sum;
    float* oh = out_row + h * hd;
    std::fill(oh, oh + hd, 0.0f);
    for (int64_t j = 0; j < num_keys; ++j) {
      const int64_t slot =
          static_cast<int64_t>(table[j / kv.block_size]) * kv.block_size + j % kv.block_size;
      Axpy(scores[j] * inv, kv.value + slot * token_stride + kv_head * hd, oh, hd);
    }
  }
}

// e^x for x <= 0 (scores minus their maximum), 8 lanes: Cephes' expf
// (x = n ln2 + r, a degree-6 polynomial for e^r, relative error ~1e-7);
// 0 below -87.3, where e^x leaves the normal range, and for -inf.
inline __m256 ExpNonPositive(__m256 x) {
  const __m256 lowest = _mm256_set1_ps(-87.3f);
  const __m256 valid = _mm256_cmp_ps(x, lowest, _CMP_GE_OQ);
  x = _mm256_max_ps(x, lowest);
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  x = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  x = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), x);
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
  const __m256i pow2n =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_and_ps(_mm256_mul_ps(y, _mm256_castsi256_ps(pow2n)), valid);
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

// AttendRow for head_dim = 8 NC: scores of 8 keys at a time (one 8-lane
// chain per key over head_dim, then SumLanes8), a vector exp, and the
// weighted sum of values kept in registers. Every key's score and weight
// goes through the same arithmetic whatever its position, and the padding
// keys of the last group of 8 get weight 0, so a row's result depends only
// on its own query and keys (batch invariance).
template <int NC>
void AttendRowVec(const float* q_row, int64_t first_head, int64_t group, int64_t kv_head,
                  int64_t num_keys, const int32_t* table, const PagedKvLayer& kv, float scale,
                  float* out_row, std::vector<float>& scores) {
  constexpr int64_t kHd = NC * 8;
  const int64_t token_stride = kv.num_kv_heads * kHd;
  const int64_t padded = (num_keys + 7) / 8 * 8;
  scores.resize(padded);
  auto slot_of = [&](int64_t j) {
    return static_cast<int64_t>(table[j / kv.block_size]) * kv.block_size + j % kv.block_size;
  };
  const __m256 scale_v = _mm256_set1_ps(scale);
  const __m256 minus_inf = _mm256_set1_ps(-INFINITY);
  for (int64_t h = first_head; h < first_head + group; ++h) {
    const float* qh = q_row + h * kHd;
    // The query stays in registers while the keys stream past (up to
    // head_dim 64: 8 query + 8 accumulator registers, keys as operands).
    __m256 qv[NC];
    _Pragma("GCC unroll 16") for (int c = 0; c < NC; ++c) qv[c] = _mm256_loadu_ps(qh + 8 * c);
    __m256 max_v = minus_inf;
    for (int64_t j0 = 0; j0 < padded; j0 += 8) {
      __m256 acc[8];
      _Pragma("GCC unroll 8") for (int t = 0; t < 8; ++t) {
        const int64_t j = std::min(j0 + t, num_keys - 1);
        const float* kp = kv.key + slot_of(j) * token_stride + kv_head * kHd;
        acc[t] = _mm256_setzero_ps();
        _Pragma("GCC unroll 16") for (int c = 0; c < NC; ++c) {
          acc[t] = _mm256_fmadd_ps(qv[c], _mm256_loadu_ps(kp + 8 * c), acc[t]);
        }
      }
      __m256 s = _mm256_mul_ps(SumLanes8(acc), scale_v);
      if (j0 + 8 > num_keys) {
        const __m256 lane = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7);
        const __m256 live = _mm256_set1_ps(static_cast<float>(num_keys - j0));
        s = _mm256_blendv_ps(minus_inf, s, _mm256_cmp_ps(lane, live, _CMP_LT_OQ));
      }
      _mm256_storeu_ps(&scores[j0], s);
      max_v = _mm256_max_ps(max_v, s);
    }
    const __m256 max_score = _mm256_set1_ps(HorizontalMax(max_v));
    __m256 sum_v = _mm256_setzero_ps();
    for (int64_t j0 = 0; j0 < padded; j0 += 8) {
      const __m256 e = ExpNonPositive(_mm256_sub_ps(_mm256_loadu_ps(&scores[j0]), max_score));
      _mm256_storeu_ps(&scores[j0], e);
      sum_v = _mm256_add_ps(sum_v, e);
    }
    const float inv = 1.0f / HorizontalSum(sum_v);
    float* oh = out_row + h * kHd;
    constexpr int kOc = NC < 8 ? NC : 8;  // output vectors held at once
    for (int c0 = 0; c0 < NC; c0 += kOc) {
      __m256 o[kOc];
      _Pragma("GCC unroll 8") for (int c = 0; c < kOc; ++c) o[c] = _mm256_setzero_ps();
      for (int64_t j = 0; j < num_keys; ++j) {
        const float* vp = kv.value + slot_of(j) * token_stride + kv_head * kHd + 8 * c0;
        const __m256 p = _mm256_set1_ps(scores[j] * inv);
        _Pragma("GCC unroll 8") for (int c = 0; c < kOc; ++c) {
          o[c] = _mm256_fmadd_ps(p, _mm256_loadu_ps(vp + 8 * c), o[c]);
        }
      }
      _Pragma("GCC unroll 8") for (int c = 0; c < kOc; ++c) {
        _mm256_storeu_ps(oh + 8 * (c0 + c), o[c]);
      }
    }
  }
}

using AttendRowFn = void (*)(const float*, int64_t, int64_t, int64_t, int64_t, const int32_t*,
                             const PagedKvLayer&, float, float*, std::vector<float>&);

// The vector kernel for head_dim 8, 16, 32, 64 or 128, else the scalar one.
AttendRowFn PickAttendRow(int64_t head_dim) {
  switch (head_dim) {
    case 8:
      return &AttendRowVec<1>;
    case 16:
      return &AttendRowVec<2>;
    case 32:
      return &AttendRowVec<4>;
    case 64:
      return &AttendRowVec<8>;
    case 128:
      return &AttendRowVec<16>;
    default:
      return &AttendRow;
  }
}

}  // namespace

void PagedAttention(ThreadPool& pool, const float* q, int64_t num_heads, const PagedKvLayer& kv,
                    const std::vector<AttentionSequence>& seqs, float scale, float* out) {
  CHECK_GT(kv.num_kv_heads, 0);
  CHECK_EQ(num_heads % kv.num_kv_heads, 0);
  const int64_t group = num_heads / kv.num_kv_heads;
  const int64_t row_stride = num_heads * kv.head_dim;
  // Work items: (sequence row, kv head), numbered sequence by sequence.
  std::vector<int64_t> first_item(seqs.size() + 1, 0);
  for (size_t s = 0; s < seqs.size(); ++s) {
    first_item[s + 1] = first_item[s] + seqs[s].query_len * kv.num_kv_heads;
  }
  const AttendRowFn attend_row = PickAttendRow(kv.head_dim);
  pool.ParallelFor(first_item.back(), 4, [&](int64_t begin, int64_t end) {
    thread_local std::vector<float> scores;
    size_t s =
        std::upper_bound(first_item.begin(), first_item.end(), begin) - first_item.begin() - 1;
    for (int64_t item = begin; item < end; ++item) {
      while (item >= first_item[s + 1]) ++s;
      const AttentionSequence& seq = seqs[s];
      const int64_t local = item - first_item[s];
      const int64_t i = local / kv.num_kv_heads, g = local % kv.num_kv_heads;
      const int64_t row = seq.query_start + i;
      const int64_t num_keys = seq.context_len - seq.query_len + i + 1;
      attend_row(q + row * row_stride, g * group, group, g, num_keys, seq.block_table, kv, scale,
                 out + row * row_stride, scores);
    }
  });
}

}  // namespace mmserve::model::cpu
