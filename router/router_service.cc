#include "router/router_service.h"

#include <deque>
#include <optional>
#include <thread>
#include <utility>

#include "common/grpc_status.h"
#include "common/internal_plane.h"
#include "common/logging.h"
#include "common/server_stream.h"
#include "router/public_error.h"
#include "router/request_fetch.h"
#include "router/tool_call_sink.h"
#include "router/tool_request.h"

namespace mmserve::router {
namespace {

// One Generate stream to a client. A client cancel, deadline or broken
// stream cancels the call.
class GenerateReactor final : public QueuedWriteReactor<mmserve::v1::GenerateResponse> {
 public:
  // `ctx` outlives the call: gRPC keeps it until OnDone, after End.
  void Begin(const RouterContext& context, CallTracker& tracker, grpc::CallbackServerContext& ctx,
             const mmserve::v1::GenerateRequest& request,
             std::chrono::system_clock::time_point deadline, PublicAccess::Lease lease) {
    CallCancel call =
        StartTrackedCall(
            context, tracker, request,
            {.on_response = [this](mmserve::v1::GenerateResponse r) { Push(std::move(r)); },
             .on_end =
                 [this, &ctx, lease = std::move(lease)](absl::Status s) mutable {
                   lease.reset();
                   {
                     absl::MutexLock lock(&mu_);
                     ended_ = true;
                     call_ = nullptr;
                   }
                   // Before End: trailing metadata must be added before Finish.
                   if (const std::string id = RequestIdOf(s); !id.empty()) {
                     ctx.AddTrailingMetadata(kRequestIdMetadata, id);
                   }
                   if (IsRetryable(s.code())) {
                     ctx.AddTrailingMetadata("retry-after", std::to_string(kRetryAfterSeconds));
                   }
                   End(s);  // may delete this
                 }},
            deadline)
            .cancel;
    CallCancel cancel_now;
    const char* why = nullptr;
    {
      absl::MutexLock lock(&mu_);
      if (!ended_) call_ = std::move(call);
      // A cancel that came before the call existed.
      if (cancelled_ != nullptr) {
        cancel_now = call_;
        why = cancelled_;
      }
    }
    if (cancel_now) cancel_now(why);
  }

  // The request's remote media fetched on a thread of its own (the fetch
  // blocks; gRPC's callback threads must not), then Begin. A client that
  // goes away meanwhile stops the fetch.
  void FetchThenBegin(const RouterContext& context, CallTracker& tracker,
                      grpc::CallbackServerContext& ctx, mmserve::v1::GenerateRequest request,
                      std::chrono::system_clock::time_point deadline, PublicAccess::Lease lease) {
    auto fetch = std::make_shared<FetchCancel>();
    {
      absl::MutexLock lock(&mu_);
      fetch_ = fetch;
    }
    std::thread([this, &context, &tracker, &ctx, request = std::move(request), deadline,
                 lease = std::move(lease), fetch]() mutable {
      absl::Status s = FetchRequestMedia(context.media, context.options, &request, fetch,
                                         GrpcMediaField, context.media_metrics);
      {
        absl::MutexLock lock(&mu_);
        fetch_ = nullptr;
      }
      if (!s.ok()) {
        lease.reset();
        End(s);  // may delete this
        return;
      }
      Begin(context, tracker, ctx, request, deadline, std::move(lease));
    }).detach();
  }

  void OnCancel() override { CancelCall("cancelled by the client"); }
  void OnClientGone() override { CancelCall("the client stream broke"); }

 private:
  void CancelCall(const char* why) {
    CallCancel call;
    std::shared_ptr<FetchCancel> fetch;
    {
      absl::MutexLock lock(&mu_);
      if (cancelled_ == nullptr) cancelled_ = why;
      call = call_;
      fetch = fetch_;
    }
    if (fetch) fetch->Cancel();
    if (call) call(why);
  }

