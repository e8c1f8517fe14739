// Prefill/decode disaggregation through the whole stack:
// router + encoder + a `--role=prefill` and a `--role=decode` language
// process, the KV handed over UCX. The demo evaluation with its images, and
// its questions as text prompts, give the same token ids as a role-both
// stack; nothing leaks on any process; a decode process SIGKILLed
// mid-stream ends its streams with UNAVAILABLE and leaves the prefill side
// clean; a prefill or decode process SIGKILLed mid-hand-off gives a bounded
// UNAVAILABLE and leaves the survivors clean. With a TP=2 decode instance
// (each rank receives its own KV heads) the token ids are the same too, and
// SIGKILL of its rank 1 mid-decode or mid-hand-off gives bounded errors,
// leaves no block or request on the survivors and no /dev/shm entry. On
// shm every hand-off copies into the decode caches, which the prefill
// process maps (mmserve_language_kv_handoff_total{path="mapped"}).
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/grpc_server.h"
#include "common/grpc_status.h"
#include "tests/public_errors.h"
#include "tests/stack_harness.h"

namespace mmserve::testing {
namespace {

using mmserve::v1::GenerateRequest;

// `n` demo questions as text, each to run for 3000 tokens.
std::vector<GenerateRequest> LongTextRequests(const DemoSet& set, int n) {
  AskOptions o;
  o.max_tokens = 3000;
  o.ignore_eos = true;
  std::vector<GenerateRequest> out;
  for (int i = 0; i < n; ++i) out.push_back(DemoTextRequest(set.items[i], o));
  return out;
}

std::vector<Answer> AskAll(launcher::LocalStack& stack, int n, const AskOptions& o) {
  const DemoSet& set = Demo();
  auto stub = mmserve::v1::Inference::NewStub(InternalChannel(stack.router_address()));
  std::vector<Answer> out(n);
  ParallelFor(n, 8, [&](int i) { out[i] = AskGrpc(*stub, DemoTextRequest(set.items[i], o), o); });
  return out;
}

// The demo questions with their images (the demo evaluation).
std::vector<Answer> AskAllImages(launcher::LocalStack& stack, int n, const AskOptions& o) {
  const DemoSet& set = Demo();
  auto stub = mmserve::v1::Inference::NewStub(InternalChannel(stack.router_address()));
  std::vector<Answer> out(n);
  ParallelFor(n, 8, [&](int i) { out[i] = AskGrpc(*stub, DemoRequest(set, set.items[i], o), o); });
  return out;
}

launcher::StackOptions PdOptions(int decode_tp = 1) {
  launcher::StackOptions o = TestStackOptions(1, "shm");
  o.prefill = 1;
  o.decode = 1;
  if (decode_tp > 1) o.decode_args.push_back(absl::StrCat("--tp=", decode_tp));
  return o;
}

std::set<std::string> ShmEntries() {
  std::set<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm")) {
    out.insert(e.path().filename().string());
  }
  return out;
}

// The prefill process holds no KV blocks, embedding blocks or requests.
void CheckPrefillClean(launcher::LocalStack& stack) {
  const int pp = stack.prefill(0).metrics_port();
  const Deadline d = Deadline::After(absl::Seconds(10));
  double kv = -1, live = -1, emb = -1;
  while (!d.Expired()) {
    kv = ScrapeMetric(pp, "mmserve_language_kv_blocks_used");
    live = ScrapeMetric(pp, "mmserve_language_requests_live");
    emb = ScrapeMetric(pp, "mmserve_language_embedding_blocks_used");
    if (kv == 0 && live == 0 && emb == 0) break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  CHECK(kv == 0);
  CHECK(live == 0);
  CHECK(emb == 0);
}

// Every hand-off of the prefill instance copied into each decode rank's
// cache where the prefill process maps it (shm: the caches live in UCX
// shared segments), so none waited for a flush: AllocateKv and CommitKv only.
void CheckMappedHandOffs(launcher::LocalStack& stack, int decode_ranks) {
  const int pp = stack.prefill(0).metrics_port();
  const double handoffs = ScrapeMetric(pp, "mmserve_language_kv_handoff_round_trips_count");
  CHECK(handoffs > 0);
  const char* total = "mmserve_language_kv_handoff_total";
  CHECK(ScrapeMetric(pp, total, "path=\"mapped\"") == handoffs * decode_ranks);
  CHECK(ScrapeMetric(pp, total, "path=\"rendezvous\"") == 0);
  CHECK(ScrapeMetric(pp, total, "path=\"put\"") == 0);
  CHECK(ScrapeMetric(pp, "mmserve_language_kv_handoff_round_trips_sum") == 2 * handoffs);
}

TEST_CASE(
    "E + P + D gives role both's token ids on 240 demo questions with images (8 tokens, EOS; "
    "16 tokens) and 168 as text (12 tokens, EOS, one token), every hand-off into the decode "
    "cache the prefill process maps; nothing leaks") {
  constexpr int kN = 120;
  AskOptions o;
  o.max_tokens = 12;
  o.ignore_eos = true;
  // Also: answers that end on EOS after the hand-off, and ones whose first
  // token ends them on the prefill side (no hand-off; the router cancels the
  // decode instance's registration).
  AskOptions eos;
  eos.max_tokens = 8;
  AskOptions one;
  one.max_tokens = 1;
  // The demo evaluation with images (8 tokens, EOS), and image questions
  // held to 16 tokens, so decode runs well past the images (its positions
  // follow the M-RoPE delta the prefill side handed over).
  constexpr int kImages = 200;
  AskOptions eval;
  AskOptions long_image;
  long_image.max_tokens = 16;
  long_image.ignore_eos = true;
  std::vector<Answer> want, want_eos, want_one, want_eval, want_long;
  {
    auto both = launcher::LocalStack::Start(TestStackOptions(1, "shm"));
    REQUIRE(both.ok());
    want = AskAll(**both, kN, o);
    want_eos = AskAll(**both, 40, eos);
    want_one = AskAll(**both, 8, one);
    want_eval = AskAllImages(**both, kImages, eval);
    want_long = AskAllImages(**both, 40, long_image);
  }
  auto stack = launcher::LocalStack::Start(PdOptions());
  INFO(stack.status());
  REQUIRE(stack.ok());
  const std::vector<Answer> got = AskAll(**stack, kN, o);
  const std::vector<Answer> got_eos = AskAll(**stack, 40, eos);
  const std::vector<Answer> got_one = AskAll(**stack, 8, one);
  const std::vector<Answer> got_eval = AskAllImages(**stack, kImages, eval);
  const std::vector<Answer> got_long = AskAllImages(**stack, 40, long_image);
  int same_text = 0;
  for (int i = 0; i < kImages; ++i) {
    INFO("image question " << i << ": " << want_eval[i].status << " / " << got_eval[i].status);
    REQUIRE(want_eval[i].status.ok());
    REQUIRE(got_eval[i].status.ok());
    CHECK(got_eval[i].token_ids == want_eval[i].token_ids);
    same_text += got_eval[i].text == want_eval[i].text;
  }
  CHECK(same_text == kImages);
  for (size_t i = 0; i < want_long.size(); ++i) {
    INFO("16-token image question " << i << ": " << want_long[i].status << " / "
                                    << got_long[i].status);
    REQUIRE(want_long[i].status.ok());
    REQUIRE(got_long[i].status.ok());
    CHECK(want_long[i].token_ids.size() == 16);
    CHECK(got_long[i].token_ids == want_long[i].token_ids);
    CHECK(got_long[i].text == want_long[i].text);
  }
  // Every image reached the prefill instance, unless it held the image's KV
  // already (a question repeated about the same picture): then the router
  // sent it to no encoder.
  CHECK(
      ScrapeMetric((*stack)->prefill(0).metrics_port(), "mmserve_language_images_received_total") +
          ScrapeMetric((*stack)->router().metrics_port(), "mmserve_router_encoder_skipped_total") ==
      kImages + 40);
  for (size_t i = 0; i < want_eos.size(); ++i) {
    INFO("eos question " << i << ": " << want_eos[i].status << " / " << got_eos[i].status);
    REQUIRE(got_eos[i].status.ok());
    CHECK(got_eos[i].token_ids == want_eos[i].token_ids);
  }
  for (size_t i = 0; i < want_one.size(); ++i) {
    INFO("one-token question " << i << ": " << want_one[i].status << " / " << got_one[i].status);
    REQUIRE(got_one[i].status.ok());
    CHECK(got_one[i].token_ids.size() == 1);
    CHECK(got_one[i].token_ids == want_one[i].token_ids);
  }
  for (int i = 0; i < kN; ++i) {
    INFO("question " << i << ": " << want[i].status << " / " << got[i].status);
    REQUIRE(want[i].status.ok());
    REQUIRE(got[i].status.ok());
    CHECK(want[i].token_ids.size() == 12);
    CHECK(got[i].token_ids == want[i].token_ids);
    CHECK(got[i].text == want[i].text);
  }
  CheckMappedHandOffs(**stack, 1);
  const Leaks l = WaitForNoLeaks(**stack, absl::Seconds(10));
  INFO(l.ToString());
  CHECK(l.zero());
}

TEST_CASE("SIGKILL of the decode process mid-stream: UNAVAILABLE, the prefill side leaks nothing") {
  auto stack = launcher::LocalStack::Start(PdOptions());
  REQUIRE(stack.ok());
  const DemoSet& set = Demo();
  auto stub = mmserve::v1::Inference::NewStub(InternalChannel((*stack)->router_address()));
  // Past the first token (2 tokens): the decode instance is streaming.
  const std::vector<std::string> internals = StackInternals(**stack);
  const KilledStreams run = StreamAndKill(
      *stub, LongTextRequests(set, 4), [&] { (*stack)->decode(0).process->Signal(SIGKILL); },
      {.streaming_tokens = 2, .http_port = (*stack)->http_port(), .http_streams = 2});
  const absl::Status unavailable = run.AllUnavailable();
  INFO(unavailable);
  CHECK(unavailable.ok());
  const absl::Status shown = run.AllPublic(internals);
  INFO(shown);
  CHECK(shown.ok());
  // The prefill process is clean: no KV blocks, embedding blocks or requests.
  const int pp = (*stack)->prefill(0).metrics_port();
  const Deadline d = Deadline::After(absl::Seconds(10));
  double kv = -1, live = -1, emb = -1;
  while (!d.Expired()) {
    kv = ScrapeMetric(pp, "mmserve_language_kv_blocks_used");
    live = ScrapeMetric(pp, "mmserve_language_requests_live");
    emb = ScrapeMetric(pp, "mmserve_language_embedding_blocks_used");
    if (kv == 0 && live == 0 && emb == 0) break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  CHECK(kv == 0);
  CHECK(live == 0);
  CHECK(emb == 0);
  CHECK(ScrapeMetric((*stack)->router().metrics_port(), "mmserve_router_calls_live") == 0);
}

// Fault tests of the hand-off itself. `--test_kv_handoff_delay_ms` (a
// test-only flag) makes the prefill instance wait after AllocateKv, before
// the puts and CommitKv, so that a kill lands mid-hand-off every time: the
// decode instance holds the reservation, the KV is not committed. The
// kill comes once the decode instance's metrics show the reservation, well
// inside the 3 s delay.
launcher::StackOptions SlowHandoffOptions() {
  launcher::StackOptions o = PdOptions();
  // The decode side's commit deadline (2 s) ends inside the delay (3 s).
  o.language_args = {"--test_kv_handoff_delay_ms=3000", "--kv_commit_timeout_ms=2000"};
  return o;
}

// Starts `n` image questions (ignore EOS, 16 tokens) on their own threads:
// the even ones over gRPC, the odd ones over HTTP (streamed).
struct Calls {
  Calls(launcher::LocalStack& stack, int n)
      : status(n), tokens(n), seconds(n), request_id(n), retry_after(n) {
    stub = mmserve::v1::Inference::NewStub(InternalChannel(stack.router_address()));
    internals = StackInternals(stack);
    for (int i = 0; i < n; ++i) {
      threads.emplace_back([this, i, http_port = stack.http_port()] {
        AskOptions o;
        o.max_tokens = 16;
        o.ignore_eos = true;
        o.deadline = absl::Seconds(60);
        Stopwatch clock;
        const GenerateRequest r = DemoRequest(Demo(), Demo().items[i], o);
        if (i % 2 == 1) {
          const StreamEnd e = AskHttpStream(http_port, r, o.deadline);
          status[i] = e.status;
          tokens[i] = e.tokens;
          request_id[i] = e.request_id;
          retry_after[i] = e.retry_after;
        } else {
          const Answer a = AskGrpc(*stub, r, o);
          status[i] = a.status;
          tokens[i] = static_cast<int>(a.token_ids.size());
          request_id[i] = a.request_id;
          retry_after[i] = a.retry_after;
        }
        seconds[i] = clock.ElapsedSeconds();
      });
    }
  }
  void Join() {
    for (std::thread& t : threads) t.join();
  }
  // What call `i`'s client saw: a public error (tests/public_errors.h), and
  // a retry-after on UNAVAILABLE.
  absl::Status Public(int i) const {
    const absl::Status shown = CheckPublicError(status[i], request_id[i], internals);
    if (!shown.ok()) return shown;
    if (absl::IsUnavailable(status[i]) && retry_after[i].empty()) {
      return absl::FailedPreconditionError("no retry-after");
    }
    return absl::OkStatus();
  }
  std::unique_ptr<mmserve::v1::Inference::Stub> stub;
  std::vector<std::string> internals;  // taken before any kill
  std::vector<std::thread> threads;
  std::vector<absl::Status> status;
  std::vector<int> tokens;
  std::vector<double> seconds;
  std::vector<std::string> request_id;
  std::vector<std::string> retry_after;
};

// Waits until the decode instance holds KV for a reservation (the prefill
// instance is now inside its delayed hand-off).
bool DecodeHoldsReservation(launcher::LocalStack& stack) {
  const int port = stack.decode(0).metrics_port();
  const Deadline d = Deadline::After(absl::Seconds(60));
  while (!d.Expired()) {
    if (ScrapeMetric(port, "mmserve_language_kv_blocks_used") > 0) return true;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return false;
}

// A process's KV blocks, embedding blocks and live requests, once they are
// zero (or the last reading after 15 s).
std::string Settled(int port, bool* zero) {
  const Deadline d = Deadline::After(absl::Seconds(15));
  double kv = -1, live = -1, emb = -1;
  while (!d.Expired()) {
    kv = ScrapeMetric(port, "mmserve_language_kv_blocks_used");
    live = ScrapeMetric(port, "mmserve_language_requests_live");
    emb = ScrapeMetric(port, "mmserve_language_embedding_blocks_used");
    if (kv == 0 && live == 0 && emb == 0) break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  *zero = kv == 0 && live == 0 && emb == 0;
  return absl::StrCat("kv blocks ", kv, ", requests ", live, ", embedding blocks ", emb);
}

TEST_CASE(
    "SIGKILL of the prefill process mid-hand-off: a bounded UNAVAILABLE, the decode "
    "reservation is freed, nothing leaks on the survivors") {
  auto stack = launcher::LocalStack::Start(SlowHandoffOptions());
  INFO(stack.status());
  REQUIRE(stack.ok());
  Calls calls(**stack, 2);
  REQUIRE(DecodeHoldsReservation(**stack));
  (*stack)->prefill(0).process->Signal(SIGKILL);
  calls.Join();
  for (int i = 0; i < 2; ++i) {
    INFO(i << ": " << calls.status[i] << " after " << calls.tokens[i] << " tokens, "
           << calls.seconds[i] << " s");
    CHECK(calls.status[i].code() == absl::StatusCode::kUnavailable);
    CHECK(calls.tokens[i] == 0);  // the first token travels with the hand-off
    CHECK(calls.seconds[i] < 30);
    INFO(calls.Public(i));
    CHECK(calls.Public(i).ok());
  }
  bool zero = false;
  const std::string decode = Settled((*stack)->decode(0).metrics_port(), &zero);
  INFO("decode: " << decode);
  CHECK(zero);
  CHECK(ScrapeMetric((*stack)->router().metrics_port(), "mmserve_router_calls_live") == 0);
  // An image still on its way to the killed prefill process holds its send
  // block until the transfer fails.
  const Deadline settled = Deadline::After(absl::Seconds(15));
  double encoder_blocks = -1;
  do {
    encoder_blocks =
        ScrapeMetric((*stack)->encoder(0).metrics_port(), "mmserve_encoder_embedding_blocks_used");
    if (encoder_blocks == 0) break;
    absl::SleepFor(absl::Milliseconds(50));
  } while (!settled.Expired());
  CHECK(encoder_blocks == 0);
}

TEST_CASE(
    "SIGKILL of the decode process mid-hand-off: a bounded error, the prefill side frees its "
    "blocks once and leaks nothing") {
  auto stack = launcher::LocalStack::Start(SlowHandoffOptions());
  INFO(stack.status());
  REQUIRE(stack.ok());
  Calls calls(**stack, 2);
  REQUIRE(DecodeHoldsReservation(**stack));
  (*stack)->decode(0).process->Signal(SIGKILL);
  calls.Join();
  for (int i = 0; i < 2; ++i) {
    INFO(i << ": " << calls.status[i] << " after " << calls.tokens[i] << " tokens, "
           << calls.seconds[i] << " s");
    CHECK(calls.status[i].code() == absl::StatusCode::kUnavailable);
    CHECK(calls.tokens[i] == 0);
    CHECK(calls.seconds[i] < 30);
    INFO(calls.Public(i));
    CHECK(calls.Public(i).ok());
  }
  bool zero = false;
  const std::string prefill = Settled((*stack)->prefill(0).metrics_port(), &zero);
  INFO("prefill: " << prefill);
  CHECK(zero);
  // The prefill process is alive (only the decode one exited) and its free
  // list is whole: a double free would show as more free blocks than the
  // pool (negative blocks used) or a crash.
  for (const std::string& gone : (*stack)->Exited()) CHECK(gone.rfind("decode", 0) == 0);
  CHECK(ScrapeMetric((*stack)->router().metrics_port(), "mmserve_router_calls_live") == 0);
}

TEST_CASE(
    "E + P + D with a TP=2 decode instance gives role both's token ids on 200 demo questions "
    "with images and 160 as text (12 tokens, EOS), every rank's heads copied into its cache "
    "where the prefill process maps it; nothing leaks") {
  constexpr int kN = 120;
  AskOptions o;
  o.max_tokens = 12;
  o.ignore_eos = true;
  AskOptions eos;
  eos.max_tokens = 8;
  constexpr int kImages = 200;
  AskOptions eval;
  std::vector<Answer> want, want_eos, want_eval;
  {
    auto both = launcher::LocalStack::Start(TestStackOptions(1, "shm"));
    REQUIRE(both.ok());
    want = AskAll(**both, kN, o);
    want_eos = AskAll(**both, 40, eos);
    want_eval = AskAllImages(**both, kImages, eval);
  }
  auto stack = launcher::LocalStack::Start(PdOptions(2));
  INFO(stack.status());
  REQUIRE(stack.ok());
  REQUIRE(ChildrenOf((*stack)->decode(0).process->pid()).size() == 1);  // rank 1
  const std::vector<Answer> got = AskAll(**stack, kN, o);
  const std::vector<Answer> got_eos = AskAll(**stack, 40, eos);
  const std::vector<Answer> got_eval = AskAllImages(**stack, kImages, eval);
  for (int i = 0; i < kImages; ++i) {
    INFO("image question " << i << ": " << want_eval[i].status << " / " << got_eval[i].status);
    REQUIRE(want_eval[i].status.ok());
    REQUIRE(got_eval[i].status.ok());
    CHECK(got_eval[i].token_ids == want_eval[i].token_ids);
    CHECK(got_eval[i].text == want_eval[i].text);
  }
  for (int i = 0; i < kN; ++i) {
    INFO("question " << i << ": " << want[i].status << " / " << got[i].status);
    REQUIRE(want[i].status.ok());
    REQUIRE(got[i].status.ok());
    CHECK(want[i].token_ids.size() == 12);
    CHECK(got[i].token_ids == want[i].token_ids);
    CHECK(got[i].text == want[i].text);
  }
  for (size_t i = 0; i < want_eos.size(); ++i) {
    INFO("eos question " << i << ": " << want_eos[i].status << " / " << got_eos[i].status);
    REQUIRE(got_eos[i].status.ok());
    CHECK(got_eos[i].token_ids == want_eos[i].token_ids);
  }
  CheckMappedHandOffs(**stack, 2);
  const Leaks l = WaitForNoLeaks(**stack, absl::Seconds(10));
  INFO(l.ToString());
  CHECK(l.zero());
}

TEST_CASE(
    "SIGKILL of a TP=2 decode instance's rank 1 mid-decode: UNAVAILABLE within 2 s, the "
    "decode instance leaves, the prefill side leaks nothing, no segment is left") {
  auto stack = launcher::LocalStack::Start(PdOptions(2));
  REQUIRE(stack.ok());
  const pid_t decode0 = (*stack)->decode(0).process->pid();
  const std::vector<pid_t> shards = ChildrenOf(decode0);
  REQUIRE(shards.size() == 1);
  const DemoSet& set = Demo();
  auto stub = mmserve::v1::Inference::NewStub(InternalChannel((*stack)->router_address()));
  const std::set<std::string> shm_before = ShmEntries();
  // Past the first token (2 tokens): the decode ranks are streaming.
  const std::vector<std::string> internals = StackInternals(**stack);
  const KilledStreams run =
      StreamAndKill(*stub, LongTextRequests(set, 4), [&] { kill(shards[0], SIGKILL); },
                    {.streaming_tokens = 2, .http_port = (*stack)->http_port(), .http_streams = 2});
  const absl::Status unavailable = run.AllUnavailable(absl::Seconds(2));
  INFO(unavailable);
  CHECK(unavailable.ok());
  // Before, each stream's error named the decode instance and its
  // tensor-parallel segment (with a pid); now that stays in the router's log.
  const absl::Status shown = run.AllPublic(internals);
  INFO(shown);
  CHECK(shown.ok());
  CheckPrefillClean(**stack);
  CHECK(ScrapeMetric((*stack)->router().metrics_port(), "mmserve_router_calls_live") == 0);
  // The out-of-service decode instance leaves on its own, having reaped its
  // rank; neither left a segment (ours or UCX's) behind.
  const Deadline gone = Deadline::After(absl::Seconds(20));
  while ((*stack)->decode(0).process->alive() && !gone.Expired()) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  REQUIRE_FALSE((*stack)->decode(0).process->alive());
  CHECK((*stack)->decode(0).process->exit_status() == 0);
  for (const std::string& name : ShmEntries()) {
    INFO(name);
    CHECK(name.find(absl::StrCat("decode-0-", decode0)) == std::string::npos);
    CHECK(shm_before.count(name) == 1);
  }
  // Restarted (as the launcher does), the TP=2 decode instance serves again.
  REQUIRE((*stack)->StartRole("decode", 0).ok());
  const Deadline healthy = Deadline::After(absl::Seconds(60));
  uint32_t decoders = 0;
  while (decoders != 1 && !healthy.Expired()) {
    grpc::ClientContext ctx;
    mmserve::v1::ListModelsResponse models;
    if (stub->ListModels(&ctx, {}, &models).ok() && models.models_size() > 0) {
      decoders = models.models(0).decode_instances();
    }
    if (decoders != 1) absl::SleepFor(absl::Milliseconds(50));
  }
  REQUIRE(decoders == 1);
  AskOptions o;
  o.max_tokens = 6;
  o.ignore_eos = true;
  const Answer again = AskGrpc(*stub, DemoTextRequest(set.items[0], o), o);
  INFO(again.status);
  CHECK(again.status.ok());
  CHECK(again.token_ids.size() == 6);
  const Leaks l = WaitForNoLeaks(**stack, absl::Seconds(10));
  INFO(l.ToString());
  CHECK(l.zero());
}

TEST_CASE(
    "SIGKILL of a TP=2 decode instance's rank 1 mid-hand-off: a bounded error, the prefill side "
    "frees its blocks and leaks nothing, the decode instance leaves") {
  launcher::StackOptions so = SlowHandoffOptions();
  so.decode_args = {"--tp=2"};
  auto stack = launcher::LocalStack::Start(so);
  INFO(stack.status());
  REQUIRE(stack.ok());
  const pid_t decode0 = (*stack)->decode(0).process->pid();
  const std::vector<pid_t> shards = ChildrenOf(decode0);
  REQUIRE(shards.size() == 1);
  const std::set<std::string> shm_before = ShmEntries();
  Calls calls(**stack, 2);
  REQUIRE(DecodeHoldsReservation(**stack));
  REQUIRE(kill(shards[0], SIGKILL) == 0);
  calls.Join();
  for (int i = 0; i < 2; ++i) {
    INFO(i << ": " << calls.status[i] << " after " << calls.tokens[i] << " tokens, "
           << calls.seconds[i] << " s");
    CHECK_FALSE(calls.status[i].ok());
    CHECK(calls.tokens[i] == 0);
    CHECK(calls.seconds[i] < 30);
    INFO(calls.Public(i));
    CHECK(calls.Public(i).ok());
  }
  bool zero = false;
  const std::string prefill = Settled((*stack)->prefill(0).metrics_port(), &zero);
  INFO("prefill: " << prefill);
  CHECK(zero);
  CHECK(ScrapeMetric((*stack)->router().metrics_port(), "mmserve_router_calls_live") == 0);
  // The decode instance finds its rank gone at its next step or hand-off
  // step and leaves; nothing of it stays in /dev/shm.
  const Deadline gone = Deadline::After(absl::Seconds(20));
  while ((*stack)->decode(0).process->alive() && !gone.Expired()) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  CHECK_FALSE((*stack)->decode(0).process->alive());
  for (const std::string& name : ShmEntries()) {
    INFO(name);
    CHECK(shm_before.count(name) == 1);
  }
}

}  // namespace
}  // namespace mmserve::testing
