#include "language_service/language_service.h"

#include <functional>
#include <string>
#include <utility>

#include "absl/strings/str_format.h"
#include "common/clock.h"
#include "common/grpc_status.h"
#include "common/internal_plane.h"
#include "common/logging.h"
#include "common/server_stream.h"

namespace mmserve::language {
namespace {

// One Prefill stream: batches come from the core's loop thread.
class PrefillReactor final : public QueuedWriteReactor<v1::TokenBatch> {
 public:
  PrefillReactor(LanguageCore& core, std::string id, metrics::Registry& metrics)
      : core_(core), id_(std::move(id)), metrics_(metrics) {}

  void Start(const v1::PrefillRequest& request) {
    absl::Status s =
        core_.Submit(request, {.on_batch = [this](v1::TokenBatch b) { Push(std::move(b)); },
                               .on_end = [this](absl::Status st) { Done(std::move(st)); }});
    if (!s.ok()) Done(std::move(s));
  }
  // Role decode: the stream of a request whose KV comes from a prefill
  // instance.
  void StartDecode(const v1::DecodeRequest& request) {
    absl::Status s =
        core_.RegisterDecode(request, {.on_batch = [this](v1::TokenBatch b) { Push(std::move(b)); },
                                       .on_end = [this](absl::Status st) { Done(std::move(st)); }});
    if (!s.ok()) Done(std::move(s));
  }
  // Role elastic: one member's part of a group prefill.
  void StartEsp(const v1::EspPrefillRequest& request) {
    absl::Status s =
        core_.EspPrefill(request, {.on_batch = [this](v1::TokenBatch b) { Push(std::move(b)); },
                                   .on_end = [this](absl::Status st) { Done(std::move(st)); }});
    if (!s.ok()) Done(std::move(s));
  }
  // Ends the stream with `status` without reaching the core.
  void Refuse(absl::Status status) { Done(std::move(status)); }

  void OnCancel() override { core_.Abort(id_, "cancelled by the caller"); }
  void OnClientGone() override { core_.Abort(id_, "the stream to the router broke"); }

 private:
  void Done(absl::Status status) {
    metrics_
        .GetCounter("mmserve_language_requests_total", "Prefill streams by final code.",
                    {{"code", absl::StatusCodeToString(status.code())}})
        .Increment();
    LOG(INFO) << "request " << id_ << ": " << (status.ok() ? "OK" : status.ToString()) << ", "
              << absl::StrFormat("%.1f ms", clock_.ElapsedSeconds() * 1e3);
    End(status);  // may delete this
  }

