// The stack under faults and bad input, with real processes: encoder
// affinity and caching, cancellation and deadlines, hostile requests through
// gRPC and HTTP, SIGKILL of an encoder and of the language instance. After
// each, every surviving process holds zero blocks and zero requests.
#include <httplib.h>
#include <signal.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
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

void CheckNoLeaks(launcher::LocalStack& stack) {
  const Leaks leaks = WaitForNoLeaks(stack, absl::Seconds(10));
  INFO(leaks.ToString());
  CHECK(leaks.zero());
}

// `n` demo questions, each to run for 3000 tokens.
std::vector<GenerateRequest> LongRequests(const DemoSet& set, int n) {
  AskOptions o;
  o.max_tokens = 3000;
  o.ignore_eos = true;
  std::vector<GenerateRequest> out;
  for (int i = 0; i < n; ++i) out.push_back(DemoRequest(set, set.items[i], o));
  return out;
}

TEST_CASE("with two encoders the same image always reaches the same encoder and hits its cache") {
  launcher::StackOptions so = TestStackOptions(2, "shm");
  // Health polls that a busy machine answers in time: an encoder taken out
  // of placement for a late poll would send its images' second use to the
  // other one, which is not what this test is about.
  // The repeats must reach an encoder: no skipping of images the language
  // instance holds.
  so.router_args = {"--poll_timeout_ms=2000", "--down_after=3", "--heartbeat_timeout_ms=10000",
                    "--skip_cached_images=false"};
  auto stack = launcher::LocalStack::Start(so);
  REQUIRE(stack.ok());
  const DemoSet& set = Demo();
  auto stub = mmserve::v1::Inference::NewStub(InternalChannel((*stack)->router_address()));
  // 40 distinct images (one question each), then the same 40 again.
  std::vector<int> items;
  for (size_t i = 0; i < set.items.size() && items.size() < 40; i += 6) items.push_back(i);
  for (int round = 0; round < 2; ++round) {
    std::vector<Answer> a(items.size());
    ParallelFor(static_cast<int>(items.size()), 8, [&](int k) {
      a[k] = AskGrpc(*stub, DemoRequest(set, set.items[items[k]], {}), {});
    });
    for (const Answer& x : a) {
      REQUIRE(x.status.ok());
      CHECK(x.cache_hit_reported == (round == 1));
    }
  }
  double hits = 0, misses = 0;
  for (int e = 0; e < 2; ++e) {
    const int port = (*stack)->encoder(e).metrics_port();
    const double h = ScrapeMetric(port, "mmserve_encoder_cache_hits_total");
    const double m = ScrapeMetric(port, "mmserve_encoder_cache_misses_total");
    INFO("encoder " << e << ": " << h << " hits, " << m << " misses");
    CHECK(h == m);  // each image's second use went where its first did
    CHECK(m > 0);   // both encoders got work
    hits += h;
    misses += m;
  }
  CHECK(hits == 40);
  CHECK(misses == 40);
  CheckNoLeaks(**stack);
}

TEST_CASE("cancelled streams and expired deadlines free every block on every process") {
  auto stack = launcher::LocalStack::Start(TestStackOptions(1, "shm"));
  REQUIRE(stack.ok());
  const DemoSet& set = Demo();
  auto stub = mmserve::v1::Inference::NewStub(InternalChannel((*stack)->router_address()));
  std::vector<Answer> a(13);
  ParallelFor(13, 13, [&](int i) {
    AskOptions o;
    o.max_tokens = 3000;
    o.ignore_eos = true;
    if (i < 6) {
      o.cancel_after = 3;  // cancel mid-stream
    } else if (i < 12) {
      o.deadline = absl::Milliseconds(300 + 100 * i);  // expires mid-stream
    } else {
      o.max_tokens = 8;  // an ordinary request alongside
      o.ignore_eos = false;
    }
    a[i] = AskGrpc(*stub, DemoRequest(set, set.items[i], o), o);
  });
  for (int i = 0; i < 6; ++i) CHECK(a[i].status.code() == absl::StatusCode::kCancelled);
  for (int i = 6; i < 12; ++i) {
    INFO(a[i].status);
    CHECK(a[i].status.code() == absl::StatusCode::kDeadlineExceeded);
  }
  CHECK(a[12].status.ok());
  CHECK(a[12].text == InProcess(set, 13).text[12]);
  CheckNoLeaks(**stack);
}

