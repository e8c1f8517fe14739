#include "router/router_service.h"

#include <deque>
#include <optional>
#include <utility>

#include "common/grpc_status.h"

namespace mmserve::router {
namespace {

grpc::ServerUnaryReactor* Answer(grpc::CallbackServerContext* ctx, const grpc::Status& status) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(status);
  return reactor;
}

// One Generate stream to a client: responses leave one write at a time; the
// reactor lives until gRPC is done (OnDone) and the call has ended, whichever
// is last. A client cancel or deadline cancels the call.
class GenerateReactor final : public grpc::ServerWriteReactor<mmserve::v1::GenerateResponse> {
 public:
  void Begin(const RouterContext& context, CallTracker& tracker,
             const mmserve::v1::GenerateRequest& request,
             std::chrono::system_clock::time_point deadline) {
    auto call = StartTrackedCall(
        context, tracker, request,
        {.on_response = [this](mmserve::v1::GenerateResponse r) { Push(std::move(r)); },
         .on_end = [this](absl::Status s) { End(std::move(s)); }},
        deadline);
    absl::MutexLock lock(&mu_);
    if (!ended_) call_ = std::move(call);
  }

  void OnCancel() override {
    std::shared_ptr<GenerateCall> call;
    {
      absl::MutexLock lock(&mu_);
      call = call_;
    }
    if (call) call->Cancel("cancelled by the client");
  }

  void OnWriteDone(bool ok) override {
    std::optional<mmserve::v1::GenerateResponse> next;
    std::optional<absl::Status> finish;
    std::shared_ptr<GenerateCall> cancel;
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      if (!ok) {
        gone_ = true;
        cancel = call_;
      }
      if (!gone_ && !queue_.empty()) {
        next = std::move(queue_.front());
        queue_.pop_front();
        writing_ = true;
      } else if (final_ && !finished_) {
        finish = final_;
        finished_ = true;
      }
    }
    if (cancel) cancel->Cancel("the client stream broke");
    if (next) Write(std::move(*next));
    if (finish) Finish(ToGrpcStatus(*finish));
  }

  void OnDone() override { Unref(); }

 private:
  void Push(mmserve::v1::GenerateResponse r) {
    {
      absl::MutexLock lock(&mu_);
      if (gone_ || finished_) return;
      if (writing_) {
        queue_.push_back(std::move(r));
        return;
      }
      writing_ = true;
    }
    Write(std::move(r));
  }

  void Write(mmserve::v1::GenerateResponse r) {
    current_ = std::move(r);
    StartWrite(&current_);
  }

  void End(absl::Status status) {
    bool finish_now = false;
    {
      absl::MutexLock lock(&mu_);
      ended_ = true;
      call_.reset();
      final_ = status;
      if (!writing_ && !finished_) {
        finished_ = true;
        finish_now = true;
      }
    }
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

  mmserve::v1::GenerateResponse current_;
  absl::Mutex mu_;
  std::shared_ptr<GenerateCall> call_ ABSL_GUARDED_BY(mu_);
  std::deque<mmserve::v1::GenerateResponse> queue_ ABSL_GUARDED_BY(mu_);
  std::optional<absl::Status> final_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  bool gone_ ABSL_GUARDED_BY(mu_) = false;
  int refs_ ABSL_GUARDED_BY(mu_) = 2;  // gRPC's (OnDone) and the call's (on_end)
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

std::shared_ptr<GenerateCall> StartTrackedCall(const RouterContext& context, CallTracker& tracker,
                                               mmserve::v1::GenerateRequest request, CallSink sink,
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

grpc::ServerWriteReactor<mmserve::v1::GenerateResponse>* InferenceService::Generate(
    grpc::CallbackServerContext* ctx, const mmserve::v1::GenerateRequest* request) {
  auto* reactor = new GenerateReactor();
  auto deadline = ctx->deadline();
  const auto latest = std::chrono::system_clock::now() +
                      absl::ToChronoNanoseconds(context_.options.default_timeout);
  if (deadline > latest) deadline = latest;
  reactor->Begin(context_, tracker_, *request, deadline);
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
  card->set_prefill_instances(
      static_cast<uint32_t>(context.instances->Healthy(Role::kLanguage).size()));
  card->set_decode_instances(card->prefill_instances());
  return out;
}

grpc::ServerUnaryReactor* InferenceService::ListModels(grpc::CallbackServerContext* ctx,
                                                       const mmserve::v1::ListModelsRequest*,
                                                       mmserve::v1::ListModelsResponse* response) {
  *response = DescribeModels(context_);
  return Answer(ctx, grpc::Status::OK);
}

grpc::ServerUnaryReactor* RegistryService::Register(grpc::CallbackServerContext* ctx,
                                                    const iv1::RegisterRequest* request,
                                                    iv1::RegisterResponse* response) {
  const iv1::InstanceInfo& info = request->instance();
  if (info.instance_id().empty() || info.grpc_address().empty() ||
      info.role() == iv1::INSTANCE_ROLE_UNSPECIFIED) {
    return Answer(ctx, grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                    "instance_id, grpc_address and role are required"));
  }
  if (info.role() == iv1::INSTANCE_ROLE_PREFILL || info.role() == iv1::INSTANCE_ROLE_DECODE) {
    return Answer(ctx, grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                                    "this router places encoder and role-both instances"));
  }
  table_.Upsert(info, /*registered=*/true);
  response->set_heartbeat_interval_s(1);
  return Answer(ctx, grpc::Status::OK);
}

grpc::ServerUnaryReactor* RegistryService::Heartbeat(grpc::CallbackServerContext* ctx,
                                                     const iv1::HeartbeatRequest* request,
                                                     iv1::HeartbeatResponse* response) {
  response->set_known(table_.Report(request->load()));
  return Answer(ctx, grpc::Status::OK);
}

grpc::ServerUnaryReactor* RegistryService::Deregister(grpc::CallbackServerContext* ctx,
                                                      const iv1::DeregisterRequest* request,
                                                      iv1::DeregisterResponse*) {
  table_.Remove(request->instance_id());
  return Answer(ctx, grpc::Status::OK);
}

}  // namespace mmserve::router
