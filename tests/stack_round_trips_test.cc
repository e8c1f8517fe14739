// The round trips a first token waits for, counted by the services' own
// metrics (mmserve_router_critical_round_trips,
// mmserve_language_embedding_round_trips,
// mmserve_language_kv_handoff_round_trips), are the protocol's: text and
// image prompts, role both and P/D, one chunk and default-then-resume, one
// request at a time and four at once.
#include <algorithm>
#include <catch2/catch.hpp>
#include <vector>

#include "common/grpc_server.h"
#include "tests/stack_harness.h"

namespace mmserve::testing {
namespace {

using mmserve::v1::GenerateRequest;

// The round-trip metrics of one stack, summed over its language processes.
struct Trips {
  double router = 0, embedding = 0, kv_handoff = 0, first_tokens = 0;
  Trips operator-(const Trips& o) const {
    return {router - o.router, embedding - o.embedding, kv_handoff - o.kv_handoff,
            first_tokens - o.first_tokens};
  }
};

Trips ScrapeTrips(launcher::LocalStack& stack, bool pd) {
  auto value = [](int port, const char* name) { return std::max(0.0, ScrapeMetric(port, name)); };
  const int rp = stack.router().metrics_port();
  const int lp = pd ? stack.prefill(0).metrics_port() : stack.language().metrics_port();
  return {value(rp, "mmserve_router_critical_round_trips_sum"),
          value(lp, "mmserve_language_embedding_round_trips_sum"),
          value(lp, "mmserve_language_kv_handoff_round_trips_sum"),
          value(rp, "mmserve_router_critical_round_trips_count")};
}

// Asks `request` alone and returns what the metrics counted for it.
Trips AskCounting(launcher::LocalStack& stack, bool pd, const GenerateRequest& request) {
  AskOptions o;
  auto stub = mmserve::v1::Inference::NewStub(InternalChannel(stack.router_address()));
  const Trips before = ScrapeTrips(stack, pd);
  const Answer a = AskGrpc(*stub, request, o);
  INFO(a.status);
  CHECK(a.status.ok());
  return ScrapeTrips(stack, pd) - before;
}

// What the protocol needs, one leg after another, before the first token
// (tcp profile; the client's own Generate call is not counted):
//   router: role both 1 (Prefill, whose stream carries the first token);
//     P/D 2 (Decode, answered by the decode instance's empty first batch,
//     then Prefill).
//   embedding (Prefill reaches the language side, which asks the encoder):
//     Connect on the first image from an encoder, then init answered by the
//     chunk (the router pre-sizes the demo images: one chunk), and one
//     resume per further chunk (ResumeStackOptions: two chunks).
//   KV hand-off (P/D, TP 1; the first token goes out after it): AllocateKv,
//     the landed reply to the KV messages (tcp: rendezvous), CommitKv = 3.
//     (On shm the prefill side copies into the decode cache it maps and
//     waits for no reply: 2, see CheckMappedHandOffs.)
TEST_CASE(
    "the services' metrics count the round trips a first token waits for: text and image, "
    "role both and P/D") {
  const DemoSet& set = Demo();
  const GenerateRequest text = DemoTextRequest(set.items[0], AskOptions());
  const GenerateRequest image = DemoRequest(set, set.items[1], AskOptions());
  size_t k = 2;
  while (set.items[k].image_file == set.items[1].image_file) ++k;
  const GenerateRequest other = DemoRequest(set, set.items[k], AskOptions());
  auto check = [](const Trips& t, double router, double embedding, double kv) {
    CHECK(t.first_tokens == 1);
    CHECK(t.router == router);
    CHECK(t.embedding == embedding);
    CHECK(t.kv_handoff == kv);
  };
  for (const bool pd : {false, true}) {
    INFO((pd ? "P/D" : "role both"));
    launcher::StackOptions so = TestStackOptions(1, "tcp");
    if (pd) so.prefill = so.decode = 1;
    auto stack = launcher::LocalStack::Start(so);
    INFO(stack.status());
    REQUIRE(stack.ok());
    const double router = pd ? 2 : 1, kv = pd ? 3 : 0;
    check(AskCounting(**stack, pd, text), router, 0, kv);
    check(AskCounting(**stack, pd, image), router, 2, kv);  // + Connect
    check(AskCounting(**stack, pd, other), router, 1, kv);
    // The same question again: the instance holds the image's KV, the
    // router sends it to no encoder.
    check(AskCounting(**stack, pd, image), router, 0, kv);
    if (pd) {
      const int pp = (*stack)->prefill(0).metrics_port();
      const char* total = "mmserve_language_kv_handoff_total";
      CHECK(ScrapeMetric(pp, total, "path=\"rendezvous\"") == 4);
      CHECK(ScrapeMetric(pp, total, "path=\"mapped\"") == 0);
    }
  }
  auto resume = launcher::LocalStack::Start(ResumeStackOptions());
  REQUIRE(resume.ok());
  check(AskCounting(**resume, false, image), 1, 3, 0);  // Connect, init, resume
  check(AskCounting(**resume, false, other), 1, 2, 0);
}

// The same counts when requests overlap: 12 P/D text requests, 4 at a
// time, over tcp. Each first token waited for 5 round trips (router 2:
// Decode hold then Prefill; KV hand-off 3: AllocateKv, the landed reply,
// CommitKv), none for embeddings; the client's own call makes 6. (An image
// request adds the encoder's init: 7 with the client's call.) Requests
// queued behind others wait longer, but for no extra round trip of their
// own.
TEST_CASE("at concurrency 4, a P/D text request's first token waits for five round trips") {
  launcher::StackOptions so = TestStackOptions(1, "tcp");
  so.prefill = so.decode = 1;
  auto stack = launcher::LocalStack::Start(so);
  INFO(stack.status());
  REQUIRE(stack.ok());
  const DemoSet& set = Demo();
  auto stub = mmserve::v1::Inference::NewStub(InternalChannel((*stack)->router_address()));
  constexpr int kRequests = 12;
  const Trips before = ScrapeTrips(**stack, true);
  std::vector<Answer> answers(kRequests);
  ParallelFor(kRequests, 4, [&](int i) {
    AskOptions o;
    answers[i] = AskGrpc(*stub, DemoTextRequest(set.items[i], o), o);
  });
  for (int i = 0; i < kRequests; ++i) {
    INFO(i << ": " << answers[i].status);
    CHECK(answers[i].status.ok());
  }
  const Trips t = ScrapeTrips(**stack, true) - before;
  CHECK(t.first_tokens == kRequests);
  CHECK(t.router == 2 * kRequests);
  CHECK(t.embedding == 0);
  CHECK(t.kv_handoff == 3 * kRequests);
  CHECK((t.router + t.kv_handoff) / t.first_tokens == 5);
}

}  // namespace
}  // namespace mmserve::testing
