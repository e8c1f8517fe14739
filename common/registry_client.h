// An instance's side of the router's Registry: registers at start, sends its
// load every `interval`, registers again when the router forgot it (router
// restart), and deregisters on Stop so the router drains it at once.
//
//   EventLoop loop({.name = "registry"});
//   RegistryClient reg({.router = "localhost:50051", .instance = info,
//                       .load = [&] { return core.Load(); }}, &loop);
//   reg.Start();
//   ...
//   reg.Stop();  // deregisters
//
// Every round is a timer on `loop` that sends one asynchronous RPC (gRPC's
// callback API); its answer comes back to the loop, which schedules the next
// round, so the loop never waits on the router. Failures to reach the router
// are logged once per outage and retried; the instance serves regardless. A
// refusal (FAILED_PRECONDITION) is final: it goes to `on_refused`, on the
// loop thread. Start and Stop may be called from any thread but the loop's.
#ifndef MMSERVE_COMMON_REGISTRY_CLIENT_H_
#define MMSERVE_COMMON_REGISTRY_CLIENT_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/event_loop.h"
#include "proto/registry.grpc.pb.h"

namespace mmserve {

struct RegistryClientOptions {
  std::string router;  // host:port of the router's gRPC server
  internal::v1::InstanceInfo instance;
  // A snapshot of the instance's load; called on the loop thread.
  std::function<internal::v1::LoadReport()> load;
  absl::Duration interval = absl::Milliseconds(500);
  // Between registration attempts while the router is unreachable.
  absl::Duration retry = absl::Milliseconds(200);
  // Each Register or Heartbeat call's deadline.
  absl::Duration timeout = absl::Seconds(2);
  // Called once when the router refuses the registration for good
  // (FAILED_PRECONDITION, e.g. the shm profile across hosts); registering
  // stops then. May be empty.
  std::function<void(const absl::Status&)> on_refused;
};

class RegistryClient {
 public:
  // `loop` must outlive Stop().
  RegistryClient(RegistryClientOptions options, EventLoop* loop);
  ~RegistryClient();
  RegistryClient(const RegistryClient&) = delete;
  RegistryClient& operator=(const RegistryClient&) = delete;

  void Start();
  // Cancels the call in flight and waits for it, then deregisters (best
  // effort, 1 s) so that no late Register can add the instance back.
  // Idempotent.
  void Stop();

 private:
  // What the loop's timers and gRPC's callbacks share; they hold it, so a
  // timer that fires after Stop finds it stopped, not freed.
  struct Session;

  std::shared_ptr<Session> session_;
};

}  // namespace mmserve

#endif  // MMSERVE_COMMON_REGISTRY_CLIENT_H_