std::string PixelBomb(const std::string& png) {
  // IHDR width and height (bytes 16..23) set to 30000 x 30000.
  std::string bomb = png;
  const unsigned char dims[8] = {0, 0, 0x75, 0x30, 0, 0, 0x75, 0x30};
  bomb.replace(16, 8, reinterpret_cast<const char*>(dims), 8);
  return bomb;
}

TEST_CASE("bad input gets INVALID_ARGUMENT with a reason and leaves other requests alone") {
  auto stack = launcher::LocalStack::Start(TestStackOptions(1, "shm"));
  REQUIRE(stack.ok());
  const DemoSet& set = Demo();
  auto stub = mmserve::v1::Inference::NewStub(InternalChannel((*stack)->router_address()));
  const std::string png = set.images.at(set.items[0].image_file);
  const std::vector<std::string> internals = StackInternals(**stack);

  // A long good request runs through all of it.
  Answer good;
  std::thread background([&] {
    AskOptions o;
    o.max_tokens = 400;
    o.ignore_eos = true;
    good = AskGrpc(*stub, DemoRequest(set, set.items[1], o), o);
  });

  struct Case {
    const char* name;
    std::function<void(GenerateRequest&)> mutate;
    const char* reason;
  };
  auto image_data = [](GenerateRequest& r) {
    return r.mutable_chat()->mutable_messages(0)->mutable_content(0)->mutable_image();
  };
  const std::vector<Case> cases = {
      {"empty image", [&](GenerateRequest& r) { image_data(r)->clear_data(); }, "empty"},
      {"non-image bytes",
       [&](GenerateRequest& r) { image_data(r)->set_data("this is not an image at all"); },
       "image 0"},
      {"truncated PNG", [&](GenerateRequest& r) { image_data(r)->set_data(png.substr(0, 100)); },
       "image 0"},
      {"pixel bomb header", [&](GenerateRequest& r) { image_data(r)->set_data(PixelBomb(png)); },
       "pixels"},
      {"too many images",
       [&](GenerateRequest& r) {
         auto* m = r.mutable_chat()->mutable_messages(0);
         for (int i = 0; i < 16; ++i) m->add_content()->mutable_image()->set_data(png);
       },
       "at most 16"},
      {"prompt longer than the context",
       [&](GenerateRequest& r) {
         std::string words;
         for (int i = 0; i < 6000; ++i) words += "square circle ";
         r.mutable_chat()->mutable_messages(0)->mutable_content(1)->set_text(words);
       },
       "context length"},
      {"negative temperature",
       [](GenerateRequest& r) { r.mutable_sampling()->set_temperature(-1); }, "temperature"},
      {"top_p above 1", [](GenerateRequest& r) { r.mutable_sampling()->set_top_p(2); }, "top_p"},
      {"zero max_tokens", [](GenerateRequest& r) { r.mutable_sampling()->set_max_tokens(0); },
       "max_tokens"},
      {"unknown model", [](GenerateRequest& r) { r.set_model("gpt-9"); }, "unknown model"},
      {"unknown role",
       [](GenerateRequest& r) { r.mutable_chat()->mutable_messages(0)->set_role("robot"); },
       "role"},
      {"no input", [](GenerateRequest& r) { r.clear_chat(); }, "no input"},
  };
  // Every case on the one stack, while the long request runs (a Catch2
  // section per case would start the stack and the long request again for
  // each).
  for (const Case& c : cases) {
    INFO(c.name);
    GenerateRequest r = DemoRequest(set, set.items[0], {});
    c.mutate(r);
    Answer a = AskGrpc(*stub, r, {});
    INFO(a.status);
    CHECK(a.status.code() == absl::StatusCode::kInvalidArgument);
    CHECK(a.status.message().find(c.reason) != absl::string_view::npos);
    // The precise reason, with the request id beside it and nothing of the
    // deployment in it.
    const absl::Status shown = CheckPublicError(a.status, a.request_id, internals);
    INFO(shown);
    CHECK(shown.ok());
    CHECK(a.retry_after.empty());
  }
  // The same through HTTP: JSON errors with HTTP statuses.
  httplib::Client http("127.0.0.1", (*stack)->http_port());
  auto res = http.Post("/v1/chat/completions", "{not json", "application/json");
  REQUIRE(res);
  CHECK(res->status == 400);
  CHECK(res->body.find("\"error\"") != std::string::npos);
  res = http.Post("/v1/chat/completions",
                  R"({"messages":[{"role":"user","content":"hi"}],"temperature":-2})",
                  "application/json");
  REQUIRE(res);
  CHECK(res->status == 400);
  CHECK(res->body.find("temperature") != std::string::npos);
  CHECK(InternalDetail(res->body, "", internals).empty());

  background.join();
  INFO(good.status);
  CHECK(good.status.ok());
  CHECK(good.token_ids.size() == 400);
  CheckNoLeaks(**stack);
}

