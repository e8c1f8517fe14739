// Elastic sequence parallelism in the language model (after LoongServe):
// the inputs of Qwen2Model::ForwardElasticPrefill / ForwardElasticDecode and the two
// interfaces through which the members of a group exchange data.
//
// Prefill at degree P: each member runs its own rows of one prompt through
// every layer. Per layer it computes its rows' K/V, the exchange all-gathers
// the whole prompt's K/V in global token order, the member attends its rows
// over it (split_attention.h: bitwise the single-instance result) and copies
// the rows of its kept range into its cache (proactive scale-down: no KV
// moves after prefill; a member that keeps nothing writes nothing).
//
//   ElasticPrefillBatch b;
//   b.rows = ...;            // token ids, [3][n] positions, overrides, logits rows
//   b.global_rows = {...};   // ascending global index of each row
//   b.prompt_len = L;
//   b.keep_begin = 0; b.keep_slots = {...};  // slots of tokens [0, 32)
//   RETURN_IF_ERROR(model.ForwardElasticPrefill(b, kv, exchange, &logits));
//
// Decode with the KV spread: the master runs a normal decode batch whose
// sequences cover the tokens it holds (its span plus the tokens it decoded);
// per layer every other member returns its partial attention (output and
// log-sum-exp) over its spans, and the master merges them with its own in
// member order (split_attention.h: within the bound stated there). A
// mixed batch (Qwen2Model::ForwardSpread) decodes such sequences beside
// ordinary ones: SpreadSequences names the spread ones; the ordinary rows
// attend as Forward's do (bitwise) and the peers see only the spread rows.
//
// Implementations: InProcessKvExchange (elastic_local_exchange.h) now; a UCX one
// (puts, flush, CRC32C notice) in worker/.
#ifndef MMSERVE_MODEL_ELASTIC_H_
#define MMSERVE_MODEL_ELASTIC_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "model/forward_batch.h"

namespace mmserve::model {

// One member's share of a prompt prefilled by a group.
struct ElasticPrefillBatch {
  // The member's rows: token_ids, positions ([3][n], the rows' own M-RoPE
  // positions), embedding_overrides and logits_rows as in ForwardBatch;
  // sequences and slot_mapping are unused (the attention is by global_rows).
  ForwardBatch rows;
  std::vector<int64_t> global_rows;  // [n], strictly ascending, < prompt_len
  int64_t prompt_len = 0;
  // Tokens [keep_begin, keep_begin + keep_slots.size()) are kept: token
  // keep_begin + i's K/V goes to slot keep_slots[i] of this member's cache.
  int64_t keep_begin = 0;
  std::vector<int64_t> keep_slots;
};

// All-gathers one layer's K/V across the members of a prefill group.
// Thread-safety: each member calls its own view from its own thread.
class KvExchange {
 public:
  virtual ~KvExchange() = default;
  // k and v hold this member's rows ([rows][kv_width], rows = global_rows of
  // the batch). On success *k_all and *v_all point at the layer's K and V for
  // every prompt token in global order ([prompt_len][kv_width]), valid until
  // the next AllGather call of this member. Every wait has a deadline
  // (DEADLINE_EXCEEDED); a lost or failed member gives UNAVAILABLE.
  [[nodiscard]] virtual absl::Status AllGather(int layer, absl::Span<const int64_t> rows,
                                               const float* k, const float* v, const float** k_all,
                                               const float** v_all) = 0;
  // Tells the other members this one failed: their waits end UNAVAILABLE.
  virtual void Abort() = 0;
};

// The other span holders of a decode batch, queried by the master.
class SpanAttentionPeers {
 public:
  virtual ~SpanAttentionPeers() = default;
  // The members in span order and the master's own place among them.
  virtual int num_members() const = 0;
  virtual int self() const = 0;
  // Member m's partial attention for layer `layer`: q is the batch's rows
  // [rows][heads][head_dim] after RoPE; out the same shape, lse [rows][heads]
  // (-inf and 0 where m holds no keys of that row's sequence).
  [[nodiscard]] virtual absl::Status Query(int member, int layer, const float* q, int64_t rows,
                                           float* out, float* lse) = 0;
};

// The sequences of a batch whose KV is spread over span holders (decodes a
// master runs beside ordinary sequences), and those holders.
struct SpreadSequences {
  // Indices into batch.sequences, strictly ascending, each one decode row.
  std::vector<int64_t> sequences;
  // Answers for the spread rows only, in the order of `sequences`.
  SpanAttentionPeers* peers = nullptr;
};

}  // namespace mmserve::model

#endif  // MMSERVE_MODEL_ELASTIC_H_
