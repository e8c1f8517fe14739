// What every mmserve service process does around its gRPC handlers: a server
// with grpc.health.v1 health checking and server reflection (so grpcurl and
// health probes work), bound to a host:port, and orderly termination on
// SIGTERM / SIGINT.
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
  GrpcServer(std::unique_ptr<grpc::Server> server, int port)
      : server_(std::move(server)), port_(port) {}
  ~GrpcServer();

  // The port bound (useful with ":0").
  int port() const { return port_; }
  // Health status of the whole server ("" service) and every service on it.
  void SetServing(bool serving);
  // Stops accepting calls; in-flight calls get `grace` to finish, then are
  // cancelled. Idempotent.
  void Shutdown(absl::Duration grace);
  grpc::Server& server() { return *server_; }

 private:
  std::unique_ptr<grpc::Server> server_;
  int port_;
  bool shut_down_ = false;
};

// Options every server gets: large messages (images), keepalive so that
// dead peers are noticed.
[[nodiscard]] absl::StatusOr<std::unique_ptr<GrpcServer>> StartGrpcServer(
    const std::string& address, const std::vector<grpc::Service*>& services,
    int max_message_bytes = 64 << 20);

// Channel arguments for calls between mmserve processes (message size,
// keepalive, fast reconnects).
grpc::ChannelArguments InternalChannelArguments();
// An insecure channel to `address` with InternalChannelArguments.
std::shared_ptr<grpc::Channel> InternalChannel(const std::string& address);

// Blocks SIGTERM, SIGINT and SIGPIPE in the calling thread and in every thread
// it creates later, so that WaitForTerminationSignal receives them.
void BlockTerminationSignals();
// Waits for SIGTERM or SIGINT and returns it.
int WaitForTerminationSignal();

}  // namespace mmserve

#endif  // MMSERVE_COMMON_GRPC_SERVER_H_
