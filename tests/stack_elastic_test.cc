// Role elastic through the whole stack (issue 26 step 1): router + encoder
// + one `--role=elastic` language process, which registers as
// INSTANCE_ROLE_ELASTIC and serves requests that come alone as role both:
// demo questions with their images give the in-process engine's token ids
// and text, and nothing leaks. (Group prefills are not served yet.)
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "common/grpc_server.h"
#include "tests/stack_harness.h"

namespace mmserve::testing {
namespace {

TEST_CASE("an elastic language instance answers demo questions as role both") {
  const DemoSet& set = Demo();
  const Reference& ref = InProcess(set);
  launcher::StackOptions o = TestStackOptions(1, "shm");
  o.language_args.push_back("--role=elastic");
  auto stack = launcher::LocalStack::Start(o);
  REQUIRE(stack.ok());
  constexpr int kQuestions = 100;
  auto stub = mmserve::v1::Inference::NewStub(InternalChannel((*stack)->router_address()));
  std::vector<Answer> answers(kQuestions);
  ParallelFor(kQuestions, 8,
              [&](int i) { answers[i] = AskGrpc(*stub, DemoRequest(set, set.items[i], {}), {}); });
  for (int i = 0; i < kQuestions; ++i) {
    INFO("question " << i << ": " << answers[i].status);
    REQUIRE(answers[i].status.ok());
    CHECK(answers[i].token_ids == ref.ids[i]);
    CHECK(answers[i].text == ref.text[i]);
  }
  const Leaks leaks = WaitForNoLeaks(**stack, absl::Seconds(5));
  INFO(leaks.ToString());
  CHECK(leaks.zero());
}

}  // namespace
}  // namespace mmserve::testing
