// Placement through the whole stack (docs/routing.md), counted by each
// language process's own mmserve_language_requests_total: a burst of 8
// streams on a P/D stack with two decode instances spreads over both, and
// the next turns of two chats about two pictures go back to the prefill
// instance that computed each chat's first turn (by load alone, with
// every instance idle, all would go to the first), and the router counts
// their pictures as placed on the instance holding their KV. A chat's later
// turns send their picture to no encoder (P/D and role both): the instance
// holding it finds its KV cached; after eviction the same turn falls back
// to an encoder with the same tokens and no error.
#include <algorithm>
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "common/grpc_server.h"
#include "deploy/launcher/child_process.h"
#include "tests/stack_harness.h"

namespace mmserve::testing {
namespace {

using mmserve::v1::GenerateRequest;

// Streams a process served to their end.
double Served(launcher::Service& s) {
  return std::max(0.0,
                  ScrapeMetric(s.metrics_port(), "mmserve_language_requests_total", "code=\"OK\""));
}

// A metric of a process, 0 when absent.
double Count(launcher::Service& s, const std::string& name, const std::string& labels = "") {
  return std::max(0.0, ScrapeMetric(s.metrics_port(), name, labels));
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
  // its message's KV; the first turns' not.
  const int router = (*stack)->router().metrics_port();
  CHECK(ScrapeMetric(router, "mmserve_router_media_placed_total", "kv=\"held\"") == 4);
  CHECK(ScrapeMetric(router, "mmserve_router_media_placed_total", "kv=\"not_held\"") == 2);
  // Those pictures went to no encoder: each holder found their KV.
  CHECK(ScrapeMetric(router, "mmserve_router_encoder_skipped_total") == 4);
  CHECK(ScrapeMetric(router, "mmserve_router_encoder_skip_fallbacks_total") == 0);
  CHECK(Count((*stack)->encoder(0), "mmserve_encoder_requests_total", "code=\"OK\"") == 2);
  // And each holder found the later turns' prompts in its prefix cache.
  for (launcher::Service* p : {&p0, &p1}) {
    CHECK(Count(*p, "mmserve_language_expected_cached_images_total", "found=\"yes\"") == 2);
    CHECK(ScrapeMetric(p->metrics_port(), "mmserve_language_prompt_tokens_total", "kv=\"cached\"") >
          0);
    CHECK(ScrapeMetric(p->metrics_port(), "mmserve_language_prompt_tokens_total",
                       "kv=\"computed\"") > 0);
  }
}

// The first turn of a chat about `item`'s picture, with a question long
// enough that the picture's KV lies in full blocks before the prompt's end.
GenerateRequest FirstTurn(const DemoSet& set, const DemoItem& item, const AskOptions& o) {
  GenerateRequest r = DemoRequest(set, item, o);
  auto* question = r.mutable_chat()->mutable_messages(0)->mutable_content(1);
  question->set_text(question->text() +
                     " Answer in one short sentence that names the shape and its colour.");
  return r;
}

// A second role-both instance (language-1) beside the stack's language-0,
// up once the router sees both.
absl::StatusOr<launcher::Service> StartSecondLanguage(launcher::LocalStack& stack,
                                                      const launcher::StackOptions& so) {
  std::vector<std::string> args = {"--model_dir=" + so.model_dir,
                                   "--host=" + so.host,
                                   "--port=0",
                                   "--metrics_port=0",
                                   "--instance_id=language-1",
                                   "--router=" + stack.registry_address(),
                                   "--profile=" + so.profile};
  args.insert(args.end(), so.language_args.begin(), so.language_args.end());
  auto p = launcher::ChildProcess::Start({"language-1", so.bin_dir + "/language_service/language",
                                          args, so.log_dir + "/language-1.log"});
  if (!p.ok()) return p.status();
  auto ready = (*p)->WaitReady(so.ready_timeout);
  if (!ready.ok()) return ready.status();
  launcher::Service second;
  second.id = ready->id;
  second.process = std::move(*p);
  second.ready = std::move(*ready);
  if (absl::Status s = stack.WaitHealthy(so.encoders, 2, absl::Seconds(120)); !s.ok()) return s;
  return second;
}

TEST_CASE("role both: a chat's later turns send their picture to no encoder") {
  launcher::StackOptions so = TestStackOptions(1, "shm");
  // A cached prompt outweighs any leftover load: each later turn goes back
  // to its holder without waiting for a load poll.
  so.router_args.push_back("--prefix_weight=100");
  auto stack = launcher::LocalStack::Start(so);
  INFO(stack.status());
  REQUIRE(stack.ok());
  absl::StatusOr<launcher::Service> second = StartSecondLanguage(**stack, so);
  INFO(second.status());
  REQUIRE(second.ok());
  const DemoSet& set = Demo();
  auto stub = mmserve::v1::Inference::NewStub(InternalChannel((*stack)->router_address()));
  AskOptions o;
  o.max_tokens = 12;
  size_t other = 1;
  while (other < set.items.size() && set.items[other].image_file == set.items[0].image_file) {
    ++other;
  }
  REQUIRE(other < set.items.size());
  // Two first turns about two pictures at once: one on each instance.
  std::vector<GenerateRequest> chats = {FirstTurn(set, set.items[0], o),
                                        FirstTurn(set, set.items[other], o)};
  std::vector<Answer> last(2);
  ParallelFor(2, 2, [&](int i) { last[i] = AskGrpc(*stub, chats[i], o); });
  for (const Answer& a : last) REQUIRE(a.status.ok());
  launcher::Service& l0 = (*stack)->language();
  launcher::Service& l1 = *second;
  REQUIRE(Served(l0) == 1);
  REQUIRE(Served(l1) == 1);
  for (const char* question : {"What else is there?", "And the colours?"}) {
    for (int i = 0; i < 2; ++i) {
      chats[i] = NextTurn(chats[i], last[i].text, question);
      last[i] = AskGrpc(*stub, chats[i], o);
      INFO(last[i].status);
      REQUIRE(last[i].status.ok());
    }
  }
  // Each chat stayed on the instance that holds it, and each picture went
  // to the encoder once, for its first turn.
  CHECK(Served(l0) == 3);
  CHECK(Served(l1) == 3);
  launcher::Service& encoder = (*stack)->encoder(0);
  CHECK(Count(encoder, "mmserve_encoder_requests_total", "code=\"OK\"") == 2);
  const launcher::Service& router = (*stack)->router();
  const int rp = router.metrics_port();
  CHECK(ScrapeMetric(rp, "mmserve_router_encoder_skipped_total") == 4);
  CHECK(ScrapeMetric(rp, "mmserve_router_encoder_skip_fallbacks_total") == 0);
  for (launcher::Service* l : {&l0, &l1}) {
    CHECK(Count(*l, "mmserve_language_expected_cached_images_total", "found=\"yes\"") == 2);
    CHECK(Count(*l, "mmserve_language_expected_cached_images_total", "found=\"no\"") == 0);
  }
}

TEST_CASE("role both: a later turn whose picture's KV was evicted falls back to the encoder") {
  launcher::StackOptions so = TestStackOptions(1, "shm");
  // A small KV pool that two long answers fill.
  so.language_args = {"--kv_cache_mb=1", "--threads=1"};
  auto stack = launcher::LocalStack::Start(so);
  INFO(stack.status());
  REQUIRE(stack.ok());
  const DemoSet& set = Demo();
  auto stub = mmserve::v1::Inference::NewStub(InternalChannel((*stack)->router_address()));
  AskOptions o;
  o.max_tokens = 12;
  GenerateRequest chat = FirstTurn(set, set.items[0], o);
  const Answer first = AskGrpc(*stub, chat, o);
  INFO(first.status);
  REQUIRE(first.status.ok());
  chat = NextTurn(chat, first.text, "What else is there?");
  // The second turn: its picture's KV is found.
  const Answer found = AskGrpc(*stub, chat, o);
  INFO(found.status);
  REQUIRE(found.status.ok());
  launcher::Service& l = (*stack)->language();
  const std::string cached = "mmserve_language_expected_cached_images_total";
  REQUIRE(Count(l, cached, "found=\"yes\"") == 1);
  // Two answers at once that need more than the pool take every block
  // (one is preempted and recomputed), evicting the cached ones; their
  // prompts are short, so the instance still lists the chat.
  const double free_blocks = ScrapeMetric(l.metrics_port(), "mmserve_language_kv_blocks_free");
  INFO("free KV blocks " << free_blocks);
  REQUIRE(free_blocks > 8);
  AskOptions filler;
  filler.max_tokens = static_cast<int>(free_blocks * 16 / 2) + 32;
  filler.ignore_eos = true;
  filler.deadline = absl::Seconds(300);
  std::vector<Answer> fillers(2);
  ParallelFor(2, 2, [&](int i) {
    fillers[i] = AskGrpc(*stub, DemoTextRequest(set.items[i + 1], filler), filler);
  });
  for (const Answer& a : fillers) {
    INFO(a.status);
    REQUIRE(a.status.ok());
  }
  // The same turn again: the router still expects the KV there; the
  // instance reports the picture lost, the router sends it to the encoder,
  // and the answer is the same, without an error.
  const Answer again = AskGrpc(*stub, chat, o);
  INFO(again.status);
  REQUIRE(again.status.ok());
  CHECK(again.token_ids == found.token_ids);
  CHECK(again.text == found.text);
  CHECK(Count(l, cached, "found=\"no\"") == 1);
  const int rp = (*stack)->router().metrics_port();
  CHECK(ScrapeMetric(rp, "mmserve_router_encoder_skipped_total") == 2);
  CHECK(ScrapeMetric(rp, "mmserve_router_encoder_skip_fallbacks_total") == 1);
  CHECK(Count((*stack)->encoder(0), "mmserve_encoder_requests_total", "code=\"OK\"") == 2);
}

}  // namespace
}  // namespace mmserve::testing
