// An instance's side of the router's Registry: registers at start, sends its
// load every `interval`, registers again when the router forgot it (router
// restart), and deregisters on Stop so the router drains it at once.
//
//   RegistryClient reg({.router = "localhost:50051", .instance = info,
//                       .load = [&] { return core.Load(); }});
//   reg.Start();
//   ...
//   reg.Stop();  // deregisters
//
// Failures to reach the router are logged once per outage and retried; the
// instance serves regardless. A refusal (FAILED_PRECONDITION) is final: it
// goes to `on_refused`. Thread-safe.
#ifndef MMSERVE_COMMON_REGISTRY_CLIENT_H_
#define MMSERVE_COMMON_REGISTRY_CLIENT_H_

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/registry.grpc.pb.h"

namespace mmserve {

struct RegistryClientOptions {
  std::string router;  // host:port of the router's gRPC server
  internal::v1::InstanceInfo instance;
  std::function<internal::v1::LoadReport()> load;
  absl::Duration interval = absl::Milliseconds(500);
  // Called once when the router refuses the registration for good
  // (FAILED_PRECONDITION, e.g. the shm profile across hosts); registering
  // stops then. May be empty.
  std::function<void(const absl::Status&)> on_refused;
};

class RegistryClient {
 public:
  explicit RegistryClient(RegistryClientOptions options);
  ~RegistryClient();
  RegistryClient(const RegistryClient&) = delete;
  RegistryClient& operator=(const RegistryClient&) = delete;

  void Start();
  // Deregisters (best effort, 1 s) and joins the heartbeat thread. Idempotent.
  void Stop();

 private:
  void Loop();

  const RegistryClientOptions options_;
  std::unique_ptr<internal::v1::Registry::Stub> stub_;
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace mmserve

#endif  // MMSERVE_COMMON_REGISTRY_CLIENT_H_
