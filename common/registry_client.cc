#include "common/registry_client.h"

#include <chrono>
#include <utility>

#include "common/grpc_server.h"
#include "common/grpc_status.h"
#include "common/logging.h"

namespace mmserve {

namespace iv1 = internal::v1;

RegistryClient::RegistryClient(RegistryClientOptions options)
    : options_(std::move(options)),
      stub_(iv1::Registry::NewStub(InternalChannel(options_.router))) {}

RegistryClient::~RegistryClient() { Stop(); }

void RegistryClient::Start() {
  thread_ = std::thread([this] { Loop(); });
}

void RegistryClient::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(1));
  iv1::DeregisterRequest req;
  req.set_instance_id(options_.instance.instance_id());
  iv1::DeregisterResponse resp;
  stub_->Deregister(&ctx, req, &resp).ok();
}

void RegistryClient::Loop() {
  bool registered = false;
  bool reported_outage = false;
  absl::Duration interval = options_.interval;
  for (;;) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    grpc::Status status;
    if (!registered) {
      iv1::RegisterRequest req;
      *req.mutable_instance() = options_.instance;
      iv1::RegisterResponse resp;
      status = stub_->Register(&ctx, req, &resp);
      if (status.error_code() == grpc::StatusCode::FAILED_PRECONDITION) {
        LOG(ERROR) << "router " << options_.router << " refused " << options_.instance.instance_id()
                   << ": " << status.error_message();
        if (options_.on_refused) options_.on_refused(FromGrpcStatus(status));
        return;
      }
      if (status.ok()) {
        registered = true;
        LOG(INFO) << "registered " << options_.instance.instance_id() << " with router "
                  << options_.router;
      }
    } else {
      iv1::HeartbeatRequest req;
      *req.mutable_load() = options_.load();
      req.mutable_load()->set_instance_id(options_.instance.instance_id());
      iv1::HeartbeatResponse resp;
      status = stub_->Heartbeat(&ctx, req, &resp);
      if (status.ok() && !resp.known()) registered = false;
    }
    if (!status.ok() && !reported_outage) {
      LOG(WARNING) << "router " << options_.router << " unreachable: " << status.error_message()
                   << " (retrying)";
    }
    reported_outage = !status.ok();
    absl::MutexLock lock(&mu_);
    if (mu_.AwaitWithTimeout(absl::Condition(&stopping_),
                             registered ? interval : absl::Milliseconds(200))) {
      return;
    }
  }
}

}  // namespace mmserve
