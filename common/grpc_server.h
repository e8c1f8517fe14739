// What every mmserve service process does around its gRPC handlers: a server
// with grpc.health.v1 health checking (for the whole server and, by name, for
// each service listed in the options) and server reflection, which also
// serves health.proto's descriptor (so grpcurl and health probes work),
// bound to a host:port, and orderly termination on SIGTERM / SIGINT.
//
//   BlockTerminationSignals();            // first thing in main, before threads
//   ASSIGN_OR_RETURN(auto server, StartGrpcServer("0.0.0.0:50051", {&service}));
//   server.SetServing(true);
//   int sig = WaitForTerminationSignal(); // then drain and shut down
//
// Thread-safe except BlockTerminationSignals (main thread, before others).
#ifndef MMSERVE_COMMON_GRPC_SERVER_H_
#define MMSERVE_COMMON_GRPC_SERVER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"

namespace mmserve {

class GrpcServer {
 public:
  GrpcServer(std::unique_ptr<grpc::Server> server, int port,
             std::vector<std::string> health_services = {})
      : server_(std::move(server)), port_(port), health_services_(std::move(health_services)) {}
  ~GrpcServer();

  // The port bound (useful with ":0").
  int port() const { return port_; }
  // Health status of the whole server ("" service) and of every service
  // named in GrpcServerOptions::health_services.
  void SetServing(bool serving);
  // Stops accepting calls; in-flight calls get `grace` to finish, then are
  // cancelled. Idempotent.
  void Shutdown(absl::Duration grace);
  grpc::Server& server() { return *server_; }

 private:
  std::unique_ptr<grpc::Server> server_;
  int port_;
  std::vector<std::string> health_services_;
  bool shut_down_ = false;
};

struct GrpcServerOptions {
  // The largest request message accepted (RESOURCE_EXHAUSTED beyond) and the
  // largest reply sent.
  int max_receive_bytes = 64 << 20;
  int max_send_bytes = 64 << 20;
  // Fully qualified names health answers for, e.g. "mmserve.v1.Inference".
  std::vector<std::string> health_services;
  // How the port is secured; null: plaintext.
  std::shared_ptr<grpc::ServerCredentials> credentials;
};

// Options every server gets: message size limits, keepalive so that dead
// peers are noticed.
[[nodiscard]] absl::StatusOr<std::unique_ptr<GrpcServer>> StartGrpcServer(
    const std::string& address, const std::vector<grpc::Service*>& services,
    const GrpcServerOptions& options = {});

// Channel arguments for calls between mmserve processes (message size,
// keepalive, fast reconnects).
grpc::ChannelArguments InternalChannelArguments();
// A channel to `address` with InternalChannelArguments that carries the
// cluster token on every call (common/internal_plane.h).
std::shared_ptr<grpc::Channel> InternalChannel(const std::string& address);

// Blocks SIGTERM, SIGINT and SIGPIPE in the calling thread and in every thread
// it creates later, so that WaitForTerminationSignal receives them.
void BlockTerminationSignals();
// Waits for SIGTERM or SIGINT and returns it.
int WaitForTerminationSignal();

}  // namespace mmserve

#endif  // MMSERVE_COMMON_GRPC_SERVER_H_
