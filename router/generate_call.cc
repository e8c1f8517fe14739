#include "router/generate_call.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/grpc_status.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "scheduler/placement.h"

namespace mmserve::router {
namespace {

std::atomic<uint64_t> next_request{1};

std::string AssignId() {
  static const uint64_t salt = static_cast<uint64_t>(MonotonicNanos());
  return absl::StrFormat("req-%x-%d", salt & 0xffffff, next_request.fetch_add(1));
}

}  // namespace

// One Encode call (an attempt at some of the request's images on one encoder).
struct GenerateCall::Encode {
  std::string encoder_id;
  std::vector<size_t> images;
  grpc::ClientContext ctx;
  internal::v1::EncodeRequest request;
  internal::v1::EncodeResponse response;
  bool done = false;
};

// The Prefill stream from the language instance.
class GenerateCall::PrefillStream final : public grpc::ClientReadReactor<internal::v1::TokenBatch> {
 public:
  PrefillStream(std::shared_ptr<GenerateCall> call, std::chrono::system_clock::time_point deadline,
                bool decode = false)
      : call_(std::move(call)), decode_(decode) {
    ctx_.set_deadline(deadline);
  }
  // `self` keeps the stream alive until gRPC is done with it (OnDone).
  void Begin(std::shared_ptr<PrefillStream> self, internal::v1::Language::Stub& stub,
             const internal::v1::PrefillRequest& request) {
    self_ = std::move(self);
    request_ = request;
    stub.async()->Prefill(&ctx_, &request_, this);
    StartRead(&batch_);
    StartCall();
  }
  // The Decode stream of the prefill/decode roles.
  void BeginDecode(std::shared_ptr<PrefillStream> self, internal::v1::Language::Stub& stub,
                   const internal::v1::DecodeRequest& request) {
    self_ = std::move(self);
    decode_request_ = request;
    stub.async()->Decode(&ctx_, &decode_request_, this);
    StartRead(&batch_);
    StartCall();
  }
  void Cancel() { ctx_.TryCancel(); }
  void OnReadDone(bool ok) override {
    if (!ok) return;  // OnDone follows
    call_->OnBatch(batch_, decode_);
    StartRead(&batch_);
  }
  void OnDone(const grpc::Status& status) override {
    call_->OnLanguageDone(status, decode_);
    call_.reset();
    self_.reset();  // may destroy this
  }

