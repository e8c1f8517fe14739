// Role prefill's loop never waits for a hand-off: while one request's
// hand-off is stuck (a decode instance that does not answer AllocateKv),
// other requests prefill and hand off; an abort meanwhile ends the stuck
// request at once; its blocks are freed once the hand-off gives up.
// Ordering is asserted from the streams' events, not from timing.
#include <atomic>
#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "language_service/roles_testing.h"

namespace mmserve::language {
namespace {

using namespace testing;  // NOLINT: the roles test support

// A decode instance whose AllocateKv waits until the test lets it answer,
// then answers UNAVAILABLE: a hand-off stuck at its first round trip.
class StuckDecode final : public v1::Language::Service {
 public:
  StuckDecode() {
    auto s = StartGrpcServer("127.0.0.1:0", {this});
    REQUIRE(s.ok());
    server_ = std::move(*s);
    server_->SetServing(true);
    address = "127.0.0.1:" + std::to_string(server_->port());
  }
  ~StuckDecode() override {
    Release();
    server_->Shutdown(absl::Seconds(1));
  }

  grpc::Status AllocateKv(grpc::ServerContext*, const v1::KvAllocateRequest*,
                          v1::KvAllocation*) override {
    {
      absl::MutexLock lock(&mu_);
      ++calls_;
    }
    released_.WaitForNotificationWithTimeout(absl::Seconds(30));
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "the decode instance went away");
  }

  // Waits until `n` AllocateKv calls arrived.
  bool AwaitCalls(int n) {
    absl::MutexLock lock(&mu_);
    auto arrived = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return calls_ >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&arrived), absl::Seconds(20));
  }
  void Release() {
    if (!released_.HasBeenNotified()) released_.Notify();
  }

  std::string address;

 private:
  absl::Mutex mu_;
  int calls_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Notification released_;
  std::unique_ptr<GrpcServer> server_;
};

// The stuck request's Prefill stream, drained on a thread of its own.
struct StuckStream {
  StuckStream(Instance& prefill, const StuckDecode& stuck, const std::string& id) {
    v1::PrefillRequest r = Request(id, "a hand-off that will not go through", Greedy(6));
    r.mutable_decode()->set_instance_id("stuck");
    r.mutable_decode()->set_address(stuck.address);
    reader = prefill.stub->Prefill(&ctx, r);
    drainer = std::thread([this] {
      Drain(reader, &out);
      ended = true;
    });
  }
  ~StuckStream() {
    if (drainer.joinable()) drainer.join();
  }
  Output Join() {
    drainer.join();
    return out;
  }

  grpc::ClientContext ctx;
  std::unique_ptr<grpc::ClientReader<v1::TokenBatch>> reader;
  Output out;
  std::atomic<bool> ended{false};
  std::thread drainer;
};

TEST_CASE("other requests prefill and hand off while a hand-off is stuck", "[roles][async]") {
  Instance both(LanguageRole::kBoth);
  Instance prefill(LanguageRole::kPrefill), decode(LanguageRole::kDecode);
  StuckDecode stuck;
  StuckStream first(prefill, stuck, "stuck-0");
  REQUIRE(stuck.AwaitCalls(1));  // its prompt is done; its hand-off waits
  for (int i = 0; i < 3; ++i) {
    const std::string id = "moving-" + std::to_string(i);
    const std::string text = "tell me about the number " + std::to_string(i);
    const Output want = RunBoth(both, Request(id, text, Greedy(8)));
    REQUIRE(want.status.ok());
    const Output got = RunSplitJoined(prefill, decode, Request(id, text, Greedy(8)));
    CHECK(got.tokens == want.tokens);
    CHECK(got.text == want.text);
  }
  // Every one of them went through while the first's hand-off still waited.
  CHECK_FALSE(first.ended);
  stuck.Release();
  const Output out = first.Join();
  CHECK(out.status.error_code() == grpc::StatusCode::UNAVAILABLE);
  CHECK(out.tokens.size() <= 1);
  CHECK_FALSE(out.handed_off);
  CHECK(prefill.Idle());
  CHECK(decode.Idle());
}

TEST_CASE("a request aborted mid-hand-off ends at once; its blocks go when the hand-off does",
          "[roles][async]") {
  Instance prefill(LanguageRole::kPrefill);
  StuckDecode stuck;
  StuckStream first(prefill, stuck, "aborted-0");
  REQUIRE(stuck.AwaitCalls(1));
  v1::AbortRequest abort;
  abort.set_request_id("aborted-0");
  abort.set_reason("the client left");
  v1::AbortResponse aborted;
  grpc::ClientContext actx;
  REQUIRE(prefill.stub->Abort(&actx, abort, &aborted).ok());
  const Output out = first.Join();  // while the hand-off still waits
  CHECK(out.status.error_code() == grpc::StatusCode::CANCELLED);
  const int64_t total = prefill.core->Capacity().kv_blocks_total();
  CHECK(prefill.core->Load().kv_blocks_free() < total);  // still read by the hand-off
  stuck.Release();
  CHECK(prefill.Idle());
}

}  // namespace
}  // namespace mmserve::language
