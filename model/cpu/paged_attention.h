// Causal grouped-query attention over a paged KV cache, for a batch that mixes
// prefill chunks and decode tokens of many sequences.
//
//   PagedKvLayer kv{key_base, value_base, block_size, num_kv_heads, head_dim};
//   std::vector<AttentionSequence> seqs = {{/*query_start=*/0, /*query_len=*/5,
//                                          /*context_len=*/5, table0.data()}, ...};
//   PagedAttention(pool, q, num_tokens, num_heads, kv, seqs, 1 / sqrt(head_dim), out);
//
// A sequence's query rows are its last query_len tokens: row i sits at
// position context_len - query_len + i and attends to keys 0 .. that
// position, which must already be in the cache (write this step's K/V
// first). Key j of a sequence lives in block block_table[j / block_size] at
// offset j % block_size. Query head h reads KV head h / (num_heads /
// num_kv_heads), as in Hugging Face's repeat_kv.
//
// Softmax is in fp32 with the maximum subtracted, probabilities normalized
// before they weight V (the order of HF's eager attention). For head_dim 8,
// 16, 32, 64 and 128 the kernel works on tiles of a few consecutive rows of
// one sequence times the query heads of one KV head (about 28 queries), so
// that each key and value load serves all of them: it scores 8 keys at a
// time (an FMA chain over head_dim per key, then a fixed lane tree), takes
// e^x with an 8-lane polynomial (relative error ~1e-7) and accumulates each
// output lane over the keys in order. Tiles only choose which queries share
// a load: every query's arithmetic is the same in any tile, so a row's
// output does not depend on the batch around it (prefill, chunk or decode
// give the same bits). At the kAvx512 level (cpu_isa.h) the values are
// weighed on 16-lane registers with the same chains: the same bits at both
// levels. Other head sizes use a scalar-exp, one-key-at-a-time path.
// Thread-safety: as ThreadPool::ParallelFor (one caller per pool).
#ifndef MMSERVE_MODEL_CPU_PAGED_ATTENTION_H_
#define MMSERVE_MODEL_CPU_PAGED_ATTENTION_H_

#include <cstdint>
#include <vector>

#include "model/cpu/thread_pool.h"

namespace mmserve::model::cpu {

// One layer's cache: key and value each [blocks][block_size][kv_heads][head_dim].
struct PagedKvLayer {
  const float* key = nullptr;
  const float* value = nullptr;
  int64_t block_size = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
};

struct AttentionSequence {
  int64_t query_start = 0;  // first row in q / out
  int64_t query_len = 0;
  int64_t context_len = 0;  // keys visible to the last row (cached + this chunk)
  const int32_t* block_table = nullptr;
};

// q and out are [num_tokens][num_heads][head_dim]; rows not covered by any
// sequence are left untouched.
void PagedAttention(ThreadPool& pool, const float* q, int64_t num_heads, const PagedKvLayer& kv,
                    const std::vector<AttentionSequence>& seqs, float scale, float* out);

}  // namespace mmserve::model::cpu

#endif  // MMSERVE_MODEL_CPU_PAGED_ATTENTION_H_