TEST_CASE("SIGKILL of one of two encoders mid-load: every request still gets the right answer") {
  auto stack = launcher::LocalStack::Start(TestStackOptions(2, "shm"));
  REQUIRE(stack.ok());
  const DemoSet& set = Demo();
  auto stub = mmserve::v1::Inference::NewStub(InternalChannel((*stack)->router_address()));
  const int n = 300;
  const Reference& ref = InProcess(set, n);
  std::vector<Answer> a(n);
  std::atomic<int> done{0};
  std::thread killer([&] {
    while (done.load() < 40) absl::SleepFor(absl::Milliseconds(2));
    (*stack)->encoder(0).process->Signal(SIGKILL);
  });
  ParallelFor(n, 8, [&](int i) {
    a[i] = AskGrpc(*stub, DemoRequest(set, set.items[i], {}), {});
    ++done;
  });
  killer.join();
  for (int i = 0; i < n; ++i) {
    INFO("question " << i << ": " << a[i].status);
    REQUIRE(a[i].status.ok());
    CHECK(a[i].text == ref.text[i]);
    CHECK(a[i].token_ids == ref.ids[i]);
  }
  CHECK(!(*stack)->encoder(0).process->alive());
  CheckNoLeaks(**stack);
}

TEST_CASE(
    "SIGKILL of the only encoder with images in flight: UNAVAILABLE with a generic message, the "
    "request id and Retry-After over gRPC and HTTP, nothing leaked") {
  launcher::StackOptions so = TestStackOptions(1, "shm");
  // Each embedding waits 5 s before it leaves the encoder: the kill lands
  // while every image is on it.
  so.encoder_args.push_back("--test_only_publish_delay_ms=5000");
  auto stack = launcher::LocalStack::Start(so);
  REQUIRE(stack.ok());
  const DemoSet& set = Demo();
  auto stub = mmserve::v1::Inference::NewStub(InternalChannel((*stack)->router_address()));
  const std::vector<std::string> internals = StackInternals(**stack);
  std::vector<GenerateRequest> requests;
  for (int i = 0; i < 4; ++i) requests.push_back(DemoRequest(set, set.items[i], {}));
  requests[0].set_request_id("client-chosen-id");
  // No stream has a token before the kill: it comes after a second.
  const KilledStreams run = StreamAndKill(
      *stub, requests, [&] { (*stack)->encoder(0).process->Signal(SIGKILL); },
      {.wait = absl::Seconds(1), .http_port = (*stack)->http_port(), .http_streams = 2});
  for (const StreamEnd& end : run.streams) {
    INFO(end.status << (end.http ? " (HTTP)" : ""));
    CHECK(end.status.code() == absl::StatusCode::kUnavailable);
    CHECK(end.tokens == 0);
  }
  CHECK(run.streams[0].request_id == "client-chosen-id");
  const absl::Status shown = run.AllPublic(internals);
  INFO(shown);
  CHECK(shown.ok());
  CheckNoLeaks(**stack);
}

