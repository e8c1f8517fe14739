// The model runner's step (prepare + execute + sample): turns the
// scheduler's decision into one ForwardBatch (token ids, M-RoPE positions,
// slot mapping, block tables, image-embedding overrides, logits rows), runs
// the model, and samples one token for every entry whose chunk reaches the
// end of its known tokens.
//
//   ModelRunner runner(model, kv_cache);
//   const SchedulerOutput& out = scheduler.Schedule();
//   ASSIGN_OR_RETURN(std::vector<SampleResult> sampled,
//                    runner.Step(out, scheduler.kv_cache(), lookup));
//   // sampled[i] belongs to out.scheduled[i] (meaningless unless it samples)
//
// Per-request inputs the scheduler does not hold (sampling parameters and
// generator, prompt positions, image embeddings, grammar) come from
// `lookup`. The grammar masks of the entries that sample are computed on a
// helper thread while the forward runs, and joined before sampling.
// Not thread-safe: one engine thread drives it.
#ifndef MMSERVE_WORKER_MODEL_RUNNER_H_
#define MMSERVE_WORKER_MODEL_RUNNER_H_

#include <functional>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "kvpool/kv_cache_manager.h"
#include "model/forward_batch.h"
#include "model/kv_cache.h"
#include "model/mrope_positions.h"
#include "model/qwen2_model.h"
#include "model/sampling.h"
#include "scheduler/scheduler_output.h"
#include "worker/request_grammar.h"
#include "worker/step_ring.h"

namespace mmserve::worker {

// What the runner needs to know about one request.
struct RunnerRequestState {
  model::SamplingParams sampling;
  model::SamplerState* sampler = nullptr;
  // M-RoPE positions of the prompt; later tokens sit at index + delta.
  const model::MropePositions* prompt_positions = nullptr;
  // Image embeddings in prompt order: image k covers prompt tokens
  // [image_offsets[k], + image_lengths[k]), each token a row of hidden_size
  // floats and then its deepstack_levels DeepStack features.
  std::vector<int> image_offsets;
  std::vector<int> image_lengths;
  std::vector<const float*> image_embeddings;
  int deepstack_levels = 0;            // Qwen3-VL's (ModelConfig::DeepstackLevels)
  std::vector<uint64_t> image_hashes;  // per image: its content hash (low half), or 0
  std::vector<int32_t> eos_token_ids;  // masked until min_tokens are out
  // sampling.constraint compiled: where the output stands in its grammar.
  std::unique_ptr<RequestGrammar> grammar;
};

using RunnerLookup = std::function<RunnerRequestState*(scheduler::RequestId)>;

// Batch row `row`'s input: token `at` of image k of `st` (the main
// embedding and its DeepStack features).
model::EmbeddingOverride ImageOverride(const RunnerRequestState& st, size_t k, int64_t at,
                                       int64_t row, int64_t hidden);

// A request's next token from its row of logits: the one sampling step that
// the engine's runner and an elastic group's sampler and master share.
// Before min_tokens, end-of-sequence and stop ids are masked in `logits`
// (with a grammar, only while its output is incomplete); logit_bias and the
// penalties (over `prompt` and `output`, the request's tokens so far), then
// the grammar's mask, apply to a copy in `*scratch`; st.sampler draws. Log
// probabilities are those of `logits` (the model's, as masked). The
// grammar is not advanced here: the caller accepts the token it keeps.
model::SampleResult SampleNext(const RunnerRequestState& st, absl::Span<const int32_t> prompt,
                               absl::Span<const int32_t> output, absl::Span<float> logits,
                               std::vector<float>* scratch);

// Advances st's grammar (if any) over `token`, which the request just
// generated: true when the output is then complete and nothing but the end
// may follow (the request ends, finish reason stop). An end-of-sequence
// token is not advanced over (it ends the request anyway). InvalidArgument
// when the grammar does not allow `token` (its mask allowed no token of
// this vocabulary).
[[nodiscard]] absl::StatusOr<bool> AdvanceGrammar(RunnerRequestState& st, int32_t token);

class ModelRunner {
 public:
  // `model` and `kv` (and `ring`) must outlive the runner. With a ring (rank
  // 0 of a tensor-parallel instance) each step is sent to the other ranks
  // first (as ForwardOnAllRanks): when every image row of the step lies in
  // `shared_input` (memory every rank maps) as descriptors,
  // otherwise inline.
  ModelRunner(model::Qwen2Model& model, model::KvCache& kv, StepRing* ring = nullptr,
              absl::Span<const uint8_t> shared_input = {})
      : model_(model), kv_(kv), ring_(ring), shared_input_(shared_input) {}

