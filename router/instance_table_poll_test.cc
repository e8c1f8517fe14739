// InstanceTable's polls on the router's EventLoop against a real gRPC
// instance: healthy on a good poll, down (the listener on the loop) when it
// stops accepting, and nothing of the table running after Stop.
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/event_loop.h"
#include "common/grpc_server.h"
#include "proto/encoder.grpc.pb.h"
#include "router/instance_table.h"

namespace mmserve::router {
namespace {

// An encoder that answers GetLoad while `accepting`.
class PolledEncoder final : public iv1::Encoder::Service {
 public:
  std::atomic<bool> accepting{true};
  grpc::Status GetLoad(grpc::ServerContext*, const iv1::LoadRequest*,
                       iv1::LoadReport* load) override {
    load->set_instance_id("e0");
    load->set_accepting(accepting.load());
    return grpc::Status::OK;
  }
};

bool Eventually(const std::function<bool()>& done) {
  const absl::Time end = absl::Now() + absl::Seconds(10);
  while (!done()) {
    if (absl::Now() > end) return false;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return true;
}

TEST_CASE("the polls run on the event loop: healthy on a good poll, down (on the loop) after") {
  PolledEncoder encoder;
  auto server = StartGrpcServer("127.0.0.1:0", {&encoder});
  REQUIRE(server.ok());
  EventLoop loop({.name = "router"});
  InstanceTable table({.poll_interval = absl::Milliseconds(10)});
  iv1::InstanceInfo info;
  info.set_instance_id("e0");
  info.set_role(iv1::INSTANCE_ROLE_ENCODER);
  info.set_grpc_address(absl::StrCat("127.0.0.1:", (*server)->port()));
  table.Upsert(info);
  absl::Mutex mu;
  std::vector<std::string> down;  // guarded by mu
  std::atomic<bool> off_loop{false};
  table.SetDownListener([&](const std::string& id) {
    if (!loop.IsInLoopThread()) off_loop = true;
    absl::MutexLock lock(&mu);
    down.push_back(id);
  });
  table.Start(loop);
  REQUIRE(Eventually([&] { return table.IsHealthy("e0"); }));
  CHECK(table.Healthy(Role::kEncoder).size() == 1);
  CHECK(table.LastLoad("e0").instance_id() == "e0");

  encoder.accepting = false;  // draining: out of placement at the next poll
  REQUIRE(Eventually([&] {
    absl::MutexLock lock(&mu);
    return !down.empty();
  }));
  CHECK_FALSE(table.IsHealthy("e0"));
  CHECK(table.Healthy(Role::kEncoder).empty());
  CHECK_FALSE(off_loop.load());
  table.Stop();
  {
    absl::MutexLock lock(&mu);
    CHECK(down == std::vector<std::string>{"e0"});
  }
  // Nothing of the table runs after Stop: a good poll would mark it healthy.
  encoder.accepting = true;
  absl::SleepFor(absl::Milliseconds(50));
  CHECK_FALSE(table.IsHealthy("e0"));
  (*server)->Shutdown(absl::ZeroDuration());
}

}  // namespace
}  // namespace mmserve::router
