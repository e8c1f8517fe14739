#include "router/call_messages.h"

#include <utility>

namespace mmserve::router {

internal::v1::PrefillRequest PrefillRequestFor(const mmserve::v1::GenerateRequest& request,
                                               const std::string& id, const std::string& model,
                                               std::vector<internal::v1::PromptImage> images) {
  internal::v1::PrefillRequest prefill;
  prefill.set_request_id(id);
  prefill.set_model(model);
  if (request.has_chat()) {
    *prefill.mutable_chat() = request.chat();
    for (auto& m : *prefill.mutable_chat()->mutable_messages()) {
      for (auto& p : *m.mutable_content()) {
        if (p.has_image()) p.mutable_image()->clear_data();
      }
    }
  } else {
    *prefill.mutable_raw() = request.raw();
    for (auto& im : *prefill.mutable_raw()->mutable_images()) im.clear_data();
  }
  *prefill.mutable_sampling() = request.sampling();
  *prefill.mutable_stream() = request.stream();
  prefill.set_priority(request.priority());
  for (auto& d : images) *prefill.add_images() = std::move(d);
  return prefill;
}

mmserve::v1::GenerateResponse ToResponse(const internal::v1::TokenBatch& batch,
                                         const mmserve::v1::GenerateRequest& request) {
  mmserve::v1::GenerateResponse r;
  r.set_request_id(request.request_id());
  r.set_text(batch.text());
  if (request.stream().include_token_ids()) *r.mutable_token_ids() = batch.token_ids();
  *r.mutable_logprobs() = batch.logprobs();
  if (batch.finish_reason() == mmserve::v1::FINISH_REASON_UNSPECIFIED) return r;
  r.set_finish_reason(batch.finish_reason());
  r.set_matched_stop(batch.matched_stop());
  if (batch.has_usage()) *r.mutable_usage() = batch.usage();
  r.set_seed(batch.seed());
  if (request.stream().include_timing()) *r.mutable_timing() = batch.timing();
  return r;
}

}  // namespace mmserve::router