  absl::Mutex mu_;
  CallCancel call_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<FetchCancel> fetch_ ABSL_GUARDED_BY(mu_);  // while fetching
  const char* cancelled_ ABSL_GUARDED_BY(mu_) = nullptr;     // why, once cancelled
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace

void CallTracker::Add(const std::shared_ptr<GenerateCall>& call) {
  absl::MutexLock lock(&mu_);
  calls_[call->id()] = call;
}

void CallTracker::Remove(const std::string& id) {
  absl::MutexLock lock(&mu_);
  calls_.erase(id);
}

void CallTracker::OnInstanceDown(const std::string& instance_id) {
  std::vector<std::shared_ptr<GenerateCall>> live;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [id, w] : calls_) {
      if (auto c = w.lock()) live.push_back(std::move(c));
    }
  }
  for (auto& c : live) c->OnInstanceDown(instance_id);
}

void CallTracker::CancelAll(const std::string& reason) {
  std::vector<std::shared_ptr<GenerateCall>> live;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [id, w] : calls_) {
      if (auto c = w.lock()) live.push_back(std::move(c));
    }
  }
  for (auto& c : live) c->Cancel(reason);
}

size_t CallTracker::size() const {
  absl::MutexLock lock(&mu_);
  return calls_.size();
}

namespace {

std::shared_ptr<GenerateCall> StartOneTrackedCall(const RouterContext& context,
                                                  CallTracker& tracker,
                                                  mmserve::v1::GenerateRequest request,
                                                  CallSink sink,
                                                  std::chrono::system_clock::time_point deadline) {
  // The call's id is known only once it exists; `ended` guards against the
  // call ending (and removing itself) before it was added.
  auto id = std::make_shared<std::string>();
  auto ended = std::make_shared<std::atomic<bool>>(false);
  auto on_end = std::move(sink.on_end);
  sink.on_end = [&tracker, id, ended, on_end = std::move(on_end)](absl::Status s) {
    ended->store(true);
    if (!id->empty()) tracker.Remove(*id);
    on_end(std::move(s));
  };
  auto call = GenerateCall::Start(context, std::move(request), std::move(sink), deadline);
  *id = call->id();
  tracker.Add(call);
  if (ended->load()) tracker.Remove(call->id());
  return call;
}

}  // namespace

StartedCall StartTrackedCall(const RouterContext& context, CallTracker& tracker,
                             mmserve::v1::GenerateRequest request, CallSink sink,
                             std::chrono::system_clock::time_point deadline) {
  auto start = [&context, &tracker, deadline](mmserve::v1::GenerateRequest r, CallSink s) {
    std::shared_ptr<GenerateCall> call =
        StartOneTrackedCall(context, tracker, std::move(r), std::move(s), deadline);
    return StartedCall{call->id(), [call](const std::string& why) { call->Cancel(why); }};
  };
  if (ToolCallsParsed(request)) sink = ParseToolCalls(request, std::move(sink));
  if (request.n() <= 1) return start(std::move(request), std::move(sink));
  const std::string given_id = request.request_id();
  std::shared_ptr<ChoiceCalls> choices =
      ChoiceCalls::Start(std::move(request), std::move(sink), std::move(start));
  if (choices == nullptr) return {given_id, [](const std::string&) {}};  // refused, ended
  return {choices->id(), [choices](const std::string& why) { choices->CancelAll(why); }};
}

namespace {

// The call's "authorization" metadata (empty when none).
std::string Authorization(const grpc::CallbackServerContext& ctx) {
  auto it = ctx.client_metadata().find("authorization");
  if (it == ctx.client_metadata().end()) return "";
  return std::string(it->second.data(), it->second.size());
}

absl::StatusOr<PublicAccess::Lease> AdmitPublicCall(const RouterContext& context,
                                                    grpc::CallbackServerContext& ctx) {
  if (context.access == nullptr) return PublicAccess::Lease();
  const std::string authorization = Authorization(ctx);
  if (auto s = context.access->Authenticate(authorization); !s.ok()) return s;
  auto lease = context.access->Admit(context.access->ClientOf(authorization, PeerHost(ctx.peer())));
  if (absl::IsResourceExhausted(lease.status())) {
    ctx.AddTrailingMetadata("retry-after", std::to_string(kRetryAfterSeconds));
  }
  return lease;
}

}  // namespace

