// Role elastic: a request that an elastic-sequence-parallelism
// group prefills, prepared by LlmEngine::PrepareElastic exactly as AddRequest
// would prepare it (tokens, image rows and M-RoPE positions, max_tokens,
// sampling, stop ids and strings) but not queued: the group's member runs
// its rows through Qwen2Model::ForwardElasticPrefill; the group's first token
// goes through the engine's sampling and emit path (LlmEngine::FirstElasticToken:
// sampled on the sampler, taken as sampled on the others); the master then
// hands it to the engine (LlmEngine::StartMastering), which decodes it in its
// batch, with its sampler and text stream, as any request (its KV spread:
// MasterPeers).
//
//   ASSIGN_OR_RETURN(std::unique_ptr<ElasticRequest> r, engine.PrepareElastic(std::move(request)));
//   // ... ForwardElasticPrefill over r->token_ids(), r->positions(), r->images() ...
//   ASSIGN_OR_RETURN(StreamEvent e, engine.FirstElasticToken(*r, {.logits = last_row}));
//   // e.finish_reason: done?
//   const ElasticRequest::MasterState state = r->ExportState();
//   RETURN_IF_ERROR(engine.StartMastering(std::move(r), state, span, callback));
//
// Not thread-safe: the engine's thread uses it.
#ifndef MMSERVE_WORKER_ENGINE_ELASTIC_H_
#define MMSERVE_WORKER_ENGINE_ELASTIC_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "model/elastic.h"
#include "model/mrope_positions.h"
#include "model/sampling.h"
#include "model/text_streamer.h"
#include "scheduler/request.h"
#include "worker/engine_request.h"
#include "worker/model_runner.h"

namespace mmserve::worker {

class LlmEngine;

class ElasticRequest {
 public:
  // The parts LlmEngine::PrepareElastic made (engine_elastic.cc).
  struct Parts {
    std::string id;
    std::vector<int32_t> token_ids;  // the expanded prompt
    model::MropePositions positions;
    std::vector<std::vector<float>> owned_rows;  // image rows runner points into
    RunnerRequestState runner;                   // sampling, eos ids, image rows
    std::unique_ptr<model::TextStreamer> streamer;
    scheduler::RequestParams params;  // stop ids, eos, max_tokens
  };
  explicit ElasticRequest(Parts parts);

  const std::string& id() const { return id_; }
  const std::vector<int32_t>& token_ids() const { return token_ids_; }
  int64_t prompt_len() const { return static_cast<int64_t>(token_ids_.size()); }
  const model::MropePositions& positions() const { return positions_; }
  // Image k covers prompt rows [image_offsets[k], + image_lengths[k]),
  // hidden_size floats each.
  const RunnerRequestState& runner() const { return runner_; }
  const model::SamplingParams& sampling() const { return runner_.sampling; }
  int max_tokens() const { return params_.max_tokens; }
  // Tokens generated so far (the group's first, once FirstElasticToken took it).
  int num_generated() const { return static_cast<int>(generated_.size()); }
  // Structured output: the request's grammar (null when unconstrained), for
  // a MaskWorker to compute its next mask while the forward runs.
  RequestGrammar* grammar() const { return runner_.grammar.get(); }

  // What the next master needs to continue (a master move).
  struct MasterState {
    std::vector<int32_t> generated;  // every generated token, in order
    uint64_t seed = 0;
    uint64_t draws = 0;  // taken from the random stream so far
    int32_t mrope_delta = 0;
  };
  MasterState ExportState() const;
  // LlmEngine::StartMastering's: the parts, the generated tokens in
  // `*generated` and the sampler's draws in `*draws`.
  Parts TakeParts(std::vector<int32_t>* generated, uint64_t* draws) &&;

 private:
  std::string id_;
  std::vector<int32_t> token_ids_;
  model::MropePositions positions_;
  std::vector<std::vector<float>> owned_rows_;
  RunnerRequestState runner_;
  model::SamplerState sampler_;
  uint64_t draws_ = 0;  // sampler_'s draws
  std::vector<int32_t> generated_;
  std::unique_ptr<model::TextStreamer> streamer_;
  scheduler::RequestParams params_;  // stop ids, eos, max_tokens (the scheduler's finish rules)

  friend class LlmEngine;  // FirstElasticToken samples and emits through these
};

// The group's first token of a request, for LlmEngine::FirstElasticToken: the
// logits of the prompt's last row (the group's sampler samples it), or the
// token the sampler sampled (empty logits).
struct ElasticFirstToken {
  absl::Span<float> logits;
  int32_t token = -1;
};

// Where a request mastered here keeps its KV: its span, held under its id
// (LlmEngine::HoldSpan), holds tokens from kv_begin on (the others' KV is on
// the group's other members).
struct MasterSpan {
  int64_t kv_begin = 0;
  // Requests of one decode group share their span holders and decode in
  // one step (the groups take turns).
  uint64_t decode_group = 0;
};

// The span holders of the requests an engine masters (role elastic: an
// instance's elastic groups). Called on the engine's thread.
class MasterPeers {
 public:
  virtual ~MasterPeers() = default;
  // The peers that answer for the rows of `ids` (mastered here, of one
  // decode group, in batch order) in the coming step; an error fails those
  // requests (their final event carries it), not the step.
  [[nodiscard]] virtual absl::StatusOr<model::SpanAttentionPeers*> ForStep(
      absl::Span<const std::string> ids) = 0;
};

}  // namespace mmserve::worker

#endif  // MMSERVE_WORKER_ENGINE_ELASTIC_H_
