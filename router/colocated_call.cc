#include "router/colocated_call.h"

#include <utility>

namespace mmserve::router {

void ColocatedCall::StartLanguage(internal::v1::PrefillRequest prefill) {
  auto self = std::static_pointer_cast<ColocatedCall>(shared_from_this());
  stream_ = std::make_shared<PrefillStream>(
      std::move(prefill), deadline_,
      TokenStreamHandlers{
          .on_batch = [self](const internal::v1::TokenBatch& b) { self->OnBatch(b); },
          .on_done = [self](const grpc::Status& s) { self->OnDone(s); }});
  Advance(CallEvent::kPrefillStarted);
  CountCriticalRoundTrip();
  deferred_.Defer([stream = stream_, lang = prefill_] { stream->Begin(stream, *lang->language); });
}

void ColocatedCall::RetryImages(std::vector<internal::v1::PromptImage> images) {
  SendRetryImages(prefill_, std::move(images));
}

std::vector<std::shared_ptr<Instance>> ColocatedCall::LanguageInstances() const {
  if (prefill_ == nullptr) return {};
  return {prefill_};
}

void ColocatedCall::CancelStreams(const absl::Status& status) {
  // The stream object lives until its OnDone, which cannot run before this
  // call's reference inside it is dropped there.
  if (stream_ != nullptr && !status.ok()) {
    deferred_.Defer([stream = stream_] { stream->Cancel(); });
  }
}

void ColocatedCall::OnBatch(const internal::v1::TokenBatch& batch) {
  {
    absl::MutexLock lock(&mu_);
    RelayBatch(batch);
  }
  deferred_.Run();
}

void ColocatedCall::OnDone(const grpc::Status& status) {
  {
    absl::MutexLock lock(&mu_);
    stream_.reset();
    if (phase() != CallPhase::kEnded) LastStreamClosed(status, "language", prefill_->id);
  }
  deferred_.Run();
}

}  // namespace mmserve::router