TEST_CASE(
    "SIGKILL of the language instance: UNAVAILABLE within 2 s, the router stays up, and a "
    "restarted instance serves again") {
  auto stack = launcher::LocalStack::Start(TestStackOptions(1, "shm"));
  REQUIRE(stack.ok());
  const DemoSet& set = Demo();
  auto stub = mmserve::v1::Inference::NewStub(InternalChannel((*stack)->router_address()));
  const std::vector<std::string> internals = StackInternals(**stack);
  // Two streams over gRPC, two over HTTP.
  const KilledStreams run = StreamAndKill(*stub, LongRequests(set, 4),
                                          [&] { (*stack)->language().process->Signal(SIGKILL); },
                                          {.http_port = (*stack)->http_port(), .http_streams = 2});
  const absl::Status unavailable = run.AllUnavailable(absl::Seconds(2));
  INFO(unavailable);
  CHECK(unavailable.ok());
  const absl::Status shown = run.AllPublic(internals);
  INFO(shown);
  CHECK(shown.ok());
  // The router is up and stops placing on the dead instance.
  const Deadline d = Deadline::After(absl::Seconds(3));
  mmserve::v1::ListModelsResponse models;
  do {
    grpc::ClientContext ctx;
    models.Clear();
    REQUIRE(stub->ListModels(&ctx, {}, &models).ok());
  } while (models.models(0).prefill_instances() != 0 && !d.Expired());
  CHECK(models.models(0).prefill_instances() == 0);
  Stopwatch clock;
  Answer refused = AskGrpc(*stub, DemoRequest(set, set.items[0], {}), {});
  CHECK(refused.status.code() == absl::StatusCode::kUnavailable);
  CHECK(clock.ElapsedSeconds() < 1.0);
  INFO(CheckPublicError(refused.status, refused.request_id, internals));
  CHECK(CheckPublicError(refused.status, refused.request_id, internals).ok());
  CHECK(refused.retry_after == "1");

  REQUIRE((*stack)->StartLanguage().ok());
  REQUIRE((*stack)->WaitHealthy(1, 1, absl::Seconds(30)).ok());
  Answer again = AskGrpc(*stub, DemoRequest(set, set.items[0], {}), {});
  INFO(again.status);
  CHECK(again.status.ok());
  CHECK(again.text == InProcess(set, 1).text[0]);
  CheckNoLeaks(**stack);
}

