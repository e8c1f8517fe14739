#include "router/generate_call.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/grpc_status.h"
#include "common/logging.h"
#include "proto/language.grpc.pb.h"
#include "router/call_messages.h"
#include "router/public_error.h"
#include "router/tool_grammar.h"

namespace mmserve::router {
namespace {

std::atomic<uint64_t> next_request{1};

std::string AssignId() {
  static const uint64_t salt = static_cast<uint64_t>(MonotonicNanos());
  return absl::StrFormat("req-%x-%d", salt & 0xffffff, next_request.fetch_add(1));
}

}  // namespace

GenerateCall::GenerateCall(Setup setup)
    : context_(*setup.context),
      request_(std::move(setup.request)),
      id_(request_.request_id()),
      deadline_(setup.deadline),
      placer_(std::move(setup.placer)),
      clock_(setup.clock),
      sink_(std::move(setup.sink)),
      encoders_(context_, request_, deadline_, setup.images),
      migration_(context_.options.migration_limit) {}

GenerateCall::~GenerateCall() = default;

std::shared_ptr<GenerateCall> GenerateCall::Start(const RouterContext& context,
                                                  mmserve::v1::GenerateRequest request,
                                                  CallSink sink,
                                                  std::chrono::system_clock::time_point deadline) {
  Setup setup{.context = &context, .sink = std::move(sink), .deadline = deadline};
  if (request.request_id().empty()) request.set_request_id(AssignId());
  absl::StatusOr<std::vector<PreparedMedia>> prepared = PrepareRequest(context.options, request);
  if (prepared.ok()) {
    // A required or named tool choice becomes the output constraint.
    if (absl::Status s = ApplyToolChoice(&request); !s.ok()) prepared = s;
  }
  if (prepared.ok()) {
    setup.images = *std::move(prepared);
    setup.placer = ChoosePlacer(context);
  }
  setup.request = std::move(request);
  const std::vector<PreparedMedia> images = setup.images;
  // Not make_shared: the constructor is private.
  std::shared_ptr<GenerateCall> call(new GenerateCall(std::move(setup)));
  if (!prepared.ok()) {
    {
      absl::MutexLock lock(&call->mu_);
      call->End(prepared.status());
    }
    call->deferred_.Run();
    return call;
  }
  // Outside mu_: a placer may answer inline.
  call->placer_->Place(
      {.id = call->id_, .request = &call->request_, .images = &images, .deadline = deadline},
      [call](absl::StatusOr<Placement> placement) { call->OnPlaced(std::move(placement)); });
  return call;
}

void GenerateCall::OnPlaced(absl::StatusOr<Placement> placement) {
  {
    absl::MutexLock lock(&mu_);
    if (phase_ != CallPhase::kEnded) {
      if (!placement.ok()) {
        End(placement.status());
      } else {
        placement_ = *std::move(placement);
        const uint32_t held = std::min<uint32_t>(placement_.media_on_held_prefix, encoders_.size());
        context_.metrics->media_on_held_prefix.Increment(held);
        context_.metrics->media_not_on_held_prefix.Increment(encoders_.size() - held);
        chain_.emplace(placement_.carriers);
        Run();
      }
    }
  }
  deferred_.Run();
}

void GenerateCall::Run() {
  router_seconds_ = clock_.ElapsedSeconds();
  // The images of messages whose KV the instance holds (the first ones)
  // need no encoder, except in an elastic pool (docs/routing.md).
  const size_t held = context_.options.skip_cached_images && context_.elastic == nullptr &&
                              placement_.flow != Placement::Flow::kElastic
                          ? std::min<size_t>(placement_.media_on_held_prefix, encoders_.size())
                          : 0;
  std::vector<internal::v1::PromptImage> cached;
  std::vector<size_t> encode;
  for (size_t k = 0; k < encoders_.size(); ++k) {
    std::optional<internal::v1::PromptImage> d =
        k < held ? encoders_.ExpectCached(k) : std::nullopt;
    d ? cached.push_back(*std::move(d)) : encode.push_back(k);
  }
  absl::StatusOr<std::vector<internal::v1::PromptImage>> described =
      encoders_.Dispatch(encode, deferred_, OnEncodedCallback());
  if (!described.ok()) {
    End(described.status());
    return;
  }
  described->insert(described->end(), cached.begin(), cached.end());
  std::sort(described->begin(), described->end(),
            [](const auto& a, const auto& b) { return a.image_index() < b.image_index(); });
  StartLanguage(PrefillRequestFor(request_, id_, context_.options.model_id, *std::move(described)));
}

const std::vector<std::shared_ptr<Instance>>& GenerateCall::LanguageInstances() const {
  return placement_.instances;
}

bool GenerateCall::Advance(CallEvent event) {
  std::optional<CallPhase> next = NextPhase(phase_, event);
  if (!next) {
    LOG(WARNING) << "request " << id_ << ": " << EventName(event) << " ignored while "
                 << PhaseName(phase_);
    return false;
  }
  phase_ = *next;
  if (placer_ != nullptr && chain_ && phase_ != CallPhase::kEnded) {
    deferred_.Defer([placer = placer_.get(), id = id_, phase = phase_,
                     carrier = chain_->carrier()] { placer->PhaseChanged(id, phase, carrier); });
  }
  return true;
}

EncoderDispatch::OnEncoded GenerateCall::OnEncodedCallback() {
  return [self = shared_from_this()](EncoderDispatch::Encode* encode, const grpc::Status& s) {
    self->OnEncoded(encode, s);
  };
}

void GenerateCall::OnEncoded(EncoderDispatch::Encode* encode, const grpc::Status& status) {
  {
    absl::MutexLock lock(&mu_);
    LockedOnEncoded(encode, status);
  }
  deferred_.Run();
}

void GenerateCall::LockedOnEncoded(EncoderDispatch::Encode* encode, const grpc::Status& status) {
  const EncodeFailure failure = encoders_.Answered(encode, status);
  if (phase_ == CallPhase::kEnded) return;
  if (phase_ == CallPhase::kFinalHeld) {
    // The language side already has every image: only the final response's
    // usage (cached_images) was waiting for this.
    MaybeSendFinal();
    return;
  }
  if (status.ok()) return;
  if (status.error_code() == grpc::StatusCode::INVALID_ARGUMENT) {
    End(FromGrpcStatus(status));
    return;
  }
  if (failure.copy) {  // a group member's copy: that member cannot get the image
    End(absl::UnavailableError("an encoder failed for a member of the request's group"));
    return;
  }
  Redispatch(failure.images, failure.encoder_id, status.error_message());
}

void GenerateCall::Redispatch(const std::vector<size_t>& images, const std::string& failed_encoder,
                              const std::string& why) {
  // From the first token on, the language side has every image (a
  // migration's new instance: from its first token).
  if (phase_ > CallPhase::kPrefilling && !migration_.resuming()) return;
  LOG(WARNING) << "request " << id_ << ": " << images.size() << " image(s) leave encoder "
               << failed_encoder << ": " << why;
  absl::StatusOr<std::vector<internal::v1::PromptImage>> described =
      encoders_.Move(images, failed_encoder, deferred_, OnEncodedCallback());
  if (!described.ok()) {
    End(described.status());
    return;
  }
  RetryImages(*std::move(described));
}

absl::StatusOr<std::vector<internal::v1::PromptImage>> GenerateCall::CopyImages(
    const std::vector<size_t>& images) {
  return encoders_.DispatchCopy(images, deferred_, OnEncodedCallback());
}

void GenerateCall::SendRetryImages(std::shared_ptr<Instance> language,
                                   std::vector<internal::v1::PromptImage> images) {
  auto retry = std::make_shared<internal::v1::ImageRetry>();
  retry->set_request_id(id_);
  for (auto& d : images) *retry->add_images() = std::move(d);
  auto ctx = std::make_shared<grpc::ClientContext>();
  ctx->set_deadline(deadline_);
  auto ack = std::make_shared<internal::v1::ImageRetryAck>();
  CountCriticalRoundTrip();  // the language side waits for the new sources
  deferred_.Defer([language = std::move(language), ctx, retry, ack] {
    language->language->async()->RetryImages(
        ctx.get(), retry.get(), ack.get(), [ctx, retry, ack](grpc::Status s) {
          if (!s.ok()) LOG(WARNING) << "RetryImages: " << s.error_message();
        });
  });
}

void GenerateCall::CountCriticalRoundTrip() {
  if (phase_ <= CallPhase::kPrefilling) ++critical_round_trips_;
}

void GenerateCall::RelayBatch(const internal::v1::TokenBatch& batch) {
  if (phase_ == CallPhase::kEnded) return;
  if (batch.lost_images_size() > 0) {
    for (auto& [eid, ks] : encoders_.Lost(batch)) Redispatch(ks, eid, batch.lost_reason());
    return;
  }
  const double now = clock_.ElapsedSeconds();
  const bool first = phase_ == CallPhase::kPrefilling && batch.token_ids_size() > 0;
  CountTokens(batch, now);
  mmserve::v1::GenerateResponse r = ToResponse(batch, request_);
  if (r.finish_reason() != mmserve::v1::FINISH_REASON_UNSPECIFIED) {
    if (!Advance(CallEvent::kFinalResponse)) return;
    if (r.has_timing()) {
      r.mutable_timing()->set_e2e_ms(now * 1e3);
      r.mutable_timing()->set_ttft_ms(first_token_s_ * 1e3);
    }
    // Held until every Encode call has answered, for cached_images.
    final_ = HeldFinal{.response = std::move(r)};
    MaybeSendFinal();
    return;
  }
  if (first) Advance(CallEvent::kFirstToken);
  migration_.Relayed(batch);
  deferred_.Defer(
      [on_response = sink_.on_response, r = std::move(r)]() mutable { on_response(std::move(r)); });
}

void GenerateCall::CountTokens(const internal::v1::TokenBatch& batch, double now) {
  completion_tokens_ += static_cast<uint32_t>(batch.token_ids_size());
  if (batch.token_ids_size() == 0) return;
  const CallMetrics& m = *context_.metrics;
  if (phase_ == CallPhase::kPrefilling) {
    m.ttft.Observe(now);
    m.critical_round_trips.Observe(critical_round_trips_);
    first_token_s_ = now;
  } else {
    m.itl.Observe(now - last_token_s_);
  }
  last_token_s_ = now;
}

void GenerateCall::MaybeSendFinal() {
  if (!encoders_.AllAnswered()) return;
  if (final_->response) {
    mmserve::v1::GenerateResponse& r = *final_->response;
    if (r.has_usage()) r.mutable_usage()->set_cached_images(encoders_.cached_images());
    deferred_.Defer([on_response = sink_.on_response, r = std::move(r)]() mutable {
      on_response(std::move(r));
    });
    final_->response.reset();
  }
  if (final_->stream_closed) End(absl::OkStatus());
}

void GenerateCall::LastStreamClosed(const grpc::Status& status, absl::string_view role,
                                    absl::string_view instance_id) {
  if (status.ok()) {
    if (phase_ != CallPhase::kFinalHeld) {
      End(absl::InternalError(
          absl::StrCat("the ", role, " stream ended without a final response")));
      return;
    }
    final_->stream_closed = true;
    MaybeSendFinal();
    return;
  }
  absl::Status s = FromGrpcStatus(status);
  // A stream the router did not cancel (the call has not ended) that ends
  // CANCELLED was cancelled by the instance: a failure, not the client's.
  if (status.error_code() == grpc::StatusCode::UNAVAILABLE ||
      status.error_code() == grpc::StatusCode::UNKNOWN ||
      status.error_code() == grpc::StatusCode::CANCELLED) {
    s = absl::UnavailableError(
        absl::StrCat(role, " instance ", instance_id, " failed: ", status.error_message()));
  }
  End(std::move(s));
}

void GenerateCall::Cancel(const std::string& reason) {
  {
    absl::MutexLock lock(&mu_);
    if (phase_ != CallPhase::kEnded) End(absl::CancelledError(reason));
  }
  deferred_.Run();
}

void GenerateCall::OnInstanceDown(const std::string& instance_id) {
  {
    absl::MutexLock lock(&mu_);
    LockedOnInstanceDown(instance_id);
  }
  deferred_.Run();
}

void GenerateCall::LockedOnInstanceDown(const std::string& instance_id) {
  if (phase_ == CallPhase::kEnded) return;
  const std::vector<std::shared_ptr<Instance>>& instances = LanguageInstances();
  for (size_t i = 0; i < instances.size(); ++i) {
    if (instances[i]->id != instance_id || Abandoned(i)) continue;
    const absl::Status down =
        absl::UnavailableError(absl::StrCat("language instance ", instance_id, " is down"));
    if (!MaybeMigrate(i, down)) End(down);
    return;
  }
  std::vector<size_t> moving = encoders_.ImagesOn(instance_id);
  if (!moving.empty()) Redispatch(moving, instance_id, "the encoder is down");
}

void GenerateCall::End(absl::Status status) {
  if (phase_ == CallPhase::kEnded) return;
  Advance(CallEvent::kEnd);
  encoders_.CancelOpen(deferred_);
  CancelStreams();
  if (placer_ != nullptr) {
    deferred_.Defer([placer = placer_.get(), id = id_] { placer->Released(id); });
  }
  RecordEnd(status);  // the whole status, for the operator
  deferred_.Defer([sink = std::move(sink_), status = PublicStatus(status, id_)]() mutable {
    sink.on_end(std::move(status));
  });
}

void GenerateCall::RecordEnd(const absl::Status& status) {
  const double e2e = clock_.ElapsedSeconds();
  const CallMetrics& m = *context_.metrics;
  m.Requests(status.code()).Increment();
  m.e2e.Observe(e2e);
  m.overhead.Observe(router_seconds_);
  const std::string summary = absl::StrCat(
      "request ", id_, ": ", status.ok() ? "OK" : status.ToString(), ", ", encoders_.size(),
      " images, ", completion_tokens_, " tokens, ", absl::StrFormat("%.1f ms", e2e * 1e3),
      LanguageInstances().empty() ? "" : absl::StrCat(", on ", LanguageInstances()[0]->id),
      // A migrated call ran last on the instance it moved to.
      migration_.lost().empty()
          ? ""
          : absl::StrCat(" then ", LanguageInstances().back()->id, " (moved off ",
                         absl::StrJoin(migration_.lost(), ", "), ")"));
  // A failure of the service is logged whole: the client sees only a
  // generic message with the request id (public_error.h).
  if (status.ok() || IsClientError(status.code())) {
    LOG(INFO) << summary;
  } else {
    LOG(WARNING) << summary;
  }
}

}  // namespace mmserve::router
