// Role elastic through the whole stack (issue 26): router + encoder +
// `--role=elastic` language processes. One instance under a router without
// --esp serves requests as role both; two under `router --esp` (the
// elastic manager) serve demo questions, each of which fits one instance,
// at degree 1. Both give the in-process engine's token ids and text, and
// nothing leaks.
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "common/grpc_server.h"
#include "tests/stack_harness.h"

namespace mmserve::testing {
namespace {

// Asks the first `n` demo questions, 8 at a time: each answer must be the
// in-process engine's (ids and text).
void AskDemoQuestions(launcher::LocalStack& stack, int n) {
  const DemoSet& set = Demo();
  const Reference& ref = InProcess(set);
  auto stub = mmserve::v1::Inference::NewStub(InternalChannel(stack.router_address()));
  std::vector<Answer> answers(n);
  ParallelFor(n, 8,
              [&](int i) { answers[i] = AskGrpc(*stub, DemoRequest(set, set.items[i], {}), {}); });
  for (int i = 0; i < n; ++i) {
    INFO("question " << i << ": " << answers[i].status);
    REQUIRE(answers[i].status.ok());
    CHECK(answers[i].token_ids == ref.ids[i]);
    CHECK(answers[i].text == ref.text[i]);
  }
}

TEST_CASE("an elastic language instance answers demo questions as role both") {
  launcher::StackOptions o = TestStackOptions(1, "shm");
  o.language_args.push_back("--role=elastic");
  auto stack = launcher::LocalStack::Start(o);
  REQUIRE(stack.ok());
  AskDemoQuestions(**stack, 100);
  const Leaks leaks = WaitForNoLeaks(**stack, absl::Seconds(5));
  INFO(leaks.ToString());
  CHECK(leaks.zero());
}

// The demo questions through the router's elastic manager: each fits one
// instance, so each runs at degree 1 on one of the two.
TEST_CASE("the elastic manager answers demo questions as role both, no leaks") {
  launcher::StackOptions o = TestStackOptions(1, "shm");
  o.elastic = 2;
  auto stack = launcher::LocalStack::Start(o);
  REQUIRE(stack.ok());
  constexpr int kQuestions = 60;
  AskDemoQuestions(**stack, kQuestions);
  const int router_metrics = (*stack)->router().metrics_port();
  CHECK(ScrapeMetric(router_metrics, "mmserve_router_esp_requests_total", "degree=\"1\"") ==
        kQuestions);
  const Leaks leaks = WaitForNoLeaks(**stack, absl::Seconds(5));
  INFO(leaks.ToString());
  CHECK(leaks.zero());
  CHECK(ScrapeMetric(router_metrics, "mmserve_router_esp_promised_slots") == 0);
}

}  // namespace
}  // namespace mmserve::testing
