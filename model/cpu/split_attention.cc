#include "model/cpu/split_attention.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/logging.h"
#include "model/cpu/exp8.h"

namespace mmserve::model::cpu {
namespace {

// PagedAttention's lane trees and exponential (paged_attention.cc), repeated
// here so that a span's arithmetic is the single-instance kernel's.
inline float SumTree(__m256 v) {
  alignas(32) float l[8];
  _mm256_store_ps(l, v);
  return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}

inline __m256 ExpNonPositive(__m256 x) {
  const __m256 lowest = _mm256_set1_ps(-87.3f);
  const __m256 valid = _mm256_cmp_ps(x, lowest, _CMP_GE_OQ);
  x = _mm256_max_ps(x, lowest);
  return _mm256_and_ps(internal::Exp8InRange(x), valid);
}

// Per-thread buffers reused from call to call.
struct SpanScratch {
  std::vector<int64_t> key_offset;
  std::vector<float> scores;
};

// The score of one key as PagedAttention's vector path computes it: one
// 8-lane FMA chain over head_dim, the fixed lane tree, then the scale.
inline float Score8(const float* q, const float* k, int64_t head_dim, float scale) {
  __m256 acc = _mm256_setzero_ps();
  for (int64_t c = 0; c < head_dim; c += 8) {
    acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + c), _mm256_loadu_ps(k + c), acc);
  }
  return SumTree(acc) * scale;
}

// Any other head_dim: a plain FMA chain and std::exp.
inline float ScoreScalar(const float* q, const float* k, int64_t head_dim, float scale) {
  float sum = 0.0f;
  for (int64_t c = 0; c < head_dim; ++c) sum = std::fma(q[c], k[c], sum);
  return sum * scale;
}

// Turns s[0, n) into e^(s - max) in place; returns {max, sum}. With
// head_dim % 8 == 0 this is PagedAttention's softmax before the 1 / sum:
// lanes past n are -inf, 8-lane exponentials and per-lane sums over the
// groups of 8 in order, then the lane tree.
std::pair<float, float> ExpScores(float* s, int64_t n, bool vec) {
  float max_score = -INFINITY;
  for (int64_t j = 0; j < n; ++j) max_score = std::max(max_score, s[j]);
  if (!vec) {
    float sum = 0.0f;
    for (int64_t j = 0; j < n; ++j) sum += (s[j] = std::exp(s[j] - max_score));
    return {max_score, sum};
  }
  const int64_t padded = (n + 7) / 8 * 8;
  std::fill(s + n, s + padded, -INFINITY);
  const __m256 m = _mm256_set1_ps(max_score);
  __m256 sum_v = _mm256_setzero_ps();
  for (int64_t j0 = 0; j0 < padded; j0 += 8) {
    const __m256 e = ExpNonPositive(_mm256_sub_ps(_mm256_loadu_ps(s + j0), m));
    _mm256_storeu_ps(s + j0, e);
    sum_v = _mm256_add_ps(sum_v, e);
  }
  return {max_score, SumTree(sum_v)};
}

// One query head against one span's keys.
void AttendSpanHead(const float* qh, const PagedKvLayer& kv, int64_t kv_head, int64_t num_keys,
                    float scale, SpanScratch& x, float* oh, float* lse) {
  const int64_t hd = kv.head_dim;
  std::fill(oh, oh + hd, 0.0f);
  if (num_keys == 0) {
    *lse = -INFINITY;
    return;
  }
  const bool vec = hd % 8 == 0;
  x.scores.resize((num_keys + 7) / 8 * 8);
  float* s = x.scores.data();
  const float* key = kv.key + kv_head * hd;
  for (int64_t j = 0; j < num_keys; ++j) {
    s[j] = vec ? Score8(qh, key + x.key_offset[j], hd, scale)
               : ScoreScalar(qh, key + x.key_offset[j], hd, scale);
  }
  const auto [max_score, sum] = ExpScores(s, num_keys, vec);
  const float inv = 1.0f / sum;
  const float* value = kv.value + kv_head * hd;
  for (int64_t j = 0; j < num_keys; ++j) {
    const float p = s[j] * inv;
    const float* v = value + x.key_offset[j];
    for (int64_t c = 0; c < hd; ++c) oh[c] = std::fma(p, v[c], oh[c]);
  }
  *lse = max_score + std::log(sum);
}

}  // namespace

