#include "common/grpc_server.h"

#include <signal.h>

#include "absl/strings/str_cat.h"
#include "common/internal_plane.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "proto/health.pb.h"

namespace mmserve {

GrpcServer::~GrpcServer() { Shutdown(absl::ZeroDuration()); }

void GrpcServer::SetServing(bool serving) {
  if (grpc::HealthCheckServiceInterface* health = server_->GetHealthCheckService()) {
    health->SetServingStatus(serving);
    for (const std::string& name : health_services_) health->SetServingStatus(name, serving);
  }
}

void GrpcServer::Shutdown(absl::Duration grace) {
  if (shut_down_) return;
  shut_down_ = true;
  SetServing(false);
  server_->Shutdown(std::chrono::system_clock::now() + absl::ToChronoNanoseconds(grace));
  server_->Wait();
}

absl::StatusOr<std::unique_ptr<GrpcServer>> StartGrpcServer(
    const std::string& address, const std::vector<grpc::Service*>& services,
    const GrpcServerOptions& options) {
  // Links health.proto's generated descriptor into the binary, so that
  // reflection can serve it (grpc++'s own health service carries none).
  (void)grpc::health::v1::HealthCheckRequest::descriptor();
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(
      address, options.credentials ? options.credentials : grpc::InsecureServerCredentials(),
      &port);
  builder.SetMaxReceiveMessageSize(options.max_receive_bytes);
  builder.SetMaxSendMessageSize(options.max_send_bytes);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 5000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  for (grpc::Service* s : services) builder.RegisterService(s);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", address));
  }
  auto out = std::make_unique<GrpcServer>(std::move(server), port, options.health_services);
  // Named services start NOT_SERVING until SetServing(true); other names
  // stay NOT_FOUND.
  if (grpc::HealthCheckServiceInterface* health = out->server().GetHealthCheckService()) {
    for (const std::string& name : options.health_services) health->SetServingStatus(name, false);
  }
  return out;
}

grpc::ChannelArguments InternalChannelArguments() {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  args.SetMaxSendMessageSize(64 << 20);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  // Despite its name this is the time one connection attempt (TCP connect
  // and HTTP/2 handshake) may take. It was 100 ms: on a loaded machine
  // handshakes took longer, were cut ("tcp handshaker shutdown") and
  // fail-fast calls on the new channel ended UNAVAILABLE. 2 s still puts an
  // unreachable peer in TRANSIENT_FAILURE well before any call deadline.
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 2000);
  return args;
}

std::shared_ptr<grpc::Channel> InternalChannel(const std::string& address) {
  return grpc::experimental::CreateCustomChannelWithInterceptors(
      address, InternalChannelCredentials(), InternalChannelArguments(),
      InternalClientInterceptors());
}

void BlockTerminationSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  signal(SIGPIPE, SIG_IGN);
}

int WaitForTerminationSignal() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  int sig = 0;
  while (sigwait(&set, &sig) != 0) {
  }
  return sig;
}

}  // namespace mmserve
