// RegistryClient against a real gRPC Registry server that records what it
// is sent and can forget, refuse or stall.
#include "common/registry_client.h"

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "catch2/catch.hpp"
#include "common/event_loop.h"
#include "common/grpc_server.h"

namespace mmserve {
namespace {

namespace iv1 = internal::v1;

class RecordingRegistry final : public iv1::Registry::Service {
 public:
  grpc::Status Register(grpc::ServerContext* ctx, const iv1::RegisterRequest* req,
                        iv1::RegisterResponse*) override {
    if (stall_register_) {
      while (!ctx->IsCancelled()) absl::SleepFor(absl::Milliseconds(5));
      return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled");
    }
    absl::MutexLock lock(&mu_);
    events_.push_back("register " + req->instance().instance_id());
    if (refuse_) return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "not on this host");
    known_ = true;
    return grpc::Status::OK;
  }
  grpc::Status Heartbeat(grpc::ServerContext*, const iv1::HeartbeatRequest* req,
                         iv1::HeartbeatResponse* resp) override {
    absl::MutexLock lock(&mu_);
    events_.push_back("heartbeat " + req->load().instance_id() +
                      " waiting=" + std::to_string(req->load().waiting()));
    resp->set_known(known_);
    return grpc::Status::OK;
  }
  grpc::Status Deregister(grpc::ServerContext*, const iv1::DeregisterRequest* req,
                          iv1::DeregisterResponse*) override {
    absl::MutexLock lock(&mu_);
    events_.push_back("deregister " + req->instance_id());
    known_ = false;
    return grpc::Status::OK;
  }

  void Forget() {
    absl::MutexLock lock(&mu_);
    known_ = false;
  }
  void set_refuse(bool refuse) {
    absl::MutexLock lock(&mu_);
    refuse_ = refuse;
  }
  std::atomic<bool> stall_register_{false};

  std::vector<std::string> events() {
    absl::MutexLock lock(&mu_);
    return events_;
  }
  int Count(const std::string& event) {
    int n = 0;
    for (const std::string& e : events()) n += e == event ? 1 : 0;
    return n;
  }
  // Waits up to 10 s for `n` copies of `event`.
  bool WaitFor(const std::string& event, int n = 1) {
    const absl::Time until = absl::Now() + absl::Seconds(10);
    while (absl::Now() < until) {
      if (Count(event) >= n) return true;
      absl::SleepFor(absl::Milliseconds(5));
    }
    return false;
  }

 private:
  absl::Mutex mu_;
  std::vector<std::string> events_ ABSL_GUARDED_BY(mu_);
  bool known_ ABSL_GUARDED_BY(mu_) = false;
  bool refuse_ ABSL_GUARDED_BY(mu_) = false;
};

RegistryClientOptions Options(int port) {
  RegistryClientOptions o;
  o.router = "127.0.0.1:" + std::to_string(port);
  o.instance.set_instance_id("lang-0");
  o.load = [] {
    iv1::LoadReport load;
    load.set_waiting(3);
    return load;
  };
  o.interval = absl::Milliseconds(20);
  o.retry = absl::Milliseconds(20);
  return o;
}

TEST_CASE("registers, reports its load, registers again when forgotten, deregisters on Stop") {
  RecordingRegistry registry;
  auto server = StartGrpcServer("127.0.0.1:0", {&registry});
  REQUIRE(server.ok());
  EventLoop loop({.name = "registry"});
  RegistryClient client(Options((*server)->port()), &loop);
  client.Start();
  REQUIRE(registry.WaitFor("heartbeat lang-0 waiting=3", 2));
  CHECK(registry.Count("register lang-0") == 1);

  registry.Forget();  // as a restarted router would
  REQUIRE(registry.WaitFor("register lang-0", 2));
  REQUIRE(registry.WaitFor("heartbeat lang-0 waiting=3", 4));

  client.Stop();
  const std::vector<std::string> events = registry.events();
  REQUIRE(!events.empty());
  CHECK(events.back() == "deregister lang-0");
  absl::SleepFor(absl::Milliseconds(100));  // five intervals: nothing more arrives
  CHECK(registry.events().size() == events.size());
  client.Stop();  // idempotent
  CHECK(registry.Count("deregister lang-0") == 1);
}

TEST_CASE("a refusal is final: on_refused once, then no more calls") {
  RecordingRegistry registry;
  registry.set_refuse(true);
  auto server = StartGrpcServer("127.0.0.1:0", {&registry});
  REQUIRE(server.ok());
  EventLoop loop({.name = "registry"});
  std::atomic<int> refusals{0};
  absl::Notification refused;
  absl::Status why;
  RegistryClientOptions o = Options((*server)->port());
  o.on_refused = [&](const absl::Status& s) {
    why = s;
    ++refusals;
    refused.Notify();
  };
  RegistryClient client(std::move(o), &loop);
  client.Start();
  REQUIRE(refused.WaitForNotificationWithTimeout(absl::Seconds(10)));
  absl::SleepFor(absl::Milliseconds(100));
  CHECK(refusals == 1);
  CHECK(why.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(registry.Count("register lang-0") == 1);
  CHECK(registry.Count("heartbeat lang-0 waiting=3") == 0);
}

TEST_CASE("retries until the router comes up") {
  // A port that nothing listens on yet.
  int port = 0;
  {
    RecordingRegistry probe;
    auto s = StartGrpcServer("127.0.0.1:0", {&probe});
    REQUIRE(s.ok());
    port = (*s)->port();
  }
  EventLoop loop({.name = "registry"});
  RegistryClient client(Options(port), &loop);
  client.Start();
  absl::SleepFor(absl::Milliseconds(150));  // several failed attempts
  RecordingRegistry registry;
  auto server = StartGrpcServer("127.0.0.1:" + std::to_string(port), {&registry});
  REQUIRE(server.ok());
  CHECK(registry.WaitFor("heartbeat lang-0 waiting=3"));
  client.Stop();
  CHECK(registry.events().back() == "deregister lang-0");
}

// A client whose Register is stuck in the router's handler (60 s deadline).
struct StalledRouter {
  StalledRouter() {
    registry.stall_register_ = true;
    server = *StartGrpcServer("127.0.0.1:0", {&registry});
    RegistryClientOptions o = Options(server->port());
    o.timeout = absl::Seconds(60);
    client = std::make_unique<RegistryClient>(std::move(o), &loop);
    client->Start();
    absl::SleepFor(absl::Milliseconds(100));
  }
  RecordingRegistry registry;
  std::unique_ptr<GrpcServer> server;
  EventLoop loop{{.name = "registry"}};
  std::unique_ptr<RegistryClient> client;
};

TEST_CASE("Stop cancels a call in flight instead of waiting for its deadline") {
  StalledRouter stalled;
  RegistryClient& client = *stalled.client;
  RecordingRegistry& registry = stalled.registry;
  const absl::Time start = absl::Now();
  client.Stop();
  CHECK(absl::Now() - start < absl::Seconds(10));
  CHECK(registry.Count("deregister lang-0") == 1);
  CHECK(registry.Count("register lang-0") == 0);
}

TEST_CASE("the loop stays free while the router is slow") {
  StalledRouter stalled;
  // Another task on the same loop runs although the Register has not answered.
  const absl::Status ran = stalled.loop.RunAndWait([] { return absl::OkStatus(); });
  CHECK(ran.ok());
  stalled.client->Stop();
}

}  // namespace
}  // namespace mmserve
