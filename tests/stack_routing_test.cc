// Placement through the whole stack (docs/routing.md), counted by each
// language process's own mmserve_language_requests_total: a burst of 8
// streams on a P/D stack with two decode instances spreads over both, and
// the next turns of two chats about two pictures go back to the prefill
// instance that computed each chat's first turn (by load alone, with
// every instance idle, all would go to the first), and the router counts
// their pictures as placed on the instance holding their KV.
#include <algorithm>
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "common/grpc_server.h"
#include "tests/stack_harness.h"

namespace mmserve::testing {
namespace {

using mmserve::v1::GenerateRequest;

// Streams a process served to their end.
double Served(launcher::Service& s) {
  return std::max(0.0,
                  ScrapeMetric(s.metrics_port(), "mmserve_language_requests_total", "code=\"OK\""));
}

TEST_CASE("a burst of 8 streams on P/D spreads over the two decode instances") {
  launcher::StackOptions so = TestStackOptions(1, "shm");
  so.prefill = 1;
  so.decode = 2;
  auto stack = launcher::LocalStack::Start(so);
  INFO(stack.status());
  REQUIRE(stack.ok());
  const DemoSet& set = Demo();
  auto stub = mmserve::v1::Inference::NewStub(InternalChannel((*stack)->router_address()));
  AskOptions o;
  o.max_tokens = 400;  // long enough that the 8 overlap
  o.ignore_eos = true;
  std::vector<Answer> answers(8);
  ParallelFor(8, 8,
              [&](int i) { answers[i] = AskGrpc(*stub, DemoTextRequest(set.items[i], o), o); });
  for (const Answer& a : answers) {
    INFO(a.status);
    CHECK(a.status.ok());
  }
  const double d0 = Served((*stack)->decode(0));
  const double d1 = Served((*stack)->decode(1));
  INFO("decode-0 " << d0 << ", decode-1 " << d1);
  CHECK(d0 + d1 == 8);
  CHECK(d0 >= 3);
  CHECK(d1 >= 3);
}

// The chat of `first` with the answer and one more question.
GenerateRequest NextTurn(GenerateRequest first, const std::string& answer,
                         const std::string& question) {
  auto* reply = first.mutable_chat()->add_messages();
  reply->set_role("assistant");
  reply->add_content()->set_text(answer);
  auto* next = first.mutable_chat()->add_messages();
  next->set_role("user");
  next->add_content()->set_text(question);
  return first;
}

TEST_CASE("a chat's next turns go to the prefill instance that computed its first") {
  launcher::StackOptions so = TestStackOptions(1, "shm");
  so.prefill = 2;
  so.decode = 1;
  auto stack = launcher::LocalStack::Start(so);
  INFO(stack.status());
  REQUIRE(stack.ok());
  const DemoSet& set = Demo();
  auto stub = mmserve::v1::Inference::NewStub(InternalChannel((*stack)->router_address()));
  const AskOptions o;
  // Two first turns about two pictures at once: one on each prefill
  // instance (a burst spreads).
  size_t other = 1;
  while (other < set.items.size() && set.items[other].image_file == set.items[0].image_file) {
    ++other;
  }
  REQUIRE(other < set.items.size());
  std::vector<GenerateRequest> chats = {DemoRequest(set, set.items[0], o),
                                        DemoRequest(set, set.items[other], o)};
  std::vector<Answer> first(2);
  ParallelFor(2, 2, [&](int i) { first[i] = AskGrpc(*stub, chats[i], o); });
  for (const Answer& a : first) REQUIRE(a.status.ok());
  launcher::Service& p0 = (*stack)->prefill(0);
  launcher::Service& p1 = (*stack)->prefill(1);
  REQUIRE(Served(p0) == 1);
  REQUIRE(Served(p1) == 1);
  // Then each chat's next two turns, one at a time, every instance idle
  // in the router's view: a few load polls (250 ms) after the last turn
  // ended, so that no report still counts it (docs/routing.md).
  for (const char* question : {"What else is there?", "And the colours?"}) {
    for (int i = 0; i < 2; ++i) {
      absl::SleepFor(absl::Seconds(1));
      chats[i] = NextTurn(chats[i], first[i].text, question);
      const Answer a = AskGrpc(*stub, chats[i], o);
      INFO(a.status);
      REQUIRE(a.status.ok());
      first[i].text = a.text;
    }
  }
  CHECK(Served(p0) == 3);
  CHECK(Served(p1) == 3);
  // The router knew: each later turn's picture went to the instance holding
  // its message's KV (and to an encoder all the same); the first turns' not.
  const int router = (*stack)->router().metrics_port();
  CHECK(ScrapeMetric(router, "mmserve_router_media_placed_total", "kv=\"held\"") == 4);
  CHECK(ScrapeMetric(router, "mmserve_router_media_placed_total", "kv=\"not_held\"") == 2);
  // And each holder found the later turns' prompts in its prefix cache.
  for (launcher::Service* p : {&p0, &p1}) {
    CHECK(ScrapeMetric(p->metrics_port(), "mmserve_language_prompt_tokens_total", "kv=\"cached\"") >
          0);
    CHECK(ScrapeMetric(p->metrics_port(), "mmserve_language_prompt_tokens_total",
                       "kv=\"computed\"") > 0);
  }
}

}  // namespace
}  // namespace mmserve::testing