  // One forward and a sample per entry that samples. kMastering entries
  // (role elastic: their KV spread over span holders, model::ForwardSpread)
  // decode beside the others with `peers` answering for their rows; when
  // `peers` is null or fails them, the step runs without them and
  // *spread_status (required with such entries) says why: their results
  // are then token kvpool::kNoToken. The other entries' results are the
  // same either way.
  [[nodiscard]] absl::StatusOr<std::vector<model::SampleResult>> Step(
      const scheduler::SchedulerOutput& out, const kvpool::KvCacheManager& kv_manager,
      const RunnerLookup& lookup, model::SpanAttentionPeers* peers = nullptr,
      absl::Status* spread_status = nullptr);

  // `hook` becomes the next Step's ForwardBatch::on_layers_written (that
  // Step only; a Step that runs its forward twice calls it twice).
  void set_layer_hook(std::function<void(int)> hook) { layer_hook_ = std::move(hook); }

  // CPU seconds spent putting image rows into steps for the other ranks
  // (their floats, or descriptors into shared_input): the scheduling loop's
  // time on embedding hand-off, in total. The ring's write of inline floats is not
  // included (it is one more copy of the same bytes).
  double embedding_handoff_seconds() const { return handoff_seconds_; }
  // Image rows sent to the other ranks as descriptors into shared memory,
  // and inline in the step, in total.
  int64_t rows_by_descriptor() const { return rows_by_descriptor_; }
  int64_t rows_inline() const { return rows_inline_; }
  // Seconds spent computing grammar masks, and seconds sampling waited for
  // them after the forward, in total.
  double grammar_mask_seconds() const { return masks_ ? masks_->mask_seconds() : 0; }
  double grammar_mask_wait_seconds() const { return masks_ ? masks_->wait_seconds() : 0; }

 private:
  // Step's three parts: the scheduler's decision as batch_ (states_ the
  // entries' runner states), batch_ sent to ranks 1..N-1 through the ring,
  // and one sample per entry that samples, from logits_.
  // with_spread: kMastering entries too (spread_ names their sequences).
  absl::Status BuildBatch(const scheduler::SchedulerOutput& out,
                          const kvpool::KvCacheManager& kv_manager, const RunnerLookup& lookup,
                          bool with_spread);
  absl::Status PublishToRanks();
  std::vector<model::SampleResult> SampleAll(const scheduler::SchedulerOutput& out);

  model::Qwen2Model& model_;
  model::KvCache& kv_;
  StepRing* ring_;
  absl::Span<const uint8_t> shared_input_;
  double handoff_seconds_ = 0;
  int64_t rows_by_descriptor_ = 0;
  int64_t rows_inline_ = 0;
  std::vector<uint64_t> row_hashes_;         // per embedding override of batch_
  std::vector<RunnerRequestState*> states_;  // per entry of the step
  std::vector<bool> in_batch_;               // per entry: batch_ has its rows
  model::SpreadSequences spread_;            // batch_'s kMastering sequences
  model::ForwardBatch batch_;                // reused across steps
  model::ForwardBatch rows_;  // empty between steps (Step swaps image rows through it)
  std::vector<float> logits_;
  std::function<void(int)> layer_hook_;  // the next Step's (set_layer_hook)
  std::vector<float> processed_;         // SampleNext's scratch row
  std::unique_ptr<MaskWorker> masks_;    // from the first constrained step on
};

}  // namespace mmserve::worker

#endif  // MMSERVE_WORKER_MODEL_RUNNER_H_
