#include "language_service/language_service.h"

#include <deque>
#include <optional>
#include <utility>

#include "absl/strings/str_format.h"
#include "common/clock.h"
#include "common/grpc_status.h"
#include "common/logging.h"

namespace mmserve::language {
namespace {

grpc::ServerUnaryReactor* Answer(grpc::CallbackServerContext* ctx, const grpc::Status& status) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(status);
  return reactor;
}

// One Prefill stream. Batches come from the core's loop thread and leave one
// write at a time; the reactor lives until gRPC is done with it (OnDone) and
// the core has ended the request (on_end), whichever comes last.
class PrefillReactor final : public grpc::ServerWriteReactor<v1::TokenBatch> {
 public:
  PrefillReactor(LanguageCore& core, std::string id, metrics::Registry& metrics)
      : core_(core), id_(std::move(id)), metrics_(metrics) {}

  void Start(const v1::PrefillRequest& request) {
    absl::Status s =
        core_.Submit(request, {.on_batch = [this](v1::TokenBatch b) { Push(std::move(b)); },
                               .on_end = [this](absl::Status st) { End(std::move(st)); }});
    if (!s.ok()) End(std::move(s));
  }

  // Ends the stream with `status` without reaching the core.
  void Refuse(absl::Status status) { End(std::move(status)); }

  void OnWriteDone(bool ok) override {
    std::optional<v1::TokenBatch> next;
    std::optional<absl::Status> finish;
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      if (!ok) client_gone_ = true;
      if (!client_gone_ && !queue_.empty()) {
        next = std::move(queue_.front());
        queue_.pop_front();
      } else if (final_ && !finished_) {
        finish = *final_;
        finished_ = true;
      }
      if (next) writing_ = true;
    }
    if (!ok) core_.Abort(id_, "the stream to the router broke");
    if (next) Write(std::move(*next));
    if (finish) Finish(ToGrpcStatus(*finish));
  }

  void OnCancel() override { core_.Abort(id_, "cancelled by the caller"); }

  void OnDone() override { Unref(); }

 private:
  void Push(v1::TokenBatch b) {
    {
      absl::MutexLock lock(&mu_);
      if (client_gone_ || finished_) return;
      if (writing_) {
        queue_.push_back(std::move(b));
        return;
      }
      writing_ = true;
    }
    Write(std::move(b));
  }

  void Write(v1::TokenBatch b) {
    current_ = std::move(b);
    StartWrite(&current_);
  }

  // The core ended the request: finish once the queue has drained.
  void End(absl::Status status) {
    bool finish_now = false;
    {
      absl::MutexLock lock(&mu_);
      final_ = status;
      if (!writing_ && !finished_) {
        finished_ = true;
        finish_now = true;
      }
    }
    const std::string code = absl::StatusCodeToString(status.code());
    metrics_
        .GetCounter("mmserve_language_requests_total", "Prefill streams by final code.",
                    {{"code", code}})
        .Increment();
    LOG(INFO) << "request " << id_ << ": " << (status.ok() ? "OK" : status.ToString()) << ", "
              << absl::StrFormat("%.1f ms", clock_.ElapsedSeconds() * 1e3);
    if (finish_now) Finish(ToGrpcStatus(status));
    Unref();
  }

  void Unref() {
    bool last;
    {
      absl::MutexLock lock(&mu_);
      last = --refs_ == 0;
    }
    if (last) delete this;
  }

  LanguageCore& core_;
  const std::string id_;
  metrics::Registry& metrics_;
  Stopwatch clock_;
  v1::TokenBatch current_;  // the write in flight
  absl::Mutex mu_;
  std::deque<v1::TokenBatch> queue_ ABSL_GUARDED_BY(mu_);
  std::optional<absl::Status> final_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool client_gone_ ABSL_GUARDED_BY(mu_) = false;
  int refs_ ABSL_GUARDED_BY(mu_) = 2;  // gRPC's (OnDone) and the core's (on_end)
};

}  // namespace

LanguageService::LanguageService(LanguageCore& core, transfer::TransferEngine& transfer,
                                 metrics::Registry& metrics)
    : core_(core), transfer_(transfer), metrics_(metrics) {}

grpc::ServerWriteReactor<v1::TokenBatch>* LanguageService::Prefill(
    grpc::CallbackServerContext* ctx, const v1::PrefillRequest* request) {
  auto* reactor = new PrefillReactor(core_, request->request_id(), metrics_);
  if (accepting_) {
    reactor->Start(*request);
  } else {
    reactor->Refuse(absl::UnavailableError("the language instance is draining"));
  }
  return reactor;
}

grpc::ServerWriteReactor<v1::TokenBatch>* LanguageService::Decode(
    grpc::CallbackServerContext* ctx, const v1::DecodeRequest* request) {
  class Refuse final : public grpc::ServerWriteReactor<v1::TokenBatch> {
   public:
    Refuse() {
      Finish(grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                          "role both does not decode hand-offs (use --role=decode)"));
    }
    void OnDone() override { delete this; }
  };
  return new Refuse();
}

grpc::ServerUnaryReactor* LanguageService::AllocateKv(grpc::CallbackServerContext* ctx,
                                                      const v1::KvAllocateRequest*,
                                                      v1::KvAllocation*) {
  return Answer(ctx, grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                                  "role both takes no KV hand-offs (use --role=decode)"));
}

grpc::ServerUnaryReactor* LanguageService::CommitKv(grpc::CallbackServerContext* ctx,
                                                    const v1::KvCommit*, v1::KvCommitAck*) {
  return Answer(ctx, grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                                  "role both takes no KV hand-offs (use --role=decode)"));
}

grpc::ServerUnaryReactor* LanguageService::RetryImages(grpc::CallbackServerContext* ctx,
                                                       const v1::ImageRetry* request,
                                                       v1::ImageRetryAck* response) {
  response->set_accepted(core_.Retry(*request));
  if (!response->accepted()) response->set_error("unknown request");
  return Answer(ctx, grpc::Status::OK);
}

grpc::ServerUnaryReactor* LanguageService::Abort(grpc::CallbackServerContext* ctx,
                                                 const v1::AbortRequest* request,
                                                 v1::AbortResponse* response) {
  core_.Abort(request->request_id(), request->reason());
  response->set_found(true);
  return Answer(ctx, grpc::Status::OK);
}

grpc::ServerUnaryReactor* LanguageService::Connect(grpc::CallbackServerContext* ctx,
                                                   const v1::ConnectRequest*,
                                                   v1::ConnectResponse* response) {
  const v1::ConnectRequest& local = transfer_.local_info();
  response->set_instance_id(local.instance_id());
  *response->mutable_ucx() = local.ucx();
  return Answer(ctx, grpc::Status::OK);
}

grpc::ServerUnaryReactor* LanguageService::GetLoad(grpc::CallbackServerContext* ctx,
                                                   const v1::LoadRequest*,
                                                   v1::LoadReport* response) {
  *response = core_.Load();
  response->set_accepting(accepting_);
  return Answer(ctx, grpc::Status::OK);
}

}  // namespace mmserve::language