 private:
  std::shared_ptr<GenerateCall> call_;
  const bool decode_;
  std::shared_ptr<PrefillStream> self_;
  grpc::ClientContext ctx_;
  internal::v1::PrefillRequest request_;
  internal::v1::DecodeRequest decode_request_;
  internal::v1::TokenBatch batch_;
};

GenerateCall::GenerateCall(const RouterContext& context, mmserve::v1::GenerateRequest request,
                           CallSink sink, std::chrono::system_clock::time_point deadline)
    : context_(context),
      request_(std::move(request)),
      id_(request_.request_id().empty() ? AssignId() : request_.request_id()),
      deadline_(deadline),
      sink_(std::move(sink)) {
  request_.set_request_id(id_);
}

GenerateCall::~GenerateCall() = default;

std::shared_ptr<GenerateCall> GenerateCall::Start(const RouterContext& context,
                                                  mmserve::v1::GenerateRequest request,
                                                  CallSink sink,
                                                  std::chrono::system_clock::time_point deadline) {
  std::shared_ptr<GenerateCall> call(
      new GenerateCall(context, std::move(request), std::move(sink), deadline));
  absl::Status s = call->Prepare();
  {
    absl::MutexLock lock(&call->mu_);
    if (s.ok()) {
      call->Run();
    } else {
      call->End(std::move(s));
    }
  }
  call->RunDeferred();
  return call;
}

absl::Status GenerateCall::Prepare() {
  ASSIGN_OR_RETURN(std::vector<PreparedImage> prepared, PrepareRequest(context_.options, request_));
  absl::MutexLock lock(&mu_);
  images_.resize(prepared.size());
  for (size_t k = 0; k < prepared.size(); ++k) {
    images_[k].hash = prepared[k].hash;
    images_[k].grid = prepared[k].grid;
  }
  return absl::OkStatus();
}

void GenerateCall::Run() {
  router_seconds_ = clock_.ElapsedSeconds();
  auto candidates = context_.instances->Healthy(Role::kLanguage);
  if (candidates.empty()) {
    // Prefill/decode roles: the decode instance first (most free KV blocks,
    // then fewest running sequences), then the least loaded prefill one.
    const auto decoders = context_.instances->Healthy(Role::kDecode);
    candidates = context_.instances->Healthy(Role::kPrefill);
    if (!decoders.empty() && !candidates.empty()) {
      std::vector<uint64_t> pressure;
      for (const auto& d : decoders) {
        const internal::v1::LoadReport load = context_.instances->LastLoad(d->id);
        pressure.push_back((uint64_t{0xffffffff} - load.kv_blocks_free()) << 24 |
                           std::min<uint64_t>(load.running(), 0xffffff));
      }
      decode_ = decoders[scheduler::LeastLoaded(pressure)];
    }
  }
  if (candidates.empty() || (decode_ == nullptr && candidates[0]->role != Role::kLanguage)) {
    End(absl::UnavailableError(
        "no healthy language instance (role both, or prefill and decode together)"));
    return;
  }
  std::vector<uint64_t> loads;
  for (const auto& c : candidates) {
    loads.push_back(static_cast<uint64_t>(std::max<int64_t>(0, c->inflight.load())) +
                    context_.instances->LastLoad(c->id).outstanding_tokens());
  }
  language_ = candidates[scheduler::LeastLoaded(loads)];
  placed_tokens_ = 64;
  for (const Image& im : images_) placed_tokens_ += im.grid ? im.grid->num_tokens() : 64;
  language_->inflight += placed_tokens_;

  internal::v1::PrefillRequest prefill;
  prefill.set_request_id(id_);
  prefill.set_model(context_.options.model_id);
  if (request_.has_chat()) {
    *prefill.mutable_chat() = request_.chat();
    for (auto& m : *prefill.mutable_chat()->mutable_messages()) {
      for (auto& p : *m.mutable_content()) {
        if (p.has_image()) p.mutable_image()->clear_data();
      }
    }
  } else {
    *prefill.mutable_raw() = request_.raw();
    for (auto& im : *prefill.mutable_raw()->mutable_images()) im.clear_data();
  }
  *prefill.mutable_sampling() = request_.sampling();
  *prefill.mutable_stream() = request_.stream();
  prefill.set_priority(request_.priority());
  std::vector<size_t> all(images_.size());
  for (size_t k = 0; k < all.size(); ++k) all[k] = k;
  std::vector<internal::v1::PromptImage> described;
  if (!Dispatch(all, &described)) return;
  for (auto& d : described) *prefill.add_images() = std::move(d);
  if (decode_ != nullptr) {
    decode_->inflight += placed_tokens_;
    prefill.mutable_decode()->set_instance_id(decode_->id);
    prefill.mutable_decode()->set_address(decode_->address);
    pending_prefill_ = std::move(prefill);
    internal::v1::DecodeRequest d;
    d.set_request_id(id_);
    d.set_model(context_.options.model_id);
    *d.mutable_sampling() = request_.sampling();
    *d.mutable_stream() = request_.stream();
    auto ds = std::make_shared<PrefillStream>(shared_from_this(), deadline_, /*decode=*/true);
    decode_stream_ = ds;
    Defer([ds, dec = decode_, d = std::move(d)] { ds->BeginDecode(ds, *dec->language, d); });
    return;
  }
  auto stream = std::make_shared<PrefillStream>(shared_from_this(), deadline_);
  stream_ = stream;
  Defer([stream, lang = language_, prefill = std::move(prefill)] {
    stream->Begin(stream, *lang->language, prefill);
  });
}

bool GenerateCall::Dispatch(const std::vector<size_t>& images,
                            std::vector<internal::v1::PromptImage>* out) {
  if (images.empty()) return true;
  const auto encoders = context_.instances->Healthy(Role::kEncoder);
  std::map<std::string, std::unique_ptr<Encode>> by_encoder;
  for (size_t k : images) {
    Image& im = images_[k];
    if (++im.attempts > kMaxAttempts) {
      End(absl::UnavailableError(
          absl::StrCat("image ", k, " failed on ", kMaxAttempts, " encoders")));
      return false;
    }
    // Healthy encoders this image has not failed on; else any healthy one
    // (a failure may have been transient), still bounded by kMaxAttempts.
    std::vector<std::string> ids;
    std::vector<std::shared_ptr<Instance>> usable;
    for (bool allow_failed : {false, true}) {
      for (const auto& e : encoders) {
        if (allow_failed || im.failed_encoders.count(e->id) == 0) {
          ids.push_back(e->id);
          usable.push_back(e);
        }
      }
      if (!usable.empty()) break;
    }
    size_t pick = scheduler::RendezvousPick(im.hash, ids);
    if (pick == scheduler::kNoCandidate) {
      End(absl::UnavailableError(absl::StrCat("no healthy encoder for image ", k)));
      return false;
    }
    std::vector<uint64_t> queued;
    for (const auto& e : usable) queued.push_back(context_.instances->LastLoad(e->id).waiting());
    if (queued[pick] >= static_cast<uint64_t>(context_.options.encoder_saturation)) {
      pick = scheduler::LeastLoaded(queued);  // affinity yields to load
    }
    const std::shared_ptr<Instance>& enc = usable[pick];
    auto& encode = by_encoder[enc->id];
    if (encode == nullptr) {
      encode = std::make_unique<Encode>();
      encode->encoder_id = enc->id;
      encode->request.set_request_id(absl::StrCat(id_, "@", enc->id, "#", next_attempt_++));
      encode->request.set_model(context_.options.model_id);
    }
    encode->images.push_back(k);
    im.encoder_id = enc->id;
    im.transfer_id = encode->request.request_id();
    const mmserve::v1::Image& source = *RequestImages(request_)[k];
    internal::v1::EncodeImage* ei = encode->request.add_images();
    ei->set_image_index(static_cast<uint32_t>(k));
    *ei->mutable_image() = source;
    ei->mutable_content_hash()->set_high(im.hash.high);
    ei->mutable_content_hash()->set_low(im.hash.low);
    internal::v1::PromptImage pi;
    pi.set_image_index(static_cast<uint32_t>(k));
    pi.mutable_content_hash()->set_high(im.hash.high);
    pi.mutable_content_hash()->set_low(im.hash.low);
    if (im.grid) {
      pi.set_num_tokens(static_cast<uint32_t>(im.grid->num_tokens()));
      pi.set_grid_t(static_cast<uint32_t>(im.grid->grid_t));
      pi.set_grid_h(static_cast<uint32_t>(im.grid->grid_h));
      pi.set_grid_w(static_cast<uint32_t>(im.grid->grid_w));
    }
    pi.set_encoder_id(enc->id);
    pi.set_encoder_address(enc->address);
    pi.set_transfer_id(im.transfer_id);
    out->push_back(std::move(pi));
  }
  for (auto& [eid, encode] : by_encoder) {
    std::shared_ptr<Instance> enc = context_.instances->Get(eid);
    if (enc == nullptr) continue;  // removed meanwhile: its down event re-dispatches
    encode->ctx.set_deadline(deadline_);
    Encode* raw = encode.get();
    encodes_.push_back(std::move(encode));
    Defer([enc, raw, self = shared_from_this()] {
      enc->encoder->async()->Encode(&raw->ctx, &raw->request, &raw->response,
                                    [self, raw](grpc::Status s) { self->OnEncoded(raw, s); });
    });
  }
  return true;
}

void GenerateCall::MaybeSendFinal() {
  for (const auto& e : encodes_) {
    if (!e->done) return;
  }
  if (final_response_) {
    if (final_response_->has_usage())
      final_response_->mutable_usage()->set_cached_images(cached_images_);
    Defer([on_response = sink_.on_response, r = std::move(*final_response_)]() mutable {
      on_response(std::move(r));
    });
    final_response_.reset();
  }
  if (language_ok_ && !final_response_) End(absl::OkStatus());
}

void GenerateCall::Redispatch(std::vector<size_t> images, const std::string& failed_encoder,
                              const std::string& why) {
  if (ended_ || first_token_) return;
  LOG(WARNING) << "request " << id_ << ": " << images.size() << " image(s) leave encoder "
               << failed_encoder << ": " << why;
  for (size_t k : images) images_[k].failed_encoders.insert(failed_encoder);
  // Calls still open to the failed encoder would only hold the final
  // response back until their deadline.
  for (auto& e : encodes_) {
    if (!e->done && e->encoder_id == failed_encoder) {
      Defer([raw = e.get(), self = shared_from_this()] { raw->ctx.TryCancel(); });
    }
  }
  std::vector<internal::v1::PromptImage> described;
  if (!Dispatch(images, &described)) return;
  auto retry = std::make_shared<internal::v1::ImageRetry>();
  retry->set_request_id(id_);
  for (auto& d : described) *retry->add_images() = std::move(d);
  auto ctx = std::make_shared<grpc::ClientContext>();
  ctx->set_deadline(deadline_);
  auto ack = std::make_shared<internal::v1::ImageRetryAck>();
  Defer([lang = language_, ctx, retry, ack] {
    lang->language->async()->RetryImages(ctx.get(), retry.get(), ack.get(),
                                         [ctx, retry, ack](grpc::Status s) {
                                           if (!s.ok())
                                             LOG(WARNING) << "RetryImages: " << s.error_message();
                                         });
  });
}

void GenerateCall::OnEncoded(Encode* encode, const grpc::Status& status) {
  {
    absl::MutexLock lock(&mu_);
    LockedOnEncoded(encode, status);
  }
  RunDeferred();
}

void GenerateCall::LockedOnEncoded(Encode* encode, const grpc::Status& status) {
  encode->done = true;
  if (ended_) return;
  if (status.ok()) {
    for (const auto& e : encode->response.images()) cached_images_ += e.cache_hit() ? 1 : 0;
  }
  if (finished_) {
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
  // Images whose current source is still this attempt move elsewhere.
  std::vector<size_t> moving;
  for (size_t k : encode->images) {
    if (images_[k].transfer_id == encode->request.request_id()) moving.push_back(k);
  }
  Redispatch(moving, encode->encoder_id, status.error_message());
}

void GenerateCall::OnBatch(const internal::v1::TokenBatch& batch, bool from_decode) {
  {
    absl::MutexLock lock(&mu_);
    if (from_decode) {
      LockedOnDecodeBatch(batch);
    } else {
      LockedOnBatch(batch);
      if (batch.kv_handed_off() && !ended_) {
        handed_off_ = true;
        std::vector<internal::v1::TokenBatch> early = std::move(early_decode_);
        early_decode_.clear();
        for (const auto& b : early) LockedOnBatch(b);
        if (decode_done_early_) LockedOnDecodeDone(grpc::Status::OK);
      }
    }
  }
  RunDeferred();
}

void GenerateCall::LockedOnDecodeBatch(const internal::v1::TokenBatch& batch) {
  if (ended_) return;
  if (!decode_registered_) {
    // The decode instance holds the request: start the prefill.
    decode_registered_ = true;
    if (!pending_prefill_) return;
    auto stream = std::make_shared<PrefillStream>(shared_from_this(), deadline_);
    stream_ = stream;
    Defer([stream, lang = language_, prefill = std::move(*pending_prefill_)] {
      stream->Begin(stream, *lang->language, prefill);
    });
    pending_prefill_.reset();
    return;
  }
  if (!handed_off_) {
    early_decode_.push_back(batch);
    return;
  }
  LockedOnBatch(batch);
}

void GenerateCall::LockedOnBatch(const internal::v1::TokenBatch& batch) {
  if (ended_) return;
  if (batch.lost_images_size() > 0) {
    std::map<std::string, std::vector<size_t>> by_encoder;
    for (uint32_t k : batch.lost_images()) {
      // A report about a source already replaced is stale.
      if (k < images_.size() && images_[k].transfer_id == batch.lost_transfer_id()) {
        by_encoder[images_[k].encoder_id].push_back(k);
      }
    }
    for (auto& [eid, ks] : by_encoder) Redispatch(ks, eid, batch.lost_reason());
    return;
  }
  const double now = clock_.ElapsedSeconds();
  mmserve::v1::GenerateResponse r;
  r.set_request_id(id_);
  r.set_text(batch.text());
  if (request_.stream().include_token_ids()) *r.mutable_token_ids() = batch.token_ids();
  *r.mutable_logprobs() = batch.logprobs();
  completion_tokens_ += static_cast<uint32_t>(batch.token_ids_size());
  if (batch.token_ids_size() > 0) {
    metrics::Registry& m = *context_.metrics;
    if (!first_token_) {
      m.GetHistogram("mmserve_router_ttft_seconds", "Time to first token at the router.",
                     metrics::LatencyBuckets())
          .Observe(now);
    } else {
      m.GetHistogram("mmserve_router_itl_seconds", "Gap between streamed token batches.",
                     metrics::LatencyBuckets())
          .Observe(now - last_token_s_);
    }
    if (!first_token_) first_token_s_ = now;
    first_token_ = true;
    last_token_s_ = now;
  }
  if (batch.finish_reason() != mmserve::v1::FINISH_REASON_UNSPECIFIED) {
    finished_ = true;
    r.set_finish_reason(batch.finish_reason());
    r.set_matched_stop(batch.matched_stop());
    if (batch.has_usage()) *r.mutable_usage() = batch.usage();
    r.set_seed(batch.seed());
    if (request_.stream().include_timing()) {
      *r.mutable_timing() = batch.timing();
      r.mutable_timing()->set_e2e_ms(now * 1e3);
      r.mutable_timing()->set_ttft_ms(first_token_s_ * 1e3);
    }
    // Held until every Encode call has answered, for cached_images.
    final_response_ = std::move(r);
    MaybeSendFinal();
    return;
  }
  Defer(
      [on_response = sink_.on_response, r = std::move(r)]() mutable { on_response(std::move(r)); });
}

void GenerateCall::OnLanguageDone(const grpc::Status& status, bool from_decode) {
  {
    absl::MutexLock lock(&mu_);
    if (from_decode) {
      LockedOnDecodeDone(status);
    } else {
      LockedOnLanguageDone(status);
    }
  }
  RunDeferred();
}

void GenerateCall::LockedOnDecodeDone(const grpc::Status& status) {
  decode_stream_.reset();
  if (ended_) return;
  if (status.ok() && !handed_off_) {
    decode_done_early_ = true;
    return;
  }
  LockedEndLastStream(status, "decode", decode_->id);
}

void GenerateCall::LockedOnLanguageDone(const grpc::Status& status) {
  stream_.reset();
  if (ended_) return;
  if (status.ok() && handed_off_) return;  // the decode stream goes on
  LockedEndLastStream(status, "language", language_->id);
}

void GenerateCall::LockedEndLastStream(const grpc::Status& status, absl::string_view role,
                                       absl::string_view instance_id) {
  if (status.ok()) {
    if (!finished_) {
      End(absl::InternalError(
          absl::StrCat("the ", role, " stream ended without a final response")));
      return;
    }
    language_ok_ = true;
    MaybeSendFinal();
    return;
  }
  absl::Status s = FromGrpcStatus(status);
  if (status.error_code() == grpc::StatusCode::UNAVAILABLE ||
      status.error_code() == grpc::StatusCode::UNKNOWN) {
    s = absl::UnavailableError(
        absl::StrCat(role, " instance ", instance_id, " failed: ", status.error_message()));
  }
  End(std::move(s));
}

void GenerateCall::Cancel(const std::string& reason) {
  {
    absl::MutexLock lock(&mu_);
    LockedCancel(reason);
  }
  RunDeferred();
}

void GenerateCall::LockedCancel(const std::string& reason) {
  if (!ended_) End(absl::CancelledError(reason));
}

void GenerateCall::OnInstanceDown(const std::string& instance_id) {
  {
    absl::MutexLock lock(&mu_);
    LockedOnInstanceDown(instance_id);
  }
  RunDeferred();
}

void GenerateCall::LockedOnInstanceDown(const std::string& instance_id) {
  if (ended_) return;
  if ((language_ != nullptr && language_->id == instance_id) ||
      (decode_ != nullptr && decode_->id == instance_id)) {
    End(absl::UnavailableError(absl::StrCat("language instance ", instance_id, " is down")));
    return;
  }
  std::vector<size_t> moving;
  for (size_t k = 0; k < images_.size(); ++k) {
    if (images_[k].encoder_id == instance_id) moving.push_back(k);
  }
  if (!moving.empty()) Redispatch(moving, instance_id, "the encoder is down");
}

void GenerateCall::End(absl::Status status) {
  if (ended_) return;
  ended_ = true;
  for (auto& e : encodes_) {
    if (!e->done) Defer([raw = e.get(), self = shared_from_this()] { raw->ctx.TryCancel(); });
  }
  if (stream_ != nullptr && !status.ok()) {
    // The stream object lives until its OnDone, which cannot run before this
    // call's reference inside it is dropped there.
    Defer([stream = stream_] { stream->Cancel(); });
  }
  if (decode_stream_ != nullptr) {
    // Also on OK: a first token that ended the request leaves the decode
    // instance's registration open.
    Defer([stream = decode_stream_] { stream->Cancel(); });
  }
  if (language_ != nullptr) language_->inflight -= placed_tokens_;
  if (decode_ != nullptr) decode_->inflight -= placed_tokens_;
  const double e2e = clock_.ElapsedSeconds();
  metrics::Registry& m = *context_.metrics;
  m.GetCounter("mmserve_router_requests_total", "Generate calls by final gRPC code.",
               {{"code", absl::StatusCodeToString(status.code())}})
      .Increment();
  m.GetHistogram("mmserve_router_e2e_seconds", "Generate latency, receipt to end.",
                 metrics::LatencyBuckets())
      .Observe(e2e);
  m.GetHistogram("mmserve_router_overhead_seconds",
                 "Time in the router before dispatch (validation, hashing, pre-sizing).",
                 metrics::LatencyBuckets())
      .Observe(router_seconds_);
  LOG(INFO) << "request " << id_ << ": " << (status.ok() ? "OK" : status.ToString()) << ", "
            << images_.size() << " images, " << completion_tokens_ << " tokens, "
            << absl::StrFormat("%.1f ms", e2e * 1e3)
            << (language_ ? absl::StrCat(", on ", language_->id) : "");
  Defer([sink = std::move(sink_), status = std::move(status)]() mutable {
    sink.on_end(std::move(status));
  });
}

void GenerateCall::Defer(std::function<void()> action) { deferred_.push_back(std::move(action)); }

void GenerateCall::RunDeferred() {
  {
    // One thread at a time runs the actions, in the order they were
    // deferred: with prefill/decode roles two streams deliver batches on
    // different threads, and their responses must reach the sink in order.
    absl::MutexLock lock(&mu_);
    if (running_deferred_) return;  // that thread runs ours too
    running_deferred_ = true;
  }
  for (;;) {
    std::vector<std::function<void()>> actions;
    {
      absl::MutexLock lock(&mu_);
      actions.swap(deferred_);
      if (actions.empty()) {
        running_deferred_ = false;
        return;
      }
    }
    for (auto& a : actions) a();
  }
}

}  // namespace mmserve::router