  LanguageCore& core_;
  const std::string id_;
  metrics::Registry& metrics_;
  Stopwatch clock_;
};

}  // namespace

LanguageService::LanguageService(LanguageCore& core, transfer::TransferEngine& transfer,
                                 metrics::Registry& metrics)
    : core_(core), transfer_(transfer), metrics_(metrics) {}

namespace {

// A token stream for request `id`: refused without the cluster token or
// while draining, else `start` hands it to the core.
PrefillReactor* OpenStream(LanguageCore& core, metrics::Registry& metrics,
                           grpc::CallbackServerContext& ctx, const std::string& id, bool accepting,
                           const std::function<void(PrefillReactor&)>& start) {
  auto* reactor = new PrefillReactor(core, id, metrics);
  if (absl::Status s = CheckClusterToken(ctx); !s.ok()) {
    reactor->Refuse(std::move(s));
  } else if (accepting) {
    start(*reactor);
  } else {
    reactor->Refuse(absl::UnavailableError("the language instance is draining"));
  }
  return reactor;
}

}  // namespace

grpc::ServerWriteReactor<v1::TokenBatch>* LanguageService::Prefill(
    grpc::CallbackServerContext* ctx, const v1::PrefillRequest* request) {
  return OpenStream(core_, metrics_, *ctx, request->request_id(), accepting_,
                    [request](PrefillReactor& r) { r.Start(*request); });
}

grpc::ServerWriteReactor<v1::TokenBatch>* LanguageService::Decode(
    grpc::CallbackServerContext* ctx, const v1::DecodeRequest* request) {
  return OpenStream(core_, metrics_, *ctx, request->request_id(), accepting_,
                    [request](PrefillReactor& r) { r.StartDecode(*request); });
}

grpc::ServerWriteReactor<v1::TokenBatch>* LanguageService::EspPrefill(
    grpc::CallbackServerContext* ctx, const v1::EspPrefillRequest* request) {
  return OpenStream(core_, metrics_, *ctx, request->request().request_id(), accepting_,
                    [request](PrefillReactor& r) { r.StartEsp(*request); });
}

grpc::ServerUnaryReactor* LanguageService::EspMoveMaster(grpc::CallbackServerContext* ctx,
                                                         const v1::EspMoveRequest* request,
                                                         v1::EspMoveAck*) {
  if (auto* refused = RefuseUnlessCluster(ctx)) return refused;
  return FinishUnary(ctx, ToGrpcStatus(core_.EspMoveMaster(*request)));
}

grpc::ServerUnaryReactor* LanguageService::AllocateKv(grpc::CallbackServerContext* ctx,
                                                      const v1::KvAllocateRequest* request,
                                                      v1::KvAllocation* response) {
  if (auto* refused = RefuseUnlessCluster(ctx)) return refused;
  absl::StatusOr<v1::KvAllocation> a = core_.AllocateKv(*request);
  if (a.ok()) *response = std::move(*a);
  return FinishUnary(ctx, ToGrpcStatus(a.status()));
}

grpc::ServerUnaryReactor* LanguageService::CommitKv(grpc::CallbackServerContext* ctx,
                                                    const v1::KvCommit* request,
                                                    v1::KvCommitAck* response) {
  if (auto* refused = RefuseUnlessCluster(ctx)) return refused;
  absl::Status s = core_.CommitKv(*request);
  response->set_accepted(s.ok());
  return FinishUnary(ctx, ToGrpcStatus(s));
}

grpc::ServerUnaryReactor* LanguageService::RetryImages(grpc::CallbackServerContext* ctx,
                                                       const v1::ImageRetry* request,
                                                       v1::ImageRetryAck* response) {
  if (auto* refused = RefuseUnlessCluster(ctx)) return refused;
  response->set_accepted(core_.Retry(*request));
  if (!response->accepted()) response->set_error("unknown request");
  return FinishUnary(ctx, grpc::Status::OK);
}

grpc::ServerUnaryReactor* LanguageService::Abort(grpc::CallbackServerContext* ctx,
                                                 const v1::AbortRequest* request,
                                                 v1::AbortResponse* response) {
  if (auto* refused = RefuseUnlessCluster(ctx)) return refused;
  core_.Abort(request->request_id(), request->reason());
  response->set_found(true);
  return FinishUnary(ctx, grpc::Status::OK);
}

grpc::ServerUnaryReactor* LanguageService::Connect(grpc::CallbackServerContext* ctx,
                                                   const v1::ConnectRequest*,
                                                   v1::ConnectResponse* response) {
  if (auto* refused = RefuseUnlessCluster(ctx)) return refused;
  const v1::ConnectRequest& local = transfer_.local_info();
  response->set_instance_id(local.instance_id());
  *response->mutable_ucx() = local.ucx();
  return FinishUnary(ctx, grpc::Status::OK);
}

grpc::ServerUnaryReactor* LanguageService::GetLoad(grpc::CallbackServerContext* ctx,
                                                   const v1::LoadRequest*,
                                                   v1::LoadReport* response) {
  if (auto* refused = RefuseUnlessCluster(ctx)) return refused;
  *response = core_.Load();
  response->set_accepting(accepting_);
  return FinishUnary(ctx, grpc::Status::OK);
}

}  // namespace mmserve::language
