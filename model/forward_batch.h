// The input of one model step: the tokens of many sequences flattened
// together, prefill chunks and decode tokens alike (the model runner's
// "prepare" step).
//
//   ForwardBatch b;
//   // sequence A: 3 new prompt tokens, nothing cached yet, blocks {4}
//   // sequence B: 1 decode token at position 9, blocks {7, 2} (block_size 8)
//   b.token_ids = {11, 12, 13, 99};
//   b.positions = {0, 1, 2, 9,   0, 1, 2, 9,   0, 1, 2, 9};  // [3][T]: t, h, w
//   b.slot_mapping = {32, 33, 34, 2 * 8 + 1};
//   b.sequences = {{0, 3, 3, {4}}, {3, 1, 10, {7, 2}}};
//   b.logits_rows = {2, 3};  // last row of each sequence
//
// Row t's K/V is written to slot_mapping[t] = block * block_size + offset
// before attention reads the cache, so a sequence's rows see the cached
// context plus the rows before them in the same chunk. Everything is plain
// arrays: the KV block manager that chose the blocks lives elsewhere.
#ifndef MMSERVE_MODEL_FORWARD_BATCH_H_
#define MMSERVE_MODEL_FORWARD_BATCH_H_

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/status.h"

namespace mmserve::model {

struct SequenceChunk {
  int64_t query_start = 0;           // first row of this sequence in the batch
  int64_t query_len = 0;             // rows in this step (prefill chunk length, or 1 to decode)
  int64_t context_len = 0;           // tokens in the KV cache after this step (cached + query_len)
  std::vector<int32_t> block_table;  // covers at least context_len tokens
};

// A row whose input embedding replaces the token's embedding (image tokens).
struct EmbeddingOverride {
  int64_t row = 0;
  const float* values = nullptr;  // hidden_size floats, borrowed for the call
  // Qwen3-VL's DeepStack features of this row: deepstack_layers rows of
  // hidden_size floats (borrowed for the call); row k is added to the
  // row's hidden state after decoder layer k (model/deepstack.h).
  const float* deepstack = nullptr;
  int deepstack_layers = 0;
};

struct ForwardBatch {
  std::vector<int32_t> token_ids;     // [T]
  std::vector<int64_t> positions;     // [3][T] M-RoPE components t, h, w
  std::vector<int64_t> slot_mapping;  // [T]
  std::vector<SequenceChunk> sequences;
  std::vector<int64_t> logits_rows;  // rows whose logits the step returns, in this order
  std::vector<EmbeddingOverride> embedding_overrides;
  // Called on the forward's thread after each decoder layer with how many
  // layers' K/V rows of this batch are in the cache (1 .. num_layers), so
  // that a caller can move finished layers while the next ones compute
  // (role prefill's layer-wise KV hand-off). Empty: not called. It runs
  // between layers: keep it cheap.
  std::function<void(int)> on_layers_written;

  int64_t num_tokens() const { return static_cast<int64_t>(token_ids.size()); }
};

// Limits a batch is checked against.
struct ForwardBatchLimits {
  int64_t vocab_size = 0;
  int64_t block_size = 0;
  int64_t num_blocks = 0;
};

// InvalidArgument naming the first problem: array sizes that disagree with
// T, sequences that overlap or leave rows uncovered, context_len < query_len,
// a block table too short or naming a block out of range, a slot that is not
// block_table[pos / block_size] * block_size + pos % block_size for the row's
// cache position, a token id outside the vocabulary (unless overridden),
// logits or override rows out of range, duplicate overrides.
[[nodiscard]] absl::Status ValidateForwardBatch(const ForwardBatch& batch,
                                                const ForwardBatchLimits& limits);

}  // namespace mmserve::model

#endif  // MMSERVE_MODEL_FORWARD_BATCH_H_
