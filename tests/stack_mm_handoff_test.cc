// Seed 000 through the stack, with real processes: a TP=2 language instance
// whose image embeddings arrive in a receive buffer every rank maps
// (--mm_handoff=async) or are copied into every step (blocking) gives the
// single-rank engine's token ids; an image whose embedding is late (a slow
// encoder) does not hold back text requests sent after it; cancelling it
// while its embedding is in flight frees everything; nothing is left in
// /dev/shm after a stop or a SIGKILL.
#include <signal.h>
#include <sys/wait.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <filesystem>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/grpc_server.h"
#include "tests/stack_harness.h"

namespace mmserve::testing {
namespace {

// /dev/shm entries of the language process `pid` (its tensor-parallel
// segments are named after "<id>-<pid>").
std::vector<std::string> ShmEntriesOf(const std::string& id, pid_t pid) {
  std::vector<std::string> found;
  const std::string tag = absl::StrCat(id, "-", pid);
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm")) {
    const std::string name = e.path().filename().string();
    if (name.find(tag) != std::string::npos) found.push_back(name);
  }
  return found;
}

launcher::StackOptions Tp2Options(const std::string& handoff, int publish_delay_ms) {
  launcher::StackOptions o = TestStackOptions(1, "shm");
  o.language_args.push_back("--tp=2");
  o.language_args.push_back(absl::StrCat("--mm_handoff=", handoff));
  if (publish_delay_ms > 0) {
    o.encoder_args.push_back(absl::StrCat("--test_only_publish_delay_ms=", publish_delay_ms));
  }
  return o;
}

mmserve::v1::GenerateRequest TextRequest(const std::string& text) {
  mmserve::v1::GenerateRequest req;
  auto* msg = req.mutable_chat()->add_messages();
  msg->set_role("user");
  msg->add_content()->set_text(text);
  req.mutable_sampling()->set_temperature(0);
  req.mutable_sampling()->set_max_tokens(8);
  req.mutable_stream()->set_include_token_ids(true);
  return req;
}

// Waits until the language instance holds `n` live requests.
bool WaitForLive(launcher::LocalStack& stack, double n, absl::Duration timeout) {
  const Deadline d = Deadline::After(timeout);
  while (!d.Expired()) {
    if (ScrapeMetric(stack.language().metrics_port(), "mmserve_language_requests_live") == n) {
      return true;
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  return false;
}

TEST_CASE("TP=2 image requests give the single-rank engine's token ids, async and blocking") {
  const DemoSet& set = Demo();
  const int n = 64;
  const Reference& ref = InProcess(set, n);
  for (const std::string handoff : {"async", "blocking"}) {
    INFO("--mm_handoff=" << handoff);
    auto stack = launcher::LocalStack::Start(Tp2Options(handoff, 0));
    REQUIRE(stack.ok());
    auto stub = mmserve::v1::Inference::NewStub(InternalChannel((*stack)->router_address()));
    std::vector<Answer> a(n);
    ParallelFor(n, 16,
                [&](int i) { a[i] = AskGrpc(*stub, DemoRequest(set, set.items[i], {}), {}); });
    for (int i = 0; i < n; ++i) {
      INFO("question " << i << ": " << a[i].status);
      REQUIRE(a[i].status.ok());
      CHECK(a[i].token_ids == ref.ids[i]);
      CHECK(a[i].text == ref.text[i]);
    }
    const int port = (*stack)->language().metrics_port();
    CHECK(ScrapeMetric(port, "mmserve_language_images_received_total") == n);
    // Async: every image row reached rank 1 as a descriptor into the
    // shared receive buffer; blocking: every one inline in its step.
    const double by_descriptor =
        ScrapeMetric(port, "mmserve_language_mm_rows_total", "placement=\"descriptor\"");
    const double in_line =
        ScrapeMetric(port, "mmserve_language_mm_rows_total", "placement=\"inline\"");
    CHECK(by_descriptor + in_line > 0);
    CHECK((handoff == "async" ? in_line : by_descriptor) == 0);
    CHECK(ScrapeMetric(port, "mmserve_language_mm_handoff_blocked_seconds_total") > 0);
    const Leaks leaks = WaitForNoLeaks(**stack, absl::Seconds(10));
    INFO(leaks.ToString());
    CHECK(leaks.zero());
    const pid_t pid = (*stack)->language().process->pid();
    const std::string id = (*stack)->language().id;
    (*stack)->Stop();
    CHECK(ShmEntriesOf(id, pid).empty());
  }
}

TEST_CASE("an image whose embedding is late does not hold back text requests sent after it") {
  const DemoSet& set = Demo();
  const Reference& ref = InProcess(set, 1);
  auto stack = launcher::LocalStack::Start(Tp2Options("async", 5000));
  REQUIRE(stack.ok());
  auto stub = mmserve::v1::Inference::NewStub(InternalChannel((*stack)->router_address()));
  std::atomic<bool> image_done{false};
  Answer image;
  std::thread t([&] {
    image = AskGrpc(*stub, DemoRequest(set, set.items[0], {}), {});
    image_done = true;
  });
  // The image request is in the language instance, waiting for its embedding.
  REQUIRE(WaitForLive(**stack, 1, absl::Seconds(30)));
  for (int i = 0; i < 3; ++i) {
    const Answer text = AskGrpc(*stub, TextRequest(absl::StrCat("Count to ", i + 3, ".")), {});
    REQUIRE(text.status.ok());
    CHECK(!text.token_ids.empty());
  }
  // All three text requests finished while the image request still waited.
  CHECK(!image_done.load());
  t.join();
  REQUIRE(image.status.ok());
  CHECK(image.token_ids == ref.ids[0]);
  const Leaks leaks = WaitForNoLeaks(**stack, absl::Seconds(10));
  INFO(leaks.ToString());
  CHECK(leaks.zero());
}

TEST_CASE(
    "cancelling an image request while its embedding is in flight frees everything; a SIGKILL "
    "leaves nothing in /dev/shm") {
  const DemoSet& set = Demo();
  const Reference& ref = InProcess(set, 3);
  // The encoder sleeps 2 s before it sends; the deadline ends the call in
  // that sleep, once the language instance holds the request (longer for
  // sanitizer builds, where reaching the instance took over 1.2 s once).
  auto stack = launcher::LocalStack::Start(Tp2Options("async", 2000 * kSanitizerSlowdown));
  REQUIRE(stack.ok());
  auto stub = mmserve::v1::Inference::NewStub(InternalChannel((*stack)->router_address()));
  std::atomic<bool> live_seen{false};
  std::thread watcher(
      [&] { live_seen = WaitForLive(**stack, 1, absl::Seconds(5) * kSanitizerSlowdown); });
  AskOptions o;
  o.deadline = absl::Milliseconds(1200) * kSanitizerSlowdown;
  const Answer cancelled = AskGrpc(*stub, DemoRequest(set, set.items[1], {}), o);
  watcher.join();
  CHECK(live_seen.load());  // it was held by the language instance when it ended
  CHECK(absl::IsDeadlineExceeded(cancelled.status));
  const Leaks leaks = WaitForNoLeaks(**stack, absl::Seconds(10));
  INFO(leaks.ToString());
  CHECK(leaks.zero());
  // Both ranks still serve: an image request after the cancel is right.
  const Answer next = AskGrpc(*stub, DemoRequest(set, set.items[2], {}), {});
  REQUIRE(next.status.ok());
  CHECK(next.token_ids == ref.ids[2]);
  CHECK(WaitForNoLeaks(**stack, absl::Seconds(10)).zero());

  const pid_t pid = (*stack)->language().process->pid();
  const std::string id = (*stack)->language().id;
  REQUIRE(kill(pid, SIGKILL) == 0);
  const Deadline d = Deadline::After(absl::Seconds(10));
  while (!d.Expired() && kill(pid, 0) == 0) absl::SleepFor(absl::Milliseconds(20));
  CHECK(ShmEntriesOf(id, pid).empty());
}

}  // namespace
}  // namespace mmserve::testing
