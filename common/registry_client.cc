#include "common/registry_client.h"

#include <chrono>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/grpc_server.h"
#include "common/grpc_status.h"
#include "common/logging.h"

namespace mmserve {

namespace iv1 = internal::v1;

struct RegistryClient::Session : std::enable_shared_from_this<Session> {
  Session(RegistryClientOptions o, EventLoop* l)
      : options(std::move(o)),
        loop(l),
        stub(iv1::Registry::NewStub(InternalChannel(options.router))) {}

  // One Register or Heartbeat under way; gRPC owns it until its callback.
  struct Call {
    grpc::ClientContext ctx;
    iv1::RegisterRequest register_request;
    iv1::RegisterResponse register_response;
    iv1::HeartbeatRequest heartbeat_request;
    iv1::HeartbeatResponse heartbeat_response;
  };

  // Loop thread: sends this round's RPC.
  void Round() {
    auto call = std::make_shared<Call>();
    call->ctx.set_deadline(std::chrono::system_clock::now() +
                           absl::ToChronoNanoseconds(options.timeout));
    {
      absl::MutexLock lock(&mu);
      if (stopping) return;
      in_flight = &call->ctx;
    }
    auto self = shared_from_this();
    if (!registered) {
      *call->register_request.mutable_instance() = options.instance;
      stub->async()->Register(&call->ctx, &call->register_request, &call->register_response,
                              [self, call](grpc::Status s) { self->Answered(call, std::move(s)); });
    } else {
      *call->heartbeat_request.mutable_load() = options.load();
      call->heartbeat_request.mutable_load()->set_instance_id(options.instance.instance_id());
      stub->async()->Heartbeat(
          &call->ctx, &call->heartbeat_request, &call->heartbeat_response,
          [self, call](grpc::Status s) { self->Answered(call, std::move(s)); });
    }
  }

  // gRPC's callback thread: hands the answer to the loop.
  void Answered(std::shared_ptr<Call> call, grpc::Status status) {
    absl::MutexLock lock(&mu);
    in_flight = nullptr;
    if (stopping) return;
    loop->Post([self = shared_from_this(), call = std::move(call), status = std::move(status)] {
      self->Apply(*call, status);
    });
  }

  // Loop thread: this round's outcome, then the next round.
  void Apply(const Call& call, const grpc::Status& status) {
    {
      absl::MutexLock lock(&mu);
      if (stopping) return;
    }
    const bool registering = !registered;
    if (registering && status.error_code() == grpc::StatusCode::FAILED_PRECONDITION) {
      LOG(ERROR) << "router " << options.router << " refused " << options.instance.instance_id()
                 << ": " << status.error_message();
      if (options.on_refused) options.on_refused(FromGrpcStatus(status));
      return;
    }
    if (registering && status.ok()) {
      registered = true;
      LOG(INFO) << "registered " << options.instance.instance_id() << " with router "
                << options.router;
    } else if (!registering && status.ok() && !call.heartbeat_response.known()) {
      registered = false;  // the router restarted or dropped this instance
    }
    if (!status.ok() && !reported_outage) {
      LOG(WARNING) << "router " << options.router << " unreachable: " << status.error_message()
                   << " (retrying)";
    }
    reported_outage = !status.ok();
    Schedule(registered ? options.interval : options.retry);
  }

  void Schedule(absl::Duration delay) {
    loop->PostAfter(delay, [self = shared_from_this()] { self->Round(); });
  }

  const RegistryClientOptions options;
  EventLoop* const loop;
  const std::unique_ptr<iv1::Registry::Stub> stub;
  // Loop thread only.
  bool registered = false;
  bool reported_outage = false;

  absl::Mutex mu;
  bool stopping ABSL_GUARDED_BY(mu) = false;
  grpc::ClientContext* in_flight ABSL_GUARDED_BY(mu) = nullptr;
};

RegistryClient::RegistryClient(RegistryClientOptions options, EventLoop* loop)
    : session_(std::make_shared<Session>(std::move(options), loop)) {}

RegistryClient::~RegistryClient() { Stop(); }

void RegistryClient::Start() {
  session_->loop->Post([s = session_] { s->Round(); });
}

void RegistryClient::Stop() {
  Session& s = *session_;
  {
    absl::MutexLock lock(&s.mu);
    if (s.stopping) return;
    s.stopping = true;
    if (s.in_flight != nullptr) s.in_flight->TryCancel();
    s.mu.Await(absl::Condition(
        +[](grpc::ClientContext** c) { return *c == nullptr; }, &s.in_flight));
  }
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(1));
  iv1::DeregisterRequest req;
  req.set_instance_id(s.options.instance.instance_id());
  iv1::DeregisterResponse resp;
  s.stub->Deregister(&ctx, req, &resp).ok();
}

}  // namespace mmserve
