// Qwen2Model's elastic sequence parallelism paths (model/elastic.h): a member's
// share of a group prefill, and decode on the master of spread KV.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "model/cpu/split_attention.h"
#include "model/qwen2_model.h"

namespace mmserve::model {
namespace {

// The batch's own shape, before any layer runs.
absl::Status ValidateElasticPrefill(const ElasticPrefillBatch& b, int64_t vocab,
                                    int64_t num_slots) {
  const int64_t n = b.rows.num_tokens();
  if (n == 0) return absl::InvalidArgumentError("an elastic prefill member needs at least one row");
  if (static_cast<int64_t>(b.global_rows.size()) != n) {
    return absl::InvalidArgumentError("global_rows must name every row");
  }
  for (int64_t i = 0; i < n; ++i) {
    if (b.global_rows[i] < 0 || b.global_rows[i] >= b.prompt_len ||
        (i > 0 && b.global_rows[i] <= b.global_rows[i - 1])) {
      return absl::InvalidArgumentError("global_rows must ascend within the prompt");
    }
  }
  const int64_t keep = static_cast<int64_t>(b.keep_slots.size());
  if (b.keep_begin < 0 || b.keep_begin + keep > b.prompt_len) {
    return absl::InvalidArgumentError("the kept range must lie within the prompt");
  }
  for (int64_t slot : b.keep_slots) {
    if (slot < 0 || slot >= num_slots) return absl::InvalidArgumentError("kept slot out of range");
  }
  // The rows as one sequence in a one-block cache: checks token ids,
  // positions, overrides and logits rows as Forward does.
  ForwardBatch rows = b.rows;
  rows.slot_mapping.resize(n);
  std::iota(rows.slot_mapping.begin(), rows.slot_mapping.end(), 0);
  rows.sequences = {{0, n, n, {0}}};
  return ValidateForwardBatch(rows, {vocab, n, 1});
}

}  // namespace

absl::Status Qwen2Model::ForwardElasticPrefill(const ElasticPrefillBatch& batch, KvCache& kv,
                                               KvExchange& exchange, std::vector<float>* logits) {
  absl::Status status = [&]() -> absl::Status {
    if (parallel_) return absl::InvalidArgumentError("elastic prefill with sharded weights");
    RETURN_IF_ERROR(CheckKvShape(kv));
    RETURN_IF_ERROR(ValidateElasticPrefill(batch, cfg_.vocab_size, kv.num_slots()));
    return Run(
        batch.rows, [&](int layer) { return ElasticPrefillAttention(layer, batch, kv, exchange); },
        logits);
  }();
  if (!status.ok()) exchange.Abort();
  return status;
}

absl::Status Qwen2Model::ElasticPrefillAttention(int layer, const ElasticPrefillBatch& batch,
                                                 KvCache& kv, KvExchange& exchange) {
  const int64_t t = batch.rows.num_tokens();
  ProjectQkv(layer, t);
  const float* k_all = nullptr;
  const float* v_all = nullptr;
  RETURN_IF_ERROR(
      exchange.AllGather(layer, batch.global_rows, k_.data(), v_.data(), &k_all, &v_all));
  cpu::SplitPrefillAttention(pool_, q_.data(), heads_,
                             {k_all, v_all, batch.prompt_len, kv_heads_, head_dim_},
                             batch.global_rows, AttentionScale(), attn_.data());
  // Proactive scale-down: only the kept range enters this member's cache.
  const int64_t kv_width = kv_heads_ * head_dim_;
  WriteKv(batch.keep_slots, k_all + batch.keep_begin * kv_width,
          v_all + batch.keep_begin * kv_width, kv.Key(layer), kv.Value(layer));
  return absl::OkStatus();
}

absl::Status Qwen2Model::ForwardElasticDecode(const ForwardBatch& batch, KvCache& kv,
                                              SpanAttentionPeers& peers,
                                              std::vector<float>* logits) {
  SpreadSequences all{.sequences = {}, .peers = &peers};
  for (size_t i = 0; i < batch.sequences.size(); ++i) all.sequences.push_back(i);
  return ForwardSpread(batch, kv, all, logits);
}

absl::Status Qwen2Model::ForwardSpread(const ForwardBatch& batch, KvCache& kv,
                                       const SpreadSequences& spread, std::vector<float>* logits) {
  if (parallel_) return absl::InvalidArgumentError("elastic decode with sharded weights");
  RETURN_IF_ERROR(CheckKvShape(kv));
  const KvCacheShape& ks = kv.shape();
  RETURN_IF_ERROR(ValidateForwardBatch(batch, {cfg_.vocab_size, ks.block_size, ks.num_blocks}));
  const int64_t n = static_cast<int64_t>(batch.sequences.size());
  for (size_t i = 0; i < spread.sequences.size(); ++i) {
    const int64_t s = spread.sequences[i];
    if (s < 0 || s >= n || (i > 0 && s <= spread.sequences[i - 1])) {
      return absl::InvalidArgumentError("spread sequences must ascend within the batch");
    }
    if (batch.sequences[s].query_len != 1) {
      return absl::InvalidArgumentError("elastic decode takes one row a sequence");
    }
  }
  if (!spread.sequences.empty() && (spread.peers == nullptr || spread.peers->self() < 0 ||
                                    spread.peers->self() >= spread.peers->num_members())) {
    return absl::InvalidArgumentError("the master is not among the span holders");
  }
  return Run(
      batch, [&](int layer) { return SpreadAttention(layer, batch, kv, spread); }, logits);
}

// The ordinary sequences as Attention attends them; the spread rows' own
// keys, the peers' partials over theirs, merged in member order.
absl::Status Qwen2Model::SpreadAttention(int layer, const ForwardBatch& batch, KvCache& kv,
                                         const SpreadSequences& spread) {
  const int64_t t = batch.num_tokens();
  const int64_t q_width = heads_ * head_dim_;
  ProjectQkv(layer, t);
  WriteKv(batch.slot_mapping, k_.data(), v_.data(), kv.Key(layer), kv.Value(layer));
  const cpu::PagedKvLayer layer_kv{kv.Key(layer), kv.Value(layer), kv.shape().block_size, kv_heads_,
                                   head_dim_};
  std::vector<cpu::AttentionSequence> ordinary;
  std::vector<cpu::PartialSpan> local;
  std::vector<int64_t> rows;  // the spread rows, in order
  size_t next = 0;
  for (size_t i = 0; i < batch.sequences.size(); ++i) {
    const SequenceChunk& s = batch.sequences[i];
    if (next < spread.sequences.size() && spread.sequences[next] == static_cast<int64_t>(i)) {
      local.push_back({static_cast<int64_t>(rows.size()), s.block_table.data(), s.context_len});
      rows.push_back(s.query_start);
      ++next;
      continue;
    }
    ordinary.push_back({s.query_start, s.query_len, s.context_len, s.block_table.data()});
  }
  if (!ordinary.empty()) {
    cpu::PagedAttention(pool_, q_.data(), heads_, layer_kv, ordinary, AttentionScale(),
                        attn_.data());
  }
  if (rows.empty()) return absl::OkStatus();
  const int64_t m = static_cast<int64_t>(rows.size());
  const float* q = q_.data();
  if (m != t) {  // the peers see the spread rows only
    span_q_.resize(m * q_width);
    for (int64_t r = 0; r < m; ++r) {
      std::copy_n(&q_[rows[r] * q_width], q_width, &span_q_[r * q_width]);
    }
    q = span_q_.data();
  }
  SpanAttentionPeers& peers = *spread.peers;
  const int members = peers.num_members(), self = peers.self();
  span_out_.resize(members * m * q_width);
  span_lse_.resize(members * m * heads_);
  // A member holding nothing of a row's sequence leaves it empty.
  std::fill(span_lse_.begin(), span_lse_.end(), -INFINITY);
  std::fill(span_out_.begin(), span_out_.end(), 0.0f);
  cpu::PartialAttention(pool_, q, heads_, layer_kv, local, AttentionScale(),
                        &span_out_[self * m * q_width], &span_lse_[self * m * heads_]);
  for (int p = 0; p < members; ++p) {
    if (p == self) continue;
    RETURN_IF_ERROR(
        peers.Query(p, layer, q, m, &span_out_[p * m * q_width], &span_lse_[p * m * heads_]));
  }
  std::vector<cpu::PartialRef> parts(members);
  for (int64_t r = 0; r < m; ++r) {
    for (int p = 0; p < members; ++p) {
      parts[p] = {&span_out_[(p * m + r) * q_width], &span_lse_[(p * m + r) * heads_]};
    }
    cpu::MergePartials(heads_, head_dim_, parts, &attn_[rows[r] * q_width]);
  }
  return absl::OkStatus();
}

}  // namespace mmserve::model
