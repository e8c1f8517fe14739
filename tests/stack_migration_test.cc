// Migration through the stack, with real processes: two role-both language
// instances; SIGKILL of one while it streams. With the router's default
// --migration_limit=1 every stream, over gRPC and the OpenAI HTTP API, text
// or with an image, completes with exactly the tokens and text of an
// uninterrupted run (greedy and seeded), nothing lost or repeated; with --migration_limit=0 the
// streams on the killed instance end UNAVAILABLE as before; a second kill
// past the limit ends UNAVAILABLE with a public message. The survivor holds
// nothing afterwards.
#include <httplib.h>
#include <signal.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/clock.h"
#include "common/grpc_server.h"
#include "common/grpc_status.h"
#include "tests/public_errors.h"
#include "tests/stack_harness.h"

namespace mmserve::testing {
namespace {

using mmserve::v1::GenerateRequest;

constexpr int kTokens = 400;
// Long enough to outlive starting another instance.
constexpr int kLongTokens = 1500;

// The stack's role-both instance (language-0) and a second one started
// beside it (language-1).
struct TwoInstances {
  std::unique_ptr<launcher::LocalStack> stack;
  launcher::Service second;
  launcher::StackOptions options;
};

// Starts language-1 and waits until the router sees both instances.
absl::Status StartSecond(TwoInstances& t) {
  std::vector<std::string> args = {"--model_dir=" + t.options.model_dir,
                                   "--host=" + t.options.host,
                                   "--port=0",
                                   "--metrics_port=0",
                                   "--instance_id=language-1",
                                   "--router=" + t.stack->registry_address(),
                                   "--profile=" + t.options.profile};
  args.insert(args.end(), t.options.language_args.begin(), t.options.language_args.end());
  auto p =
      launcher::ChildProcess::Start({"language-1", t.options.bin_dir + "/language_service/language",
                                     args, t.options.log_dir + "/language-1.log"});
  if (!p.ok()) return p.status();
  auto ready = (*p)->WaitReady(t.options.ready_timeout);
  if (!ready.ok()) return ready.status();
  t.second.id = ready->id;
  t.second.process = std::move(*p);
  t.second.ready = std::move(*ready);
  return t.stack->WaitHealthy(1, 2, absl::Seconds(60));
}

// The stack with language-0, and language-1 unless `second` is false.
TwoInstances Start(const std::vector<std::string>& router_args, bool second = true) {
  TwoInstances t;
  t.options = TestStackOptions(1, "shm");
  t.options.router_args.insert(t.options.router_args.end(), router_args.begin(), router_args.end());
  auto stack = launcher::LocalStack::Start(t.options);
  INFO(stack.status().ToString());
  REQUIRE(stack.ok());
  t.stack = std::move(*stack);
  if (second) {
    const absl::Status started = StartSecond(t);
    INFO(started.ToString());
    REQUIRE(started.ok());
  }
  return t;
}

// Text requests that run `tokens` tokens: even ones greedy, odd ones before
// `seeded_below` seeded (temperature 0.8, top_p 0.9; the OpenAI body the
// HTTP streams send carries no seed, so those stay greedy).
std::vector<GenerateRequest> Requests(int n, int tokens, int seeded_below) {
  const DemoSet& set = Demo();
  std::vector<GenerateRequest> out;
  for (int i = 0; i < n; ++i) {
    AskOptions o;
    o.max_tokens = tokens;
    o.ignore_eos = true;
    GenerateRequest r = DemoTextRequest(set.items[i], o);
    if (i % 2 == 1 && i < seeded_below) {
      r.mutable_sampling()->set_temperature(0.8f);
      r.mutable_sampling()->set_top_p(0.9f);
      r.mutable_sampling()->set_seed(1000 + i);
    }
    out.push_back(std::move(r));
  }
  return out;
}

// What one stream gave its client.
struct Streamed {
  absl::Status status;
  std::vector<int32_t> tokens;  // gRPC only
  std::string text;
  int chunks = 0;  // responses (gRPC) or content chunks (HTTP)
  // The longest wait between two chunks, and when the last came.
  int64_t max_gap_ns = 0;
  int64_t last_ns = 0;
  std::string request_id;
  std::string retry_after;
};

void Gap(Streamed& s) {
  const int64_t now = MonotonicNanos();
  if (s.last_ns > 0) s.max_gap_ns = std::max(s.max_gap_ns, now - s.last_ns);
  s.last_ns = now;
}

// One streamed chat completion over the OpenAI API: its content, or the
// error event's code.
void StreamOpenAi(int port, const GenerateRequest& request, Streamed& out,
                  const std::function<void()>& on_chunk) {
  httplib::Client cli("127.0.0.1", port);
  cli.set_read_timeout(300, 0);
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/chat/completions";
  req.set_header("Content-Type", "application/json");
  req.body = OpenAiStreamBody(request);
  std::string pending;
  req.content_receiver = [&](const char* data, size_t len, uint64_t, uint64_t) {
    pending.append(data, len);
    for (size_t at = pending.find("\n\n"); at != std::string::npos; at = pending.find("\n\n")) {
      const std::string event = pending.substr(0, at);
      pending.erase(0, at + 2);
      if (event.rfind("data: ", 0) != 0 || event == "data: [DONE]") continue;
      const nlohmann::json j = nlohmann::json::parse(event.substr(6), nullptr, false);
      if (j.is_discarded()) continue;
      if (j.contains("error")) {
        out.status = absl::UnavailableError(j["error"].dump());
        if (j["error"].value("code", "") != "unavailable" &&
            j["error"].value("type", "") != "unavailable") {
          out.status = absl::UnknownError(j["error"].dump());
        }
      } else if (!j["choices"].empty() && j["choices"][0]["delta"].contains("content") &&
                 j["choices"][0]["delta"]["content"].is_string()) {
        out.text += j["choices"][0]["delta"]["content"].get<std::string>();
        ++out.chunks;
        Gap(out);
        on_chunk();
      }
    }
    return true;
  };
  httplib::Response res;
  httplib::Error error = httplib::Error::Success;
  if (!cli.send(req, res, error)) {
    out.status = absl::UnavailableError(httplib::to_string(error));
  } else if (res.status != 200) {
    out.status = absl::UnknownError(absl::StrCat("HTTP ", res.status));
  }
  out.request_id = res.get_header_value("X-Request-Id");
}

// Streams every request at once (the last `http` over the OpenAI API) and
// runs `kill` once each has streamed a few chunks; then reads all to the end.
std::vector<Streamed> StreamAll(launcher::LocalStack& stack,
                                const std::vector<GenerateRequest>& requests, int http,
                                const std::function<void()>& kill) {
  const int n = static_cast<int>(requests.size());
  std::vector<Streamed> out(n);
  absl::Mutex mu;
  int streaming = 0;
  std::thread killer([&] {
    if (!kill) return;
    {
      absl::MutexLock lock(&mu);
      auto all = [&] { return streaming >= n; };
      mu.AwaitWithTimeout(absl::Condition(&all), absl::Seconds(60));
    }
    kill();
  });
  auto stub = mmserve::v1::Inference::NewStub(InternalChannel(stack.router_address()));
  ParallelFor(n, n, [&](int i) {
    Streamed& s = out[i];
    bool counted = false;
    auto on_chunk = [&] {
      if (counted || s.chunks < 3) return;
      counted = true;
      absl::MutexLock lock(&mu);
      ++streaming;
    };
    if (i >= n - http) {
      StreamOpenAi(stack.http_port(), requests[i], s, on_chunk);
    } else {
      grpc::ClientContext ctx;
      auto reader = stub->Generate(&ctx, requests[i]);
      mmserve::v1::GenerateResponse r;
      while (reader->Read(&r)) {
        s.text += r.text();
        for (uint32_t t : r.token_ids()) s.tokens.push_back(static_cast<int32_t>(t));
        ++s.chunks;
        Gap(s);
        on_chunk();
      }
      s.status = FromGrpcStatus(reader->Finish());
      for (const auto& [key, value] : ctx.GetServerTrailingMetadata()) {
        if (key == "x-request-id") s.request_id = std::string(value.data(), value.size());
        if (key == "retry-after") s.retry_after = std::string(value.data(), value.size());
      }
    }
    if (!counted) {
      absl::MutexLock lock(&mu);
      ++streaming;
    }
  });
  killer.join();
  return out;
}

// What a client must not see: the stack's internals and the second
// instance's id, process id and address.
std::vector<std::string> Internals(TwoInstances& t) {
  std::vector<std::string> out = StackInternals(*t.stack);
  out.push_back(t.second.id);
  out.push_back(absl::StrCat(t.second.process->pid()));
  const std::string address = t.second.grpc_address();
  out.push_back(address);
  out.push_back(address.substr(address.rfind(':') + 1));
  return out;
}

double Migrations(launcher::LocalStack& stack, const std::string& outcome) {
  return ScrapeMetric(stack.router().metrics_port(), "mmserve_router_migrations_total",
                      absl::StrCat("outcome=\"", outcome, "\""));
}

// The survivor and the router hold nothing once the streams are over.
void CheckSurvivorHoldsNothing(TwoInstances& t) {
  const int lp = t.second.metrics_port();
  const int rp = t.stack->router().metrics_port();
  const Deadline d = Deadline::After(absl::Seconds(10));
  double kv = -1, live = -1, calls = -1;
  do {
    kv = ScrapeMetric(lp, "mmserve_language_kv_blocks_used");
    live = ScrapeMetric(lp, "mmserve_language_requests_live");
    calls = ScrapeMetric(rp, "mmserve_router_calls_live");
    if (kv == 0 && live == 0 && calls == 0) break;
    absl::SleepFor(absl::Milliseconds(100));
  } while (!d.Expired());
  CHECK(kv == 0);
  CHECK(live == 0);
  CHECK(calls == 0);
}

TEST_CASE(
    "SIGKILL of a role-both instance mid-stream: every stream completes with the uninterrupted "
    "run's tokens, over gRPC and HTTP, greedy and seeded") {
  // Every stream starts on language-0; language-1 joins while they stream,
  // then language-0 is killed: all of them move.
  TwoInstances t = Start({}, /*second=*/false);
  constexpr int kHttp = 2;  // the last two, greedy
  std::vector<GenerateRequest> requests = Requests(8, kLongTokens, 8 - kHttp);
  // One greedy request with its image (copied for the new instance).
  AskOptions o;
  o.max_tokens = kLongTokens;
  o.ignore_eos = true;
  requests[4] = DemoRequest(Demo(), Demo().items[4], o);
  const std::vector<Streamed> want = StreamAll(*t.stack, requests, kHttp, nullptr);
  for (const Streamed& w : want) REQUIRE(w.status.ok());
  // language-1 starts from this thread: a child dies with the thread that
  // started it.
  absl::Notification streaming, killed;
  std::vector<Streamed> got;
  std::thread client([&] {
    got = StreamAll(*t.stack, requests, kHttp, [&] {
      streaming.Notify();
      killed.WaitForNotification();
    });
  });
  streaming.WaitForNotification();
  const absl::Status second = StartSecond(t);
  t.stack->language().process->Signal(SIGKILL);
  killed.Notify();
  client.join();
  INFO(second.ToString());
  REQUIRE(second.ok());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("stream " << i << ": " << got[i].status);
    CHECK(got[i].status.ok());
    CHECK(got[i].text == want[i].text);
    CHECK(got[i].tokens == want[i].tokens);
    if (i < got.size() - kHttp) CHECK(got[i].tokens.size() == static_cast<size_t>(kLongTokens));
    // Each stream was still going when the instance died.
    CHECK(got[i].chunks > 3);
  }
  CHECK(Migrations(*t.stack, "resumed") == static_cast<double>(got.size()));
  int64_t gap = 0, gap_before = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    gap = std::max(gap, got[i].max_gap_ns);
    gap_before = std::max(gap_before, want[i].max_gap_ns);
  }
  WARN("longest pause a client saw: " << gap / 1000000 << " ms with the kill and the move, "
                                      << gap_before / 1000000 << " ms without");
  CHECK(Migrations(*t.stack, "over_limit") == 0);
  CheckSurvivorHoldsNothing(t);
}

