// What the three service binaries (encoder, language, router) share around
// their own work: the gRPC server and the Prometheus endpoint on one host,
// registration with the router, the READY line that launchers wait for, and
// the wait for SIGTERM / SIGINT.
//
//   BlockTerminationSignals();  // first thing in main, before any thread
//   ServiceProcessOptions o{.name = "encoder", .instance_id = id, .host = host,
//                           .port = port, .metrics_port = metrics_port};
//   ASSIGN_OR_RETURN(auto process, ServiceProcess::Start(o, {&service}, registry));
//   process->Register(router_address, info, [&] { return service.Load(); });
//   process->Ready();      // health SERVING, then "READY encoder <id> grpc=... metrics=..."
//   process->WaitForTerminationSignal();  // or until options.stop is requested
//   process->Deregister(); // then the binary's own draining
//   process->server().Shutdown(absl::Seconds(drain));
//
// Not thread-safe: the main thread calls everything.
#ifndef MMSERVE_COMMON_SERVICE_PROCESS_H_
#define MMSERVE_COMMON_SERVICE_PROCESS_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/event_loop.h"
#include "common/grpc_server.h"
#include "common/metrics.h"
#include "common/metrics_http.h"
#include "common/registry_client.h"
#include "grpcpp/grpcpp.h"
#include "proto/registry.pb.h"

namespace mmserve {

// A stop the process asks of itself (a component found it out of service
// for good), which ServiceProcess::WaitForTerminationSignal takes as a
// signal. Thread-safe; the first request counts.
class StopRequest {
 public:
  void Request(const absl::Status& why);
  bool requested() const { return requested_.load(std::memory_order_acquire); }

 private:
  std::atomic<bool> requested_{false};
};

struct ServiceProcessOptions {
  std::string name;         // "encoder", "language", "router": log and READY prefix
  std::string instance_id;  // in the READY line
  std::string host = "127.0.0.1";
  int port = 0;          // gRPC (0: pick one)
  int metrics_port = 0;  // Prometheus /metrics (0: pick one; -1: off)
  // host:port the router should call; empty: the gRPC host and the bound
  // port.
  std::string advertise;
  // Also ends WaitForTerminationSignal; may be null. Must outlive the process.
  const StopRequest* stop = nullptr;
  // The gRPC server's message limits, health names and credentials.
  GrpcServerOptions grpc;
  // The gRPC server's host:port (the internal plane, --internal_address)
  // when it differs from host and port; metrics stay on `host`.
  std::string grpc_address;
};

class ServiceProcess {
 public:
  // Starts the gRPC server with `services` (not yet SERVING) and the metrics
  // endpoint over `registry`, which must outlive the process object.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<ServiceProcess>> Start(
      ServiceProcessOptions options, const std::vector<grpc::Service*>& services,
      metrics::Registry& registry);
  ~ServiceProcess();
  ServiceProcess(const ServiceProcess&) = delete;
  ServiceProcess& operator=(const ServiceProcess&) = delete;

  GrpcServer& server() { return *server_; }
  int metrics_port() const { return metrics_ ? metrics_->port() : -1; }
  // host:port the router should call.
  const std::string& advertise() const { return advertise_; }

  // Registers `instance` with the router at `router` (no-op when empty) and
  // keeps a heartbeat with `load`; fills the instance's gRPC address. A
  // router that refuses the instance for good (FAILED_PRECONDITION) ends
  // WaitForTerminationSignal as a stop request does.
  void Register(const std::string& router, internal::v1::InstanceInfo instance,
                std::function<internal::v1::LoadReport()> load);
  // Marks the server SERVING and prints the READY line to stdout:
  // "READY <name> <instance_id> grpc=<advertise> metrics=<port>", or, with
  // `ready_fields` set, "READY <name> <ready_fields>" (the router's line).
  void Ready(absl::string_view ready_fields = "");
  // Blocks until SIGTERM or SIGINT (returns it) or options.stop is
  // requested (returns 0), and logs which.
  int WaitForTerminationSignal();
  // Deregisters from the router (best effort). Idempotent.
  void Deregister();

 private:
  ServiceProcess() = default;

  ServiceProcessOptions options_;
  std::unique_ptr<GrpcServer> server_;
  std::unique_ptr<metrics::MetricsServer> metrics_;
  StopRequest refused_;  // the router refused the registration for good
  // The registration's timers and answers; outlives registration_.
  std::unique_ptr<EventLoop> registry_loop_;
  std::unique_ptr<RegistryClient> registration_;
  std::string advertise_;
};

// A service binary's exit on a start-up error: prints "<name>: <status>" to
// stderr and returns `exit_code` (1 by default; 2 for a usage error).
int ExitWithError(absl::string_view name, const absl::Status& status, int exit_code = 1);
// A service binary's exit on a bad flag: prints "<name>: <message>" to stderr
// and returns 2.
int ExitWithUsage(absl::string_view name, absl::string_view message);

}  // namespace mmserve

#endif  // MMSERVE_COMMON_SERVICE_PROCESS_H_
