// InstanceTable's locking with many threads registering, heartbeating,
// removing and looking up instances at once (the Registry service and every
// GenerateCall do this concurrently in the router). The poller is not
// started there, so no instance ever turns healthy: placement must see none.
// Run under ThreadSanitizer by tools/tsan/run_tsan_tests.sh (no gRPC call
// here: instance_table_poll_test has the polls).
#include "router/instance_table.h"

#include <atomic>
#include <catch2/catch.hpp>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"

namespace mmserve::router {
namespace {

iv1::InstanceInfo Info(int slot, int port) {
  iv1::InstanceInfo info;
  info.set_instance_id(absl::StrCat("i", slot));
  info.set_role(slot % 2 == 0 ? iv1::INSTANCE_ROLE_ENCODER : iv1::INSTANCE_ROLE_BOTH);
  // Channels connect lazily: nothing listens on these ports and nothing dials.
  info.set_grpc_address(absl::StrCat("127.0.0.1:", port));
  return info;
}

TEST_CASE("concurrent upserts, heartbeats, removals and lookups keep every entry whole") {
  InstanceTable table({});
  constexpr int kThreads = 4;
  constexpr int kOps = 3000;
  constexpr int kSlots = 8;
  std::atomic<int> wrong{0};  // Catch2 asserts only on this thread
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      uint64_t x = 0x9e3779b97f4a7c15ull * (t + 1);
      for (int i = 0; i < kOps; ++i) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;  // xorshift
        const int slot = static_cast<int>(x % kSlots);
        const std::string id = absl::StrCat("i", slot);
        switch ((x >> 8) % 6) {
          case 0:  // re-registration, sometimes at a new address
            table.Upsert(Info(slot, 20000 + static_cast<int>((x >> 16) % 3)), true);
            break;
          case 1: {
            iv1::LoadReport load;
            load.set_instance_id(id);
            load.set_waiting(slot);
            table.Report(load);
            break;
          }
          case 2:
            if ((x >> 20) % 8 == 0) table.Remove(id);
            break;
          case 3:
            if (auto inst = table.Get(id)) {
              const Role want = slot % 2 == 0 ? Role::kEncoder : Role::kLanguage;
              if (inst->id != id || inst->role != want || inst->channel == nullptr ||
                  (want == Role::kEncoder) != (inst->encoder != nullptr) ||
                  (want == Role::kLanguage) != (inst->language != nullptr)) {
                ++wrong;
              }
              table.Charge(id, "call", 1);  // what a placer does with a placed instance
              table.Discharge(id, "call");
            }
            break;
          case 4: {
            const iv1::LoadReport load = table.LastLoad(id);
            // Either no report yet (or removed) or this slot's own report.
            if (!load.instance_id().empty() &&
                (load.instance_id() != id || load.waiting() != static_cast<uint32_t>(slot))) {
              ++wrong;
            }
            break;
          }
          default:
            if (table.IsHealthy(id) || !table.Healthy(Role::kEncoder).empty() ||
                !table.Healthy(Role::kLanguage).empty()) {
              ++wrong;  // never polled, so never healthy
            }
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(wrong.load() == 0);
  for (int slot = 0; slot < kSlots; ++slot) {
    if (auto inst = table.Get(absl::StrCat("i", slot))) {
      CHECK(inst->address.rfind("127.0.0.1:2000", 0) == 0);
    }
  }
}

TEST_CASE("an shm instance on another host than a known shm instance is refused") {
  InstanceTable table({});
  auto with = [](int slot, const std::string& profile, const std::string& host) {
    iv1::InstanceInfo info = Info(slot, 1);
    info.mutable_ucx()->set_transport_profile(profile);
    info.mutable_ucx()->set_host(host);
    return info;
  };
  table.Upsert(with(0, "shm", "a boot:1 ipc:1"));
  CHECK(table.Admit(with(1, "shm", "a boot:1 ipc:1")).ok());
  CHECK(table.Admit(with(0, "shm", "b boot:2 ipc:2")).ok());  // itself, moved
  CHECK(table.Admit(with(1, "tcp", "b boot:2 ipc:2")).ok());
  const absl::Status refused = table.Admit(with(1, "shm", "a boot:1 ipc:2"));
  CHECK(refused.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(refused.message().find("--profile=tcp") != std::string::npos);
}

}  // namespace
}  // namespace mmserve::router
