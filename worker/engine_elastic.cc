// LlmEngine::PrepareElastic, StartMastering, StopMastering and GrowMasterSpan,
// and ElasticRequest (engine_elastic.h).
#include "worker/engine_elastic.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "common/status_macros.h"
#include "worker/engine.h"
#include "worker/engine_live.h"

namespace mmserve::worker {
namespace {

// A master's span that cannot grow (the client's reason: no internals).
constexpr char kNoRoomToGrow[] = "the KV cache has no room for the request's next tokens";

}  // namespace

ElasticRequest::ElasticRequest(Parts parts)
    : id_(std::move(parts.id)),
      token_ids_(std::move(parts.token_ids)),
      positions_(std::move(parts.positions)),
      owned_rows_(std::move(parts.owned_rows)),
      runner_(std::move(parts.runner)),
      sampler_(runner_.sampling.seed),
      streamer_(std::move(parts.streamer)),
      params_(std::move(parts.params)) {
  params_.prompt_token_ids.clear();  // token_ids_ holds the prompt
  runner_.sampler = &sampler_;
  runner_.prompt_positions = &positions_;
}

ElasticRequest::MasterState ElasticRequest::ExportState() const {
  return {.generated = generated_,
          .seed = runner_.sampling.seed,
          .draws = draws_,
          .mrope_delta = positions_.delta};
}

ElasticRequest::Parts ElasticRequest::TakeParts(std::vector<int32_t>* generated,
                                                uint64_t* draws) && {
  *generated = std::move(generated_);
  *draws = draws_;
  scheduler::RequestParams params = std::move(params_);
  params.prompt_token_ids = token_ids_;
  return {.id = std::move(id_),
          .token_ids = std::move(token_ids_),
          .positions = std::move(positions_),
          .owned_rows = std::move(owned_rows_),
          .runner = std::move(runner_),
          .streamer = std::move(streamer_),
          .params = std::move(params)};
}

absl::StatusOr<StreamEvent> LlmEngine::FirstElasticToken(ElasticRequest& request,
                                                         const ElasticFirstToken& first) {
  if (!request.generated_.empty()) {
    return absl::FailedPreconditionError("the request has its first token already");
  }
  RunnerRequestState& runner = request.runner_;
  const bool sampled_here = !first.logits.empty();
  model::SampleResult s;
  if (sampled_here) {
    std::vector<float> scratch;
    s = SampleNext(runner, request.token_ids_, {}, first.logits, &scratch);
  } else {
    if (first.token < 0 || first.token >= rules_.vocab_size) {
      return absl::InvalidArgumentError("a token outside the vocabulary");
    }
    s.token = first.token;
    if (!runner.sampling.greedy()) request.sampler_.Uniform();  // as if sampled here
  }
  if (!runner.sampling.greedy()) ++request.draws_;  // one draw per non-greedy sample
  request.generated_.push_back(s.token);
  // The scheduler's finish rules (eos, stop ids, max_tokens) over the token.
  const FinishReason finished = scheduler::Request(request.params_, 0).AppendOutputToken(s.token);
  StreamEvent event;
  event.request_id = request.id_;
  ASSIGN_OR_RETURN(const FinishReason why,
                   TokenEvent(runner, *request.streamer_, s, 1, finished, &event));
  if (why == FinishReason::kAbort) return event.error;  // the grammar refused it
  event.finish_reason = why;
  if (why != FinishReason::kNone && why != FinishReason::kStopString) {
    event.text += request.streamer_->Finish();
  }
  event.prompt_tokens = static_cast<int>(request.prompt_len());
  event.completion_tokens = 1;
  if (!sampled_here) {  // the sampler's stream carries the token
    event.token_ids.clear();
    event.logprobs.clear();
    event.text.clear();
  }
  return event;
}

absl::StatusOr<std::unique_ptr<ElasticRequest>> LlmEngine::PrepareElastic(EngineRequest request) {
  if (m_->tp_group != nullptr) {
    return absl::UnimplementedError("elastic groups need tp_size 1 for now");
  }
  scheduler::RequestParams params;
  PromptRules rules = rules_;
  rules.max_model_len = m_->sizing.context_len;
  ASSIGN_OR_RETURN(std::unique_ptr<Live> live, Prepare(request, nullptr, KvPlan{}, &params, rules));
  ElasticRequest::Parts parts{.id = live->id,
                              .token_ids = params.prompt_token_ids,
                              .positions = std::move(live->positions),
                              .owned_rows = std::move(live->image_embeddings),
                              .runner = std::move(live->runner),
                              .streamer = std::move(live->streamer),
                              .params = std::move(params)};
  return std::make_unique<ElasticRequest>(std::move(parts));
}

absl::Status LlmEngine::StartMastering(std::unique_ptr<ElasticRequest> request,
                                       const ElasticRequest::MasterState& state,
                                       const MasterSpan& span, StreamCallback callback) {
  auto it = requests_.find(request->id());
  if (it == requests_.end() || !it->second->holds_span) {
    return absl::NotFoundError("no span of that request is held here");
  }
  if (state.mrope_delta != request->positions().delta) {
    return absl::InvalidArgumentError("the master state's M-RoPE delta differs");
  }
  // One draw per sample at most; the bound keeps a bad state from looping.
  if (state.generated.empty() || state.draws > state.generated.size()) {
    return absl::InvalidArgumentError("the master state has no token or too many draws");
  }
  for (int32_t t : state.generated) {
    if (t < 0 || t >= rules_.vocab_size) {
      return absl::InvalidArgumentError("a token outside the vocabulary");
    }
  }
  std::vector<int32_t> have;
  uint64_t draws = 0;
  ElasticRequest::Parts parts = std::move(*request).TakeParts(&have, &draws);
  // Tokens generated here already (the group's sampler: the first) must
  // begin the state's; the rest are replayed (their text was streamed by
  // the earlier masters; none may end the request).
  if (have.size() > state.generated.size() ||
      !std::equal(have.begin(), have.end(), state.generated.begin())) {
    return absl::InvalidArgumentError("the master state does not continue this request's tokens");
  }
  auto live = std::make_unique<Live>();
  live->id = parts.id;
  live->sched_id = it->second->sched_id;
  live->callback = std::move(callback);
  live->runner = std::move(parts.runner);
  live->positions = std::move(parts.positions);
  live->image_embeddings = std::move(parts.owned_rows);
  live->streamer = std::move(parts.streamer);
  live->prompt_tokens = static_cast<int>(parts.token_ids.size());
  live->completion_tokens = static_cast<int>(state.generated.size());
  for (size_t k = have.size(); k < state.generated.size(); ++k) {
    const int32_t token = state.generated[k];
    ASSIGN_OR_RETURN(const bool complete, AdvanceGrammar(live->runner, token));
    ASSIGN_OR_RETURN(const model::TextStreamer::Step text,
                     live->streamer->Push(token, static_cast<int>(k) + 1));
    if (complete || text.stopped) {
      return absl::InvalidArgumentError("the master state's tokens end the request");
    }
  }
  // The random stream is the state's: its seed (a request without one has
  // a seed drawn per member), at its draws.
  live->runner.sampling.seed = state.seed;
  live->sampler = model::SamplerState(state.seed);
  for (live->draws = 0; live->draws < state.draws; ++live->draws) live->sampler.Uniform();
  live->runner.sampler = &live->sampler;
  live->runner.prompt_positions = &live->positions;
  RETURN_IF_ERROR(scheduler_->StartMastering(live->sched_id, std::move(parts.params),
                                             static_cast<int>(span.kv_begin), state.generated,
                                             span.decode_group));
  by_scheduler_id_[live->sched_id.value] = live.get();
  it->second = std::move(live);
  return absl::OkStatus();
}

absl::StatusOr<ElasticRequest::MasterState> LlmEngine::StopMastering(const std::string& id) {
  auto it = requests_.find(id);
  const scheduler::Request* r =
      it == requests_.end() ? nullptr : scheduler_->Find(it->second->sched_id);
  if (r == nullptr || r->status() != scheduler::RequestStatus::kMastering) {
    return absl::NotFoundError("no request of that id is mastered here");
  }
  Live& live = *it->second;
  const absl::Span<const int32_t> out = r->output_token_ids();
  ElasticRequest::MasterState state{.generated = std::vector<int32_t>(out.begin(), out.end()),
                                    .seed = live.runner.sampling.seed,
                                    .draws = live.draws,
                                    .mrope_delta = live.positions.delta};
  RETURN_IF_ERROR(scheduler_->StopMastering(live.sched_id));
  by_scheduler_id_.erase(live.sched_id.value);
  auto holder = std::make_unique<Live>();
  holder->id = id;
  holder->sched_id = live.sched_id;
  holder->holds_span = true;
  it->second = std::move(holder);
  return state;
}

bool LlmEngine::MasterSpanFull(const std::string& id) const {
  auto it = requests_.find(id);
  if (it == requests_.end() || it->second->holds_span) return false;
  const scheduler::Request* r = scheduler_->Find(it->second->sched_id);
  return r != nullptr && r->status() == scheduler::RequestStatus::kMastering &&
         !scheduler_->HasDecodeSlot(it->second->sched_id);
}

absl::StatusOr<std::vector<kvpool::BlockId>> LlmEngine::GrowMasterSpan(const std::string& id,
                                                                       int64_t end) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return absl::NotFoundError("no request of that id is mastered here");
  auto blocks = scheduler_->GrowSpan(it->second->sched_id, end);
  if (absl::IsResourceExhausted(blocks.status()) &&
      !scheduler_->HasDecodeSlot(it->second->sched_id)) {
    RETURN_IF_ERROR(AbortUnrecomputable({{id, absl::ResourceExhaustedError(kNoRoomToGrow)}}));
  }
  return blocks;
}

}  // namespace mmserve::worker
