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
      AttendRow(q + row * row_stride, g * group, group, g, num_keys, seq.block_table, kv, scale,
                out + row * row_stride, scores);
    }
  });
}

}  // namespace mmserve::model::cpu
