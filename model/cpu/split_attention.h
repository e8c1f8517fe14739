// Attention for elastic sequence parallelism (after LoongServe): one
// sequence's rows split across the members of a group.
//
// Prefill, all-gather form: each member computes K/V for its own rows,
// the members exchange them, and each attends its own query rows over the
// gathered K/V in global token order:
//
//   // q: [rows][heads][hd] of this member's rows, global_rows ascending;
//   // k_all, v_all: [num_keys][kv_heads][hd], the whole prompt in global order.
//   SplitPrefillAttention(pool, q, heads, {k_all, v_all, num_keys, kv_heads, hd},
//                         global_rows, scale, out);
//
// Row i sees keys 0 .. global_rows[i] (the causal mask is by global index,
// never by M-RoPE position). Each maximal run of consecutive global rows is
// one PagedAttention sequence, whose per-row arithmetic does not depend on
// the batch around it, so the output is bitwise the single-instance one.
//
// Decode across spans: a span holder attends a query row over the keys it
// holds and returns the partial output (normalized over its keys) and the
// log-sum-exp of its scores; the master merges the partials of every span
// in a fixed order in fp32:
//
//   PartialAttention(pool, q, heads, kv, {{row, table, num_keys}}, scale, o, lse);
//   MergePartials(heads, hd, {{o0, lse0}, {o1, lse1}}, out);  // span order
//
// An empty span gives lse = -inf and o = 0 and weighs nothing in the merge.
// For head_dim a multiple of 8 a span's scores, exponentials, sum and
// weighted values use exactly PagedAttention's arithmetic, so one span
// holding every key merges to PagedAttention's bits; several spans differ by
// rounding only (see MergePartials).
// Thread-safety: as ThreadPool::ParallelFor (one caller per pool);
// MergePartials is a pure function.
#ifndef MMSERVE_MODEL_CPU_SPLIT_ATTENTION_H_
#define MMSERVE_MODEL_CPU_SPLIT_ATTENTION_H_

#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "model/cpu/paged_attention.h"
#include "model/cpu/thread_pool.h"

namespace mmserve::model::cpu {

// One layer's gathered K/V, contiguous in global token order.
struct GatheredKv {
  const float* key = nullptr;  // [num_keys][num_kv_heads][head_dim]
  const float* value = nullptr;
  int64_t num_keys = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
};

// q and out are [global_rows.size()][num_heads][head_dim]; global_rows is
// strictly ascending and each below kv.num_keys (CHECKed).
void SplitPrefillAttention(ThreadPool& pool, const float* q, int64_t num_heads,
                           const GatheredKv& kv, absl::Span<const int64_t> global_rows, float scale,
                           float* out);

// One query row against the keys a span holder keeps: keys 0 .. num_keys-1
// of its block table (num_keys may be 0).
struct PartialSpan {
  int64_t row = 0;  // row of q / out / lse
  const int32_t* block_table = nullptr;
  int64_t num_keys = 0;
};

// q and out are [rows][num_heads][head_dim], lse [rows][num_heads]; only
// the rows named by spans are written. out holds each span's softmax over
// its own keys times V; lse = max + log(sum of e^(score - max)).
void PartialAttention(ThreadPool& pool, const float* q, int64_t num_heads, const PagedKvLayer& kv,
                      const std::vector<PartialSpan>& spans, float scale, float* out, float* lse);

// One span's partial for one row: [num_heads][head_dim] and [num_heads].
struct PartialRef {
  const float* out = nullptr;
  const float* lse = nullptr;
};

// out[h] = sum_i w_i o_i[h] / sum_i w_i with w_i = e^(lse_i[h] - max_i lse_i[h]),
// in fp32, the spans in the given order (spans with lse = -inf weigh 0; if
// every span is empty the row is 0). Each o_i is a convex combination of V
// rows and so is the result: with exact partials the merge is exact up to
// the rounding of the w_i, their sum and the weighted sum (a few ulps of
// max |v| per span; the tests state the bound).
void MergePartials(int64_t num_heads, int64_t head_dim, absl::Span<const PartialRef> parts,
                   float* out);

}  // namespace mmserve::model::cpu

#endif  // MMSERVE_MODEL_CPU_SPLIT_ATTENTION_H_