void SplitPrefillAttention(ThreadPool& pool, const float* q, int64_t num_heads,
                           const GatheredKv& kv, absl::Span<const int64_t> global_rows, float scale,
                           float* out) {
  const int64_t n = static_cast<int64_t>(global_rows.size());
  if (n == 0) return;
  CHECK_GT(kv.num_keys, 0);
  // One "block" holding every gathered key: key j at row j.
  static const int32_t kTable[1] = {0};
  std::vector<AttentionSequence> seqs;
  for (int64_t i = 0; i < n;) {
    CHECK_GE(global_rows[i], 0);
    int64_t e = i + 1;
    while (e < n && global_rows[e] == global_rows[e - 1] + 1) ++e;
    CHECK(e == n || global_rows[e] > global_rows[e - 1]) << "global rows must ascend";
    CHECK_LT(global_rows[e - 1], kv.num_keys);
    seqs.push_back({i, e - i, global_rows[e - 1] + 1, kTable});
    i = e;
  }
  const PagedKvLayer layer{kv.key, kv.value, kv.num_keys, kv.num_kv_heads, kv.head_dim};
  PagedAttention(pool, q, num_heads, layer, seqs, scale, out);
}

void PartialAttention(ThreadPool& pool, const float* q, int64_t num_heads, const PagedKvLayer& kv,
                      const std::vector<PartialSpan>& spans, float scale, float* out, float* lse) {
  CHECK_GT(kv.num_kv_heads, 0);
  CHECK_EQ(num_heads % kv.num_kv_heads, 0);
  const int64_t group = num_heads / kv.num_kv_heads;
  const int64_t hd = kv.head_dim, row_stride = num_heads * hd;
  const int64_t token_stride = kv.num_kv_heads * hd;
  const int64_t items = static_cast<int64_t>(spans.size()) * kv.num_kv_heads;
  pool.ParallelFor(items, 1, [&](int64_t begin, int64_t end) {
    thread_local SpanScratch scratch;
    for (int64_t item = begin; item < end; ++item) {
      const PartialSpan& span = spans[item / kv.num_kv_heads];
      const int64_t g = item % kv.num_kv_heads;
      scratch.key_offset.resize(span.num_keys);
      for (int64_t j = 0; j < span.num_keys; ++j) {
        const int64_t slot =
            static_cast<int64_t>(span.block_table[j / kv.block_size]) * kv.block_size +
            j % kv.block_size;
        scratch.key_offset[j] = slot * token_stride;
      }
      for (int64_t h = g * group; h < (g + 1) * group; ++h) {
        const int64_t at = span.row * row_stride + h * hd;
        AttendSpanHead(q + at, kv, g, span.num_keys, scale, scratch, out + at,
                       lse + span.row * num_heads + h);
      }
    }
  });
}

void MergePartials(int64_t num_heads, int64_t head_dim, absl::Span<const PartialRef> parts,
                   float* out) {
  std::vector<float> w(parts.size());
  for (int64_t h = 0; h < num_heads; ++h) {
    float m = -INFINITY;
    for (const PartialRef& p : parts) m = std::max(m, p.lse[h]);
    float* oh = out + h * head_dim;
    std::fill(oh, oh + head_dim, 0.0f);
    if (m == -INFINITY) continue;  // every span empty: nothing to attend
    float denom = 0.0f;
    for (size_t i = 0; i < parts.size(); ++i) {
      // e^(-inf - m) would be 0 anyway; the guard keeps -inf - -inf away.
      w[i] = parts[i].lse[h] == -INFINITY ? 0.0f : std::exp(parts[i].lse[h] - m);
      denom += w[i];
    }
    for (int64_t c = 0; c < head_dim; ++c) {
      float acc = 0.0f;
      for (size_t i = 0; i < parts.size(); ++i) {
        acc = std::fma(w[i], parts[i].out[h * head_dim + c], acc);
      }
      oh[c] = acc / denom;
    }
  }
}

}  // namespace mmserve::model::cpu
