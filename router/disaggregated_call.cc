#include "router/disaggregated_call.h"

#include <utility>

namespace mmserve::router {

std::shared_ptr<DisaggregatedCall> DisaggregatedCall::Self() {
  return std::static_pointer_cast<DisaggregatedCall>(shared_from_this());
}

void DisaggregatedCall::StartLanguage(internal::v1::PrefillRequest prefill) {
  prefill.mutable_decode()->set_instance_id(decode_->id);
  prefill.mutable_decode()->set_address(decode_->address);
  pending_prefill_ = std::move(prefill);
  internal::v1::DecodeRequest d;
  d.set_request_id(id_);
  d.set_model(context_.options.model_id);
  *d.mutable_sampling() = request_.sampling();
  *d.mutable_stream() = request_.stream();
  decode_stream_ = std::make_shared<DecodeStream>(
      std::move(d), deadline_,
      TokenStreamHandlers{
          .on_batch = [self =
                           Self()](const internal::v1::TokenBatch& b) { self->OnDecodeBatch(b); },
          .on_done = [self = Self()](const grpc::Status& s) { self->OnDecodeDone(s); }});
  CountCriticalRoundTrip();  // the decode instance's empty first batch
  deferred_.Defer(
      [stream = decode_stream_, dec = decode_] { stream->Begin(stream, *dec->language); });
}

void DisaggregatedCall::StartPrefill() {
  prefill_stream_ = std::make_shared<PrefillStream>(
      std::move(*pending_prefill_), deadline_,
      TokenStreamHandlers{
          .on_batch = [self =
                           Self()](const internal::v1::TokenBatch& b) { self->OnPrefillBatch(b); },
          .on_done = [self = Self()](const grpc::Status& s) { self->OnPrefillDone(s); }});
  pending_prefill_.reset();
  Advance(CallEvent::kPrefillStarted);
  CountCriticalRoundTrip();
  deferred_.Defer(
      [stream = prefill_stream_, lang = prefill_] { stream->Begin(stream, *lang->language); });
}

void DisaggregatedCall::RetryImages(std::vector<internal::v1::PromptImage> images) {
  if (pending_prefill_) {
    // The prefill instance does not know the request yet: it will start
    // with the new sources.
    for (internal::v1::PromptImage& image : images) {
      for (internal::v1::PromptImage& old : *pending_prefill_->mutable_images()) {
        if (old.image_index() == image.image_index()) old = std::move(image);
      }
    }
    return;
  }
  SendRetryImages(prefill_, std::move(images));
}

std::vector<std::shared_ptr<Instance>> DisaggregatedCall::LanguageInstances() const {
  return {prefill_, decode_};
}

void DisaggregatedCall::CancelStreams(const absl::Status& status) {
  if (prefill_stream_ != nullptr && !status.ok()) {
    deferred_.Defer([stream = prefill_stream_] { stream->Cancel(); });
  }
  if (decode_stream_ != nullptr) {
    // Also on OK: a first token that ended the request leaves the decode
    // instance's registration open.
    deferred_.Defer([stream = decode_stream_] { stream->Cancel(); });
  }
}

bool DisaggregatedCall::HandedOff() const { return TokenPhase() == CallPhase::kHandedOff; }

void DisaggregatedCall::OnPrefillBatch(const internal::v1::TokenBatch& batch) {
  {
    absl::MutexLock lock(&mu_);
    LockedOnPrefillBatch(batch);
  }
  deferred_.Run();
}

void DisaggregatedCall::LockedOnPrefillBatch(const internal::v1::TokenBatch& batch) {
  RelayBatch(batch);
  if (!batch.kv_handed_off() || phase() == CallPhase::kEnded) return;
  if (!Advance(CallEvent::kKvHandedOff)) return;
  HeldDecode held = std::move(held_);
  held_ = {};
  for (const auto& b : held.batches) RelayBatch(b);
  if (held.closed_ok) LockedOnDecodeDone(grpc::Status::OK);
}

void DisaggregatedCall::OnPrefillDone(const grpc::Status& status) {
  {
    absl::MutexLock lock(&mu_);
    prefill_stream_.reset();
    // After the hand-off an OK close is the prefill side's normal end.
    if (phase() != CallPhase::kEnded && !(status.ok() && HandedOff())) {
      LastStreamClosed(status, "language", prefill_->id);
    }
  }
  deferred_.Run();
}

void DisaggregatedCall::OnDecodeBatch(const internal::v1::TokenBatch& batch) {
  {
    absl::MutexLock lock(&mu_);
    LockedOnDecodeBatch(batch);
  }
  deferred_.Run();
}

void DisaggregatedCall::LockedOnDecodeBatch(const internal::v1::TokenBatch& batch) {
  if (phase() == CallPhase::kEnded) return;
  if (phase() == CallPhase::kPlacing) {
    StartPrefill();  // the first batch: the decode instance holds the request
    return;
  }
  if (!HandedOff()) {
    held_.batches.push_back(batch);
    return;
  }
  RelayBatch(batch);
}

void DisaggregatedCall::OnDecodeDone(const grpc::Status& status) {
  {
    absl::MutexLock lock(&mu_);
    LockedOnDecodeDone(status);
  }
  deferred_.Run();
}

void DisaggregatedCall::LockedOnDecodeDone(const grpc::Status& status) {
  decode_stream_.reset();
  if (phase() == CallPhase::kEnded) return;
  if (status.ok() && !HandedOff()) {
    held_.closed_ok = true;  // replayed after the hand-off batch
    return;
  }
  LastStreamClosed(status, "decode", decode_->id);
}

}  // namespace mmserve::router
