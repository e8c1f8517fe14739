// Private to the engine (engine*.cc): a request's state outside the
// scheduler.
#ifndef MMSERVE_WORKER_ENGINE_LIVE_H_
#define MMSERVE_WORKER_ENGINE_LIVE_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "model/mrope_positions.h"
#include "model/sampling.h"
#include "model/text_streamer.h"
#include "scheduler/request.h"
#include "worker/engine.h"

namespace mmserve::worker {

struct LlmEngine::Live {
  std::string id;
  scheduler::RequestId sched_id;
  StreamCallback callback;
  model::SamplerState sampler{0};
  uint64_t draws = 0;  // taken from sampler (one per non-greedy sample)
  RunnerRequestState runner;
  model::MropePositions positions;
  std::vector<std::vector<float>> image_embeddings;  // owned rows (shared ones are not here)
  std::unique_ptr<model::TextStreamer> streamer;
  int prompt_tokens = 0;
  int completion_tokens = 0;
  // Prompt tokens whose KV came from the prefix cache, at the admission that
  // sampled the first token (or the remote reservation).
  int cached_prompt_tokens = 0;
  // A span of a group's KV kept for another instance's decode (HoldSpan):
  // only id and sched_id are set.
  bool holds_span = false;
  // Images without rows (MediaEmbedding::cached) end by this prompt token;
  // their blocks stay pinned (Scheduler::PinCachedPrefix) until it ends.
  int cached_media_end = 0;
  std::optional<kvpool::BlockTableId> pin;
  KvPlan plan;            // the connector's (none: local prompt, decoded here)
  HandoffPrompt handoff;  // plan.prompt_only: what a decode engine reserves
};

struct LlmEngine::Sampled {
  Live* live = nullptr;
  model::SampleResult result;
  // Why the scheduler finished it this step (kNone: it goes on).
  FinishReason finished = FinishReason::kNone;
  std::vector<int32_t> blocks;  // plan.prompt_only: its prompt's KV blocks
};

// The event of token `s` (a request's `completion`-th): its text and
// log-probabilities, and why it ends the request: `finished` (the
// scheduler's rules), kStop for a complete constrained output, kStopString
// (event->matched_stop), or kAbort with event->error when the grammar
// refuses it. The one emit rule of every sampled token (Emit's, and an elastic
// group's first: FirstElasticToken).
absl::StatusOr<FinishReason> TokenEvent(RunnerRequestState& runner, model::TextStreamer& streamer,
                                        const model::SampleResult& s, int completion,
                                        FinishReason finished, StreamEvent* event);

// The tokens a resumed request generated elsewhere
// (EngineRequest::resume_output_token_ids) replayed as if sampled here: the
// scheduler's finish rules, the grammar, the text stream (their text was
// streamed there) and one draw of runner.sampler each unless greedy
// (counted in `draws`); they become params' first outputs. Returns how many;
// InvalidArgument when they leave no room below max_tokens, lie outside the
// vocabulary or one of them ends the request, and when the request is not
// decoded here (`decoded_here` false: a prompt handed off or received).
absl::StatusOr<int> ReplayResumed(absl::Span<const int32_t> tokens, bool decoded_here,
                                  int vocab_size, RunnerRequestState& runner,
                                  model::TextStreamer& streamer, uint64_t& draws,
                                  scheduler::RequestParams& params);

}  // namespace mmserve::worker

#endif  // MMSERVE_WORKER_ENGINE_LIVE_H_
