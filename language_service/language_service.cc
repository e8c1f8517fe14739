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

  // Hands the stream to `open` (the core's Submit, or a role's call);
  // ends it at once when `open` refuses it.
  void Start(const std::function<absl::Status(RequestSink)>& open) {
    absl::Status s = open({.on_batch = [this](v1::TokenBatch b) { Push(std::move(b)); },
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

// The one entry of every token stream, for request `id`: refused without
// the cluster token, while draining, or (`open` null) on a role that does
// not serve the call (`unserved`); else `open` takes the stream.
PrefillReactor* OpenStream(LanguageCore& core, metrics::Registry& metrics,
                           grpc::CallbackServerContext& ctx, const std::string& id, bool accepting,
                           const std::function<absl::Status(RequestSink)>& open,
                           const char* unserved = "") {
  auto* reactor = new PrefillReactor(core, id, metrics);
  if (absl::Status s = CheckClusterToken(ctx); !s.ok()) {
    reactor->Refuse(std::move(s));
  } else if (!open) {
    reactor->Refuse(absl::UnimplementedError(unserved));
  } else if (accepting) {
    reactor->Start(open);
  } else {
    reactor->Refuse(absl::UnavailableError("the language instance is draining"));
  }
  return reactor;
}

constexpr char kOnlyDecode[] = "only role decode takes Decode calls and KV hand-offs";
constexpr char kOnlyElastic[] = "only role elastic joins elastic prefill groups";
constexpr char kOnlyElasticMaster[] = "only role elastic masters elastic requests";

}  // namespace

grpc::ServerWriteReactor<v1::TokenBatch>* LanguageService::Prefill(
    grpc::CallbackServerContext* ctx, const v1::PrefillRequest* request) {
  return OpenStream(
      core_, metrics_, *ctx, request->request_id(), accepting_,
      [this, request](RequestSink sink) { return core_.Submit(*request, std::move(sink)); });
}

grpc::ServerWriteReactor<v1::TokenBatch>* LanguageService::Decode(
    grpc::CallbackServerContext* ctx, const v1::DecodeRequest* request) {
  std::function<absl::Status(RequestSink)> open;
  if (DecodeCalls* calls = core_.role().decode_calls()) {
    open = [calls, request](RequestSink sink) { return calls->Decode(*request, std::move(sink)); };
  }
  return OpenStream(core_, metrics_, *ctx, request->request_id(), accepting_, open, kOnlyDecode);
}

grpc::ServerWriteReactor<v1::TokenBatch>* LanguageService::ElasticPrefill(
    grpc::CallbackServerContext* ctx, const v1::ElasticPrefillRequest* request) {
  std::function<absl::Status(RequestSink)> open;
  if (ElasticCalls* calls = core_.role().elastic_calls()) {
    open = [calls, request](RequestSink sink) {
      return calls->ElasticPrefill(*request, std::move(sink));
    };
  }
  return OpenStream(core_, metrics_, *ctx, request->request().request_id(), accepting_, open,
                    kOnlyElastic);
}

grpc::ServerUnaryReactor* LanguageService::ElasticMoveMaster(grpc::CallbackServerContext* ctx,
                                                             const v1::ElasticMoveRequest* request,
                                                             v1::ElasticMoveAck*) {
  return ServeInternal(ctx, [&] {
    ElasticCalls* calls = core_.role().elastic_calls();
    if (calls == nullptr) return ToGrpcStatus(absl::UnimplementedError(kOnlyElasticMaster));
    return ToGrpcStatus(calls->ElasticMoveMaster(*request));
  });
}

grpc::ServerUnaryReactor* LanguageService::AllocateKv(grpc::CallbackServerContext* ctx,
                                                      const v1::KvAllocateRequest* request,
                                                      v1::KvAllocation* response) {
  return ServeInternal(ctx, [&] {
    DecodeCalls* calls = core_.role().decode_calls();
    if (calls == nullptr) return ToGrpcStatus(absl::UnimplementedError(kOnlyDecode));
    absl::StatusOr<v1::KvAllocation> a = calls->AllocateKv(*request);
    if (a.ok()) *response = std::move(*a);
    return ToGrpcStatus(a.status());
  });
}

grpc::ServerUnaryReactor* LanguageService::CommitKv(grpc::CallbackServerContext* ctx,
                                                    const v1::KvCommit* request,
                                                    v1::KvCommitAck* response) {
  return ServeInternal(ctx, [&] {
    DecodeCalls* calls = core_.role().decode_calls();
    const absl::Status s =
        calls == nullptr ? absl::UnimplementedError(kOnlyDecode) : calls->CommitKv(*request);
    response->set_accepted(s.ok());
    return ToGrpcStatus(s);
  });
}

grpc::ServerUnaryReactor* LanguageService::RetryImages(grpc::CallbackServerContext* ctx,
                                                       const v1::ImageRetry* request,
                                                       v1::ImageRetryAck* response) {
  return ServeInternal(ctx, [&] {
    response->set_accepted(core_.Retry(*request));
    if (!response->accepted()) response->set_error("unknown request");
    return grpc::Status::OK;
  });
}

grpc::ServerUnaryReactor* LanguageService::Abort(grpc::CallbackServerContext* ctx,
                                                 const v1::AbortRequest* request,
                                                 v1::AbortResponse* response) {
  return ServeInternal(ctx, [&] {
    core_.Abort(request->request_id(), request->reason());
    response->set_found(true);
    return grpc::Status::OK;
  });
}

grpc::ServerUnaryReactor* LanguageService::Connect(grpc::CallbackServerContext* ctx,
                                                   const v1::ConnectRequest*,
                                                   v1::ConnectResponse* response) {
  return ServeInternal(ctx, [&] {
    const v1::ConnectRequest& local = transfer_.local_info();
    response->set_instance_id(local.instance_id());
    *response->mutable_ucx() = local.ucx();
    return grpc::Status::OK;
  });
}

grpc::ServerUnaryReactor* LanguageService::GetLoad(grpc::CallbackServerContext* ctx,
                                                   const v1::LoadRequest*,
                                                   v1::LoadReport* response) {
  return ServeInternal(ctx, [&] {
    *response = core_.Load();
    response->set_accepting(accepting_);
    return grpc::Status::OK;
  });
}

}  // namespace mmserve::language
