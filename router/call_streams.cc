// GenerateCall's token streams: opening the placement's streams, the
// carrier chain they relay, and their ends (generate_call.h).
#include <utility>

#include "common/grpc_status.h"
#include "common/logging.h"
#include "router/generate_call.h"
#include "router/token_stream.h"

namespace mmserve::router {
namespace {

// A batch that gives the client nothing and moves nothing on.
bool Empty(const internal::v1::TokenBatch& batch) {
  return batch.token_ids_size() == 0 && batch.text().empty() && batch.lost_images_size() == 0 &&
         !batch.has_elastic_moved() && !batch.kv_handed_off() &&
         batch.finish_reason() == mmserve::v1::FINISH_REASON_UNSPECIFIED;
}

}  // namespace

template <typename Request>
void GenerateCall::OpenStream(size_t i, Request request) {
  auto stream = std::make_shared<TokenStream<Request>>(
      std::move(request), deadline_,
      TokenStreamHandlers{
          .on_batch = [self = shared_from_this(),
                       i](const internal::v1::TokenBatch& b) { self->OnStreamBatch(i, b); },
          .on_done = [self = shared_from_this(),
                      i](const grpc::Status& s) { self->OnStreamDone(i, s); }});
  // The stream lives until its on_done, which cannot run before this call's
  // reference inside it is dropped there.
  cancels_[i] = [stream] { stream->Cancel(); };
  deferred_.Defer(
      [stream, lang = placement_.instances[i]] { stream->Begin(stream, *lang->language); });
}

void GenerateCall::StartLanguage(internal::v1::PrefillRequest prefill) {
  const std::vector<std::shared_ptr<Instance>>& instances = placement_.instances;
  cancels_.resize(instances.size());
  switch (placement_.flow) {
    case Placement::Flow::kColocated:
      PrepareMigration(prefill);
      Advance(CallEvent::kPrefillStarted);
      CountCriticalRoundTrip();
      OpenStream(0, std::move(prefill));
      return;
    case Placement::Flow::kDisaggregated: {
      // The decode instance holds the request first (its empty first
      // batch); then the prefill stream opens (StartPrefill).
      prefill.mutable_decode()->set_instance_id(instances[1]->id);
      prefill.mutable_decode()->set_address(instances[1]->address);
      pending_prefill_ = std::move(prefill);
      internal::v1::DecodeRequest d;
      d.set_request_id(id_);
      d.set_model(context_.options.model_id);
      *d.mutable_sampling() = request_.sampling();
      *d.mutable_stream() = request_.stream();
      CountCriticalRoundTrip();
      OpenStream(1, std::move(d));
      return;
    }
    case Placement::Flow::kElastic:
      break;
  }
  Advance(CallEvent::kPrefillStarted);
  // A transfer has one receiver: every member past the first gets copies of
  // the images, all dispatched before any stream starts.
  std::vector<size_t> images;
  for (const auto& image : prefill.images()) images.push_back(image.image_index());
  std::vector<std::vector<internal::v1::PromptImage>> copies(instances.size());
  for (size_t m = 1; m < instances.size() && !images.empty(); ++m) {
    absl::StatusOr<std::vector<internal::v1::PromptImage>> c = CopyImages(images);
    if (!c.ok()) {
      End(c.status());
      return;
    }
    copies[m] = *std::move(c);
  }
  for (size_t m = 0; m < instances.size(); ++m) {
    internal::v1::ElasticPrefillRequest request;
    *request.mutable_request() = prefill;
    if (m > 0 && !images.empty()) {
      request.mutable_request()->clear_images();
      for (auto& c : copies[m]) *request.mutable_request()->add_images() = std::move(c);
    }
    *request.mutable_plan() = *placement_.plan;
    request.set_member(static_cast<uint32_t>(m));
    OpenStream(m, std::move(request));
  }
}

void GenerateCall::StartPrefill() {
  Advance(CallEvent::kPrefillStarted);
  CountCriticalRoundTrip();
  internal::v1::PrefillRequest prefill = std::move(*pending_prefill_);
  pending_prefill_.reset();
  OpenStream(0, std::move(prefill));
}

void GenerateCall::RetryImages(std::vector<internal::v1::PromptImage> images) {
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
  if (placement_.flow != Placement::Flow::kElastic) {
    // Colocated: the instance carrying the stream (a migration's new one).
    const bool colocated = placement_.flow == Placement::Flow::kColocated;
    SendRetryImages(placement_.instances[colocated ? chain_->carrier() : 0], std::move(images));
    return;
  }
  std::vector<size_t> indices;
  for (const auto& image : images) indices.push_back(image.image_index());
  for (size_t m = 1; m < placement_.instances.size(); ++m) {
    absl::StatusOr<std::vector<internal::v1::PromptImage>> copies = CopyImages(indices);
    if (!copies.ok()) {
      End(copies.status());
      return;
    }
    SendRetryImages(placement_.instances[m], *std::move(copies));
  }
  SendRetryImages(placement_.instances[0], std::move(images));
}

const char* GenerateCall::StreamRole(size_t i) const {
  switch (placement_.flow) {
    case Placement::Flow::kColocated:
      return "language";
    case Placement::Flow::kDisaggregated:
      return i == 0 ? "language" : "decode";
    case Placement::Flow::kElastic:
      return "elastic member";
  }
  return "language";
}

void GenerateCall::CancelStreams() {
  // Also on OK: a first token that ended a P/D request leaves the decode
  // instance's registration open, and an elastic member may still keep
  // its span.
  for (auto& cancel : cancels_) {
    if (cancel) deferred_.Defer(std::move(cancel));
  }
  cancels_.assign(cancels_.size(), nullptr);
}

void GenerateCall::OnStreamBatch(size_t i, const internal::v1::TokenBatch& batch) {
  {
    absl::MutexLock lock(&mu_);
    LockedOnStreamBatch(i, batch);
  }
  deferred_.Run();
}

void GenerateCall::LockedOnStreamBatch(size_t i, const internal::v1::TokenBatch& batch) {
  if (phase_ == CallPhase::kEnded || Abandoned(i)) return;
  if (pending_prefill_ && i == 1) {
    StartPrefill();  // the first batch: the decode instance holds the request
    return;
  }
  if (batch.lost_images_size() > 0) {
    RelayBatch(batch);  // from any stream with images: they move
    return;
  }
  if (Empty(batch)) return;
  if (chain_->OnBatch(i, batch) == CarrierChain::Route::kCarry) Carry(batch);
}

void GenerateCall::Carry(const internal::v1::TokenBatch& batch) {
  if (phase_ == CallPhase::kEnded || phase_ == CallPhase::kFinalHeld) return;
  const bool hands_over = chain_->HandsOver(batch);
  if (batch.has_elastic_moved()) {
    if (!hands_over || !chain_->HasNext()) {
      End(absl::InternalError(chain_->HasNext() ? "an elastic member moved the master out of turn"
                                                : "the last elastic master moved on"));
      return;
    }
    MoveCarrier(&batch.elastic_moved());
    return;
  }
  RelayBatch(batch);
  if (hands_over && chain_->HasNext() && phase_ != CallPhase::kEnded &&
      phase_ != CallPhase::kFinalHeld) {
    MoveCarrier(nullptr);
  }
}

void GenerateCall::MoveCarrier(const internal::v1::ElasticMasterState* state) {
  CarrierChain::Held held = chain_->Advance();
  const size_t carrier = chain_->carrier();
  if (!Advance(CallEvent::kCarrierMoved)) return;
  if (state != nullptr) SendMoveMaster(carrier, *state);
  for (const auto& b : held.batches) Carry(b);
  // Its close, once what it sent is replayed (which may have moved the
  // chain on again: then the close routes as a former carrier's).
  if (held.closed_ok && phase_ != CallPhase::kEnded) LockedOnStreamDone(carrier, grpc::Status::OK);
}

void GenerateCall::SendMoveMaster(size_t next, const internal::v1::ElasticMasterState& state) {
  auto request = std::make_shared<internal::v1::ElasticMoveRequest>();
  request->set_request_id(id_);
  *request->mutable_state() = state;
  auto ctx = std::make_shared<grpc::ClientContext>();
  ctx->set_deadline(deadline_);
  auto ack = std::make_shared<internal::v1::ElasticMoveAck>();
  deferred_.Defer(
      [self = shared_from_this(), lang = placement_.instances[next], next, ctx, request, ack] {
        lang->language->async()->ElasticMoveMaster(ctx.get(), request.get(), ack.get(),
                                                   [self, next, ctx, request, ack](grpc::Status s) {
                                                     if (!s.ok()) self->OnMoveFailed(next, s);
                                                   });
      });
}

void GenerateCall::OnMoveFailed(size_t i, const grpc::Status& status) {
  {
    absl::MutexLock lock(&mu_);
    LOG(WARNING) << "ElasticMoveMaster " << id_ << ": " << status.error_message();
    if (phase_ != CallPhase::kEnded) {
      LastStreamClosed(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the master move failed"),
                       StreamRole(i), placement_.instances[i]->id);
    }
  }
  deferred_.Run();
}

void GenerateCall::OnStreamDone(size_t i, const grpc::Status& status) {
  {
    absl::MutexLock lock(&mu_);
    cancels_[i] = nullptr;
    LockedOnStreamDone(i, status);
  }
  deferred_.Run();
}

void GenerateCall::LockedOnStreamDone(size_t i, const grpc::Status& status) {
  if (phase_ == CallPhase::kEnded || Abandoned(i)) return;
  if (placement_.flow == Placement::Flow::kElastic && phase_ == CallPhase::kPrefilling) {
    switch (echoes_.OnClosed(i, status, cancels_)) {  // the member that gave up says why
      case ElasticEchoHold::Next::kHold:
        return;
      case ElasticEchoHold::Next::kEndHeld:
        LastStreamClosed(echoes_.held(), StreamRole(echoes_.held_member()),
                         placement_.instances[echoes_.held_member()]->id);
        return;
      case ElasticEchoHold::Next::kAsUsual:
        break;
    }
  }
  if (!status.ok()) {
    // A stream the router did not cancel (the call has not ended) that
    // ends CANCELLED was cancelled by its instance.
    const grpc::StatusCode code = status.error_code();
    if ((code == grpc::StatusCode::UNAVAILABLE || code == grpc::StatusCode::UNKNOWN ||
         code == grpc::StatusCode::CANCELLED) &&
        MaybeMigrate(i, FromGrpcStatus(status))) {
      return;
    }
    LastStreamClosed(status, StreamRole(i), placement_.instances[i]->id);
    return;
  }
  if (chain_->OnClosedOk(i) != CarrierChain::Route::kCarry) return;
  // The carrier closed OK: its turn is over (an elastic sampler without a
  // first token), or it was the last stream the call waits for.
  if (phase_ != CallPhase::kFinalHeld && chain_->ClosingHandsOver() && chain_->HasNext()) {
    MoveCarrier(nullptr);
    return;
  }
  LastStreamClosed(status, StreamRole(i), placement_.instances[i]->id);
}

// A migration's resumed stream opens from generate_call_migrate.cc.
template void GenerateCall::OpenStream<internal::v1::PrefillRequest>(size_t,
                                                                     internal::v1::PrefillRequest);

}  // namespace mmserve::router
