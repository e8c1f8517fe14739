// One step of a tensor-parallel instance as rank 0 sends it to the other
// ranks (the step ring's control plane): the ForwardBatch's plain arrays (token
// ids, M-RoPE positions, slot mapping, block tables, logits rows) and, for
// image rows, descriptors of where each rank finds the input embedding
// (in the receive buffer every rank maps) rather than pointers.
//
//   StepMessage m = StepMessageFromBatch(batch, hidden, EmbeddingPlacement::kInline);
//   ASSIGN_OR_RETURN(size_t n, EncodeStep(m, slot));        // rank 0, into the ring
//   RETURN_IF_ERROR(DecodeStep(slot.subspan(0, n), &got));  // rank r
//   RETURN_IF_ERROR(ResolveEmbeddings(shared_buffer, hidden, &got));
//   // got.batch is now ready for Qwen2Model::Forward
//
// Embedding descriptors: kInline carries the floats in the message itself
// (the blocking variant: rank 0 copies every payload into the step);
// kSharedBuffer names a range of the instance's receive buffer that every
// rank maps (embeddings arrive there over UCX; the step carries only the
// content hash, offset and length).
// The encoding is native-endian (the ranks share one host) and checked on
// decode: a truncated or inconsistent message is DataLoss, never a crash.
#ifndef MMSERVE_WORKER_STEP_MESSAGE_H_
#define MMSERVE_WORKER_STEP_MESSAGE_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "model/forward_batch.h"

namespace mmserve::worker {

enum class StepKind : uint32_t {
  kForward = 1,  // run batch
  kStop = 2,     // leave the step loop (orderly shutdown)
  // (Re)create the rank's KV cache: kv_blocks blocks of kv_block_size tokens
  // (its own KV heads); the old contents are gone.
  kAllocateKv = 3,
  // KV hand-off into a decode instance (ranks run these only when
  // started with a ShardKvHooks): expose the rank's cache to UCX writes and
  // all-gather every rank's target (kKvRegister); order the writes landed so
  // far before the rank's reads and all-gather each rank's CRC32C of the
  // blocks listed in batch.sequences[0].block_table (kKvCheck; no sequence:
  // a fence only).
  kKvRegister = 4,
  kKvCheck = 5,
};

enum class EmbeddingPlacement : uint32_t {
  kInline = 0,        // offset counts floats into StepMessage::inline_floats
  kSharedBuffer = 1,  // offset counts bytes into the instance's receive buffer
};

struct EmbeddingRef {
  int64_t row = 0;            // batch row whose input embedding this is
  uint64_t content_hash = 0;  // the image embedding's cache key (0: unknown)
  EmbeddingPlacement placement = EmbeddingPlacement::kInline;
  uint64_t offset = 0;
  uint64_t length = 0;  // floats: hidden_size * (1 + deepstack_layers)
  // Qwen3-VL: the row's DeepStack features follow its embedding.
  uint32_t deepstack_layers = 0;
};

struct StepMessage {
  StepKind kind = StepKind::kForward;
  // kForward: the batch without embedding_overrides (see embeddings);
  // ResolveEmbeddings fills them.
  model::ForwardBatch batch;
  std::vector<EmbeddingRef> embeddings;
  std::vector<float> inline_floats;
  // kAllocateKv only.
  int64_t kv_blocks = 0;
  int64_t kv_block_size = 0;
};

// The message for `batch`: its arrays, and one descriptor per override. With
// kInline the override values (and DeepStack features) are copied into
// inline_floats; with kSharedBuffer each override's values, its features
// right after them, must lie in [buffer, buffer + bytes) (InvalidArgument
// otherwise) and become byte offsets into it.
[[nodiscard]] absl::StatusOr<StepMessage> StepMessageFromBatch(
    const model::ForwardBatch& batch, int64_t hidden_size, EmbeddingPlacement placement,
    absl::Span<const uint8_t> shared_buffer = {});

// Bytes EncodeStep writes for m.
size_t EncodedStepBytes(const StepMessage& m);
// Writes m into out; ResourceExhausted if it does not fit.
[[nodiscard]] absl::StatusOr<size_t> EncodeStep(const StepMessage& m, absl::Span<uint8_t> out);
// Reads a message written by EncodeStep; DataLoss if it is malformed.
[[nodiscard]] absl::Status DecodeStep(absl::Span<const uint8_t> in, StepMessage* m);

// Points m->batch.embedding_overrides at each descriptor's floats (in
// m->inline_floats or shared_buffer). InvalidArgument for a length other
// than hidden_size * (1 + deepstack_layers) or a range outside its buffer.
[[nodiscard]] absl::Status ResolveEmbeddings(absl::Span<const uint8_t> shared_buffer,
                                             int64_t hidden_size, StepMessage* m);

}  // namespace mmserve::worker

#endif  // MMSERVE_WORKER_STEP_MESSAGE_H_
