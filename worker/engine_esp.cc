// LlmEngine::PrepareEsp and EspRequest (engine_esp.h).
#include "worker/engine_esp.h"

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
  if (num_generated() < runner_.sampling.min_tokens) {
    constexpr float kMasked = -std::numeric_limits<float>::infinity();
    for (int32_t id : runner_.eos_token_ids) logits[id] = kMasked;
    for (int32_t id : runner_.sampling.stop_token_ids) logits[id] = kMasked;
  }
  return model::Sample(logits, runner_.sampling, &sampler_);
}

absl::StatusOr<StreamEvent> EspRequest::Push(const model::SampleResult& s) {
  StreamEvent event;
  event.request_id = id_;
  event.token_ids.push_back(s.token);
  if (runner_.sampling.logprobs >= 0) event.logprobs.push_back(s);
  FinishReason reason = request_.AppendOutputToken(s.token);
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