TEST_CASE("with --migration_limit=0 the killed instance's streams end UNAVAILABLE") {
  TwoInstances t = Start({"--migration_limit=0"});
  const std::vector<std::string> internals = Internals(t);
  const std::vector<Streamed> got = StreamAll(
      *t.stack, Requests(6, kTokens, 6), 0, [&] { t.stack->language().process->Signal(SIGKILL); });
  int unavailable = 0;
  for (const Streamed& s : got) {
    INFO(s.status);
    if (s.status.ok()) {
      CHECK(s.tokens.size() == static_cast<size_t>(kTokens));
      continue;
    }
    CHECK(s.status.code() == absl::StatusCode::kUnavailable);
    INFO(CheckPublicError(s.status, s.request_id, internals));
    CHECK(CheckPublicError(s.status, s.request_id, internals).ok());
    ++unavailable;
  }
  CHECK(unavailable >= 1);
  CHECK(Migrations(*t.stack, "resumed") == 0);
  CheckSurvivorHoldsNothing(t);
}

TEST_CASE("a second kill past the limit ends the moved streams UNAVAILABLE with a public message") {
  TwoInstances t = Start({});
  const std::vector<std::string> internals = Internals(t);
  // Long enough to outlive both kills.
  const std::vector<Streamed> got = StreamAll(*t.stack, Requests(4, 3000, 4), 0, [&] {
    t.stack->language().process->Signal(SIGKILL);
    // Once a stream moved, the instance it moved to dies too.
    const Deadline d = Deadline::After(absl::Seconds(30));
    while (Migrations(*t.stack, "resumed") < 1 && !d.Expired()) {
      absl::SleepFor(absl::Milliseconds(20));
    }
    absl::SleepFor(absl::Milliseconds(200));
    t.second.process->Signal(SIGKILL);
  });
  for (const Streamed& s : got) {
    INFO(s.status);
    CHECK(s.status.code() == absl::StatusCode::kUnavailable);
    INFO(CheckPublicError(s.status, s.request_id, internals));
    CHECK(CheckPublicError(s.status, s.request_id, internals).ok());
  }
  CHECK(Migrations(*t.stack, "resumed") >= 1);
  CHECK(Migrations(*t.stack, "over_limit") >= 1);
  const int rp = t.stack->router().metrics_port();
  const Deadline d = Deadline::After(absl::Seconds(10));
  while (ScrapeMetric(rp, "mmserve_router_calls_live") != 0 && !d.Expired()) {
    absl::SleepFor(absl::Milliseconds(100));
  }
  CHECK(ScrapeMetric(rp, "mmserve_router_calls_live") == 0);
}

}  // namespace
}  // namespace mmserve::testing
