// LlmEngine::PrepareEsp and EspRequest (engine_esp.h).
#include "worker/engine_esp.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "common/status_macros.h"
#include "worker/engine.h"
#include "worker/engine_live.h"

namespace mmserve::worker {

EspRequest::EspRequest(Parts parts)
    : id_(std::move(parts.id)),
      token_ids_(std::move(parts.token_ids)),
      positions_(std::move(parts.positions)),
      owned_rows_(std::move(parts.owned_rows)),
      runner_(std::move(parts.runner)),
      sampler_(runner_.sampling.seed),
      streamer_(std::move(parts.streamer)),
      request_(std::move(parts.params), 0) {
  runner_.sampler = &sampler_;
  runner_.prompt_positions = &positions_;
}

model::SampleResult EspRequest::Sample(absl::Span<float> logits) {
  if (!runner_.sampling.greedy()) ++draws_;  // model::Sample draws once
  return SampleNext(runner_, request_.prompt_token_ids(), request_.output_token_ids(), logits,
                    &processed_);
}

absl::StatusOr<StreamEvent> EspRequest::PushSampledElsewhere(const model::SampleResult& s) {
  if (!runner_.sampling.greedy()) {
    sampler_.Uniform();
    ++draws_;
  }
  return Push(s);
}

EspRequest::MasterState EspRequest::ExportState() const {
  const absl::Span<const int32_t> out = request_.output_token_ids();
  return {.generated = std::vector<int32_t>(out.begin(), out.end()),
          .seed = runner_.sampling.seed,
          .draws = draws_,
          .mrope_delta = positions_.delta};
}

absl::Status EspRequest::Resume(const MasterState& state) {
  if (state.mrope_delta != positions_.delta) {
    return absl::InvalidArgumentError("the master state's M-RoPE delta differs");
  }
  // One draw per sample at most; the bound keeps a bad state from looping.
  if (state.generated.empty() || state.draws > state.generated.size()) {
    return absl::InvalidArgumentError("the master state has no token or too many draws");
  }
  // Tokens this member generated already (the group's sampler: the first)
  // must begin the state's.
  const absl::Span<const int32_t> have = request_.output_token_ids();
  if (have.size() > state.generated.size() ||
      !std::equal(have.begin(), have.end(), state.generated.begin())) {
    return absl::InvalidArgumentError("the master state does not continue this request's tokens");
  }
  for (size_t k = have.size(); k < state.generated.size(); ++k) {
    model::SampleResult s;
    s.token = state.generated[k];
    ASSIGN_OR_RETURN(const StreamEvent e, Push(s));
    if (e.finish_reason != FinishReason::kNone) {
      return absl::InvalidArgumentError("the master state's tokens end the request");
    }
  }
  // The random stream is the state's: its seed (a request without one
  // has a seed drawn per member), at its draws.
  runner_.sampling.seed = state.seed;
  sampler_ = model::SamplerState(state.seed);
  for (draws_ = 0; draws_ < state.draws; ++draws_) sampler_.Uniform();
  return absl::OkStatus();
}

absl::StatusOr<StreamEvent> EspRequest::Push(const model::SampleResult& s) {
  StreamEvent event;
  event.request_id = id_;
  event.token_ids.push_back(s.token);
  if (runner_.sampling.logprobs >= 0) event.logprobs.push_back(s);
  FinishReason reason = request_.AppendOutputToken(s.token);
  ASSIGN_OR_RETURN(const bool complete, AdvanceGrammar(runner_, s.token));
  if (complete) reason = FinishReason::kStop;
  ASSIGN_OR_RETURN(model::TextStreamer::Step text, streamer_->Push(s.token, num_generated()));
  event.text = std::move(text.text);
  if (text.stopped) {
    reason = FinishReason::kStopString;
    event.matched_stop = text.matched_stop;
  } else if (reason != FinishReason::kNone) {
    event.text += streamer_->Finish();
  }
  event.finish_reason = reason;
  event.prompt_tokens = static_cast<int>(prompt_len());
  event.completion_tokens = num_generated();
  return event;
}

absl::StatusOr<std::unique_ptr<EspRequest>> LlmEngine::PrepareEsp(EngineRequest request) {
  if (m_->tp_group != nullptr) {
    return absl::UnimplementedError("ESP groups need tp_size 1 for now");
  }
  scheduler::RequestParams params;
  PromptRules rules = rules_;
  rules.max_model_len = m_->sizing.context_len;
  ASSIGN_OR_RETURN(std::unique_ptr<Live> live, Prepare(request, nullptr, KvPlan{}, &params, rules));
  EspRequest::Parts parts{.id = live->id,
                          .token_ids = params.prompt_token_ids,
                          .positions = std::move(live->positions),
                          .owned_rows = std::move(live->image_embeddings),
                          .runner = std::move(live->runner),
                          .streamer = std::move(live->streamer),
                          .params = std::move(params)};
  return std::make_unique<EspRequest>(std::move(parts));
}

}  // namespace mmserve::worker