grpc::ServerWriteReactor<mmserve::v1::GenerateResponse>* InferenceService::Generate(
    grpc::CallbackServerContext* ctx, const mmserve::v1::GenerateRequest* request) {
  auto* reactor = new GenerateReactor();
  absl::StatusOr<PublicAccess::Lease> lease = AdmitPublicCall(context_, *ctx);
  if (!lease.ok()) {
    reactor->End(lease.status());
    return reactor;
  }
  auto deadline = ctx->deadline();
  const auto latest = std::chrono::system_clock::now() +
                      absl::ToChronoNanoseconds(context_.options.default_timeout);
  if (deadline > latest) deadline = latest;
  if (HasRemoteMedia(*request)) {
    reactor->FetchThenBegin(context_, tracker_, *ctx, *request, deadline, *std::move(lease));
  } else {
    reactor->Begin(context_, tracker_, *ctx, *request, deadline, *std::move(lease));
  }
  return reactor;
}

mmserve::v1::ListModelsResponse DescribeModels(const RouterContext& context) {
  mmserve::v1::ListModelsResponse out;
  mmserve::v1::ModelCard* card = out.add_models();
  const model::ModelConfig& c = context.options.config;
  card->set_id(context.options.model_id);
  card->set_max_model_len(static_cast<uint32_t>(context.options.max_model_len));
  card->set_vision(c.vision.has_value());
  card->set_architecture(c.architecture);
  card->set_vocab_size(static_cast<uint32_t>(c.text.vocab_size));
  card->set_encoder_instances(
      static_cast<uint32_t>(context.instances->Healthy(Role::kEncoder).size()));
  // Elastic instances (router --elastic) prefill and decode like role both.
  const size_t both = context.instances->Healthy(Role::kLanguage).size() +
                      context.instances->Healthy(Role::kElastic).size();
  card->set_prefill_instances(
      static_cast<uint32_t>(both + context.instances->Healthy(Role::kPrefill).size()));
  card->set_decode_instances(
      static_cast<uint32_t>(both + context.instances->Healthy(Role::kDecode).size()));
  return out;
}

grpc::ServerUnaryReactor* InferenceService::ListModels(grpc::CallbackServerContext* ctx,
                                                       const mmserve::v1::ListModelsRequest*,
                                                       mmserve::v1::ListModelsResponse* response) {
  if (context_.access != nullptr) {
    if (auto s = context_.access->Authenticate(Authorization(*ctx)); !s.ok()) {
      return FinishUnary(ctx, ToGrpcStatus(s));
    }
  }
  *response = DescribeModels(context_);
  return FinishUnary(ctx, grpc::Status::OK);
}

grpc::ServerUnaryReactor* RegistryService::Register(grpc::CallbackServerContext* ctx,
                                                    const iv1::RegisterRequest* request,
                                                    iv1::RegisterResponse* response) {
  return ServeInternal(ctx, [&] {
    const iv1::InstanceInfo& info = request->instance();
    if (info.instance_id().empty() || info.grpc_address().empty() ||
        info.role() == iv1::INSTANCE_ROLE_UNSPECIFIED) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "instance_id, grpc_address and role are required");
    }
    if (absl::Status admit = table_.Admit(info); !admit.ok()) {
      LOG(WARNING) << "registration refused: " << admit;
      return ToGrpcStatus(admit);
    }
    table_.Upsert(info, /*registered=*/true);
    response->set_heartbeat_interval_s(1);
    return grpc::Status::OK;
  });
}

grpc::ServerUnaryReactor* RegistryService::Heartbeat(grpc::CallbackServerContext* ctx,
                                                     const iv1::HeartbeatRequest* request,
                                                     iv1::HeartbeatResponse* response) {
  return ServeInternal(ctx, [&] {
    response->set_known(table_.Report(request->load()));
    return grpc::Status::OK;
  });
}

grpc::ServerUnaryReactor* RegistryService::Deregister(grpc::CallbackServerContext* ctx,
                                                      const iv1::DeregisterRequest* request,
                                                      iv1::DeregisterResponse*) {
  return ServeInternal(ctx, [&] {
    table_.Remove(request->instance_id());
    return grpc::Status::OK;
  });
}

}  // namespace mmserve::router