TEST_CASE(
    "SIGKILL of a TP=2 instance's shard rank mid-decode: its streams end with UNAVAILABLE "
    "within 2 s, nothing hangs, no shared-memory segment is left") {
  launcher::StackOptions so = TestStackOptions(1, "shm");
  so.language_args.push_back("--tp=2");
  so.language_args.push_back("--threads=1");
  auto stack = launcher::LocalStack::Start(so);
  REQUIRE(stack.ok());
  const pid_t rank0 = (*stack)->language().process->pid();
  const std::vector<pid_t> shards = ChildrenOf(rank0);
  REQUIRE(shards.size() == 1);
  const DemoSet& set = Demo();
  auto stub = mmserve::v1::Inference::NewStub(InternalChannel((*stack)->router_address()));
  const std::vector<std::string> internals = StackInternals(**stack);
  const KilledStreams run =
      StreamAndKill(*stub, LongRequests(set, 4), [&] { kill(shards[0], SIGKILL); },
                    {.http_port = (*stack)->http_port(), .http_streams = 2});
  const absl::Status unavailable = run.AllUnavailable(absl::Seconds(2));
  INFO(unavailable);
  CHECK(unavailable.ok());
  // The segment name and the ranks' pids stay in the logs.
  const absl::Status shown = run.AllPublic(internals);
  INFO(shown);
  CHECK(shown.ok());
  // The out-of-service instance leaves on its own: it drains and exits
  // cleanly, having reaped its shard; no segment of it is left.
  const Deadline gone = Deadline::After(absl::Seconds(20));
  while ((*stack)->language().process->alive() && !gone.Expired()) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  REQUIRE_FALSE((*stack)->language().process->alive());
  CHECK((*stack)->language().process->exit_status() == 0);
  CHECK(ChildrenOf(rank0).empty());
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm")) {
    CHECK(e.path().filename().string().find(absl::StrCat("language-0-", rank0)) ==
          std::string::npos);
  }
  // Meanwhile requests are refused quickly rather than hanging.
  Stopwatch clock;
  Answer refused = AskGrpc(*stub, DemoRequest(set, set.items[0], {}), {});
  CHECK(refused.status.code() == absl::StatusCode::kUnavailable);
  CHECK(clock.ElapsedSeconds() < 2.0);
  // Restarted (as the launcher does), the TP=2 instance serves again.
  REQUIRE((*stack)->StartLanguage().ok());
  REQUIRE((*stack)->WaitHealthy(1, 1, absl::Seconds(60)).ok());
  Answer again = AskGrpc(*stub, DemoRequest(set, set.items[0], {}), {});
  INFO(again.status);
  CHECK(again.status.ok());
  CHECK(again.text == InProcess(set, 1).text[0]);
  CheckNoLeaks(**stack);
}

// Gone, or a zombie nobody reaped yet.
bool ProcessGone(pid_t pid) {
  std::ifstream stat(absl::StrCat("/proc/", pid, "/stat"));
  std::string line;
  if (!std::getline(stat, line)) return true;
  const size_t paren = line.rfind(')');
  return paren != std::string::npos && paren + 2 < line.size() &&
         (line[paren + 2] == 'Z' || line[paren + 2] == 'X');
}

TEST_CASE(
    "SIGKILL of a TP=2 instance's rank 0: its streams end with UNAVAILABLE and the orphaned "
    "shard rank exits on its own") {
  launcher::StackOptions so = TestStackOptions(1, "shm");
  so.language_args.push_back("--tp=2");
  so.language_args.push_back("--threads=1");
  auto stack = launcher::LocalStack::Start(so);
  REQUIRE(stack.ok());
  const pid_t rank0 = (*stack)->language().process->pid();
  const std::vector<pid_t> shards = ChildrenOf(rank0);
  REQUIRE(shards.size() == 1);
  const DemoSet& set = Demo();
  auto stub = mmserve::v1::Inference::NewStub(InternalChannel((*stack)->router_address()));
  // Kills once both streams have a token; a stream that ends before its
  // first token (it must not) ends the wait too, and fails the check below
  // instead of hanging the test.
  const std::vector<std::string> internals = StackInternals(**stack);
  const KilledStreams run = StreamAndKill(
      *stub, LongRequests(set, 2), [&] { (*stack)->language().process->Signal(SIGKILL); },
      {.deadline = absl::Seconds(120), .http_port = (*stack)->http_port(), .http_streams = 1});
  const absl::Status unavailable = run.AllUnavailable();
  INFO(unavailable);
  CHECK(unavailable.ok());
  const absl::Status shown = run.AllPublic(internals);
  INFO(shown);
  CHECK(shown.ok());
  // The shard notices rank 0's death (its step wait checks rank 0's pid).
  const Deadline d = Deadline::After(absl::Seconds(10));
  while (!ProcessGone(shards[0]) && !d.Expired()) absl::SleepFor(absl::Milliseconds(10));
  CHECK(ProcessGone(shards[0]));
}

}  // namespace
}  // namespace mmserve::testing
