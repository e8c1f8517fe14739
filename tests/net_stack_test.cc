// The stack across test hosts (network namespaces on an emulated network,
// tests/net_hosts.h): answers over gRPC and UCX tcp between hosts, then the
// network faults (delay, loss, cuts, partitions, router restart) one after
// another on the same stack, each ending with every block and request freed
// and the service back without a restart; remote media fetched from the
// test's own address across the switch (and every SSRF refusal) on the
// first stack. Skipped, with the reason printed, where namespaces cannot be
// made.
#include "tests/net_stack.h"

#include <dirent.h>
#include <httplib.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/grpc_server.h"
#include "common/grpc_status.h"

namespace mmserve::testing {
namespace {

using mmserve::v1::GenerateRequest;

bool Skipped() {
  const absl::Status s = NetHostsSupported();
  if (s.ok()) return false;
  WARN("SKIPPED: " << s.message());
  return true;
}

// Questions on `n` distinct images, starting at image `first`.
std::vector<int> Items(int n, int first = 0) {
  std::vector<int> items;
  for (int i = 0; i < n; ++i) items.push_back((first + i) * 6);
  return items;
}

// Asks `items` (`threads` at a time); each answer is the in-process engine's
// or, with `errors_ok`, a clean UNAVAILABLE / DEADLINE_EXCEEDED. Returns the
// mean time to the first token of those answered.
absl::Duration AskAndCompare(mmserve::v1::Inference::Stub& stub, const std::vector<int>& items,
                             int threads = 4, bool errors_ok = false) {
  const DemoSet& set = Demo();
  const Reference& ref = InProcess(set, *std::max_element(items.begin(), items.end()) + 1);
  std::vector<Answer> a(items.size());
  std::vector<int64_t> ttft(items.size(), 0);
  ParallelFor(static_cast<int>(items.size()), threads, [&](int k) {
    const GenerateRequest req = DemoRequest(set, set.items[items[k]], {});
    grpc::ClientContext ctx;
    // A minute per request, three under a sanitizer (a loaded ASan run
    // queues 8 requests behind slow -O0 forwards).
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(60) * kSanitizerSlowdown);
    const int64_t start = MonotonicNanos();
    auto reader = stub.Generate(&ctx, req);
    mmserve::v1::GenerateResponse r;
    while (reader->Read(&r)) {
      if (ttft[k] == 0 && r.token_ids_size() > 0) ttft[k] = MonotonicNanos() - start;
      for (uint32_t t : r.token_ids()) a[k].token_ids.push_back(static_cast<int32_t>(t));
    }
    a[k].status = FromGrpcStatus(reader->Finish());
  });
  int64_t sum = 0;
  int answered = 0;
  for (size_t k = 0; k < items.size(); ++k) {
    INFO("item " << items[k] << ": " << a[k].status);
    if (errors_ok && (absl::IsUnavailable(a[k].status) || absl::IsDeadlineExceeded(a[k].status))) {
      continue;
    }
    REQUIRE(a[k].status.ok());
    CHECK(a[k].token_ids == ref.ids[items[k]]);
    sum += ttft[k];
    ++answered;
  }
  return answered > 0 ? absl::Nanoseconds(sum / answered) : absl::ZeroDuration();
}

void CheckNoLeaks(NetStack& stack) {
  const Leaks leaks = stack.WaitForNoLeaks(absl::Seconds(30));
  INFO(leaks.ToString());
  CHECK(leaks.zero());
}

// Every host's and the client's link.
void SetAllLinks(NetHosts& hosts, const LinkFault& f) {
  for (int h = 0; h < hosts.size(); ++h) hosts.SetLink(h, f);
  hosts.SetClientLink(f);
}

// Waits (bounded) until `done` holds; false when it never did.
bool WaitFor(const std::function<bool()>& done, absl::Duration timeout = absl::Seconds(30)) {
  const Deadline deadline = Deadline::After(timeout);
  while (!deadline.Expired()) {
    if (done()) return true;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return done();
}

// Hosts, the stack on them and a stub of its router; REQUIREs each.
struct Running {
  std::unique_ptr<NetHosts> hosts;
  std::unique_ptr<NetStack> stack;
  std::unique_ptr<mmserve::v1::Inference::Stub> stub;
};
Running StartOnHosts(const NetStackOptions& o) {
  Running r;
  auto hosts = NetHosts::Create(NetStack::HostsFor(o));
  INFO(hosts.status());
  REQUIRE(hosts.ok());
  r.hosts = std::move(*hosts);
  auto stack = NetStack::Start(*r.hosts, o);
  INFO(stack.status());
  REQUIRE(stack.ok());
  r.stack = std::move(*stack);
  r.stub = mmserve::v1::Inference::NewStub(InternalChannel(r.stack->router_address()));
  return r;
}

// Router flags for links that are slow or lossy but up: a health poll gets
// more than a round trip, and an instance leaves placement after about 2 s
// of silence.
const std::vector<std::string> kRouterArgs = {"--poll_ms=250", "--poll_timeout_ms=1000",
                                              "--down_after=2", "--heartbeat_timeout_ms=3000"};

// Demo images and misbehaving answers over HTTP on the test's own address on
// the switch (a private 10.213.x address the router on host 0 reaches).
class MediaServer {
 public:
  explicit MediaServer(const std::string& address) {
    for (const auto& [file, bytes] : Demo().images) {
      server_.Get("/img/" + file, [bytes = bytes](const httplib::Request&, httplib::Response& res) {
        res.set_content(bytes, "image/png");
      });
    }
    server_.Get("/to-private", [](const httplib::Request&, httplib::Response& res) {
      res.set_redirect("http://10.0.0.1/cat.png");
    });
    server_.Get("/big", [](const httplib::Request&, httplib::Response& res) {
      res.set_content(std::string(300000, 'x'), "image/png");
    });
    server_.Get("/big-chunked", [](const httplib::Request&, httplib::Response& res) {
      res.set_chunked_content_provider("image/png", [](size_t offset, httplib::DataSink& sink) {
        if (offset >= 300000) {
          sink.done();
          return true;
        }
        const std::string chunk(10000, 'x');
        return sink.write(chunk.data(), chunk.size());
      });
    });
    server_.Get("/slow", [this](const httplib::Request&, httplib::Response& res) {
      res.set_chunked_content_provider("image/png", [this](size_t offset, httplib::DataSink& sink) {
        if (offset >= 40 || stopping_) {
          sink.done();
          return true;
        }
        absl::SleepFor(absl::Milliseconds(200));
        return sink.write("\x89PNG", 4);
      });
    });
    server_.Get("/page.html", [](const httplib::Request&, httplib::Response& res) {
      res.set_content("<html>hello</html>", "text/html");
    });
    port_ = server_.bind_to_any_port(address);
    base_ = absl::StrCat("http://", address, ":", port_);
    thread_ = std::thread([this] { server_.listen_after_bind(); });
  }
  ~MediaServer() {
    stopping_ = true;
    server_.stop();
    thread_.join();
  }
  bool ok() const { return port_ > 0; }
  std::string Url(const std::string& path) const { return base_ + path; }
  int port() const { return port_; }

 private:
  httplib::Server server_;
  std::atomic<bool> stopping_{false};
  std::thread thread_;
  int port_ = 0;
  std::string base_;
};

int OpenFds(pid_t pid) {
  int n = 0;
  if (DIR* d = opendir(absl::StrCat("/proc/", pid, "/fd").c_str())) {
    while (readdir(d) != nullptr) ++n;
    closedir(d);
  }
  return n;
}

// The demo question with its image as a URL.
GenerateRequest UrlRequest(const DemoItem& item, const std::string& url) {
  GenerateRequest req = DemoRequest(Demo(), item, {});
  for (auto& part : *req.mutable_chat()->mutable_messages(0)->mutable_content()) {
    if (part.has_image()) part.mutable_image()->set_url(url);
  }
  return req;
}

// Remote media on the running stack: images fetched from the test's
// address answer as their bytes do, and every refusal is INVALID_ARGUMENT
// naming the URL and the reason; no request, socket or block is left.
void CheckRemoteMedia(Running& r, const MediaServer& media) {
  const DemoSet& set = Demo();
  const std::vector<int> items = Items(4, 1);
  const Reference& ref = InProcess(set, items.back() + 1);
  const pid_t router = r.stack->router().process->pid();
  const int fds = OpenFds(router);
  for (int i : items) {
    const DemoItem& item = set.items[i];
    Answer a = AskGrpc(*r.stub, UrlRequest(item, media.Url("/img/" + item.image_file)), {});
    INFO("item " << i << ": " << a.status);
    REQUIRE(a.status.ok());
    CHECK(a.token_ids == ref.ids[i]);
  }
  const DemoItem& item = set.items[0];
  const std::pair<std::string, std::string> refusals[] = {
      {absl::StrCat("http://127.0.0.1:", media.port(), "/img/", item.image_file),
       "resolves to a loopback address"},
      {media.Url("/to-private"), "http://10.0.0.1/cat.png resolves to a private address"},
      {"http://169.254.169.254/latest/meta-data/", "is not on a host this server fetches"},
      {media.Url("/big"), "is 300000 bytes; at most 200000"},
      {media.Url("/big-chunked"), "is larger than 200000 bytes"},
      {media.Url("/page.html"), "has content type \"text/html\", not an image"},
      {media.Url("/slow"), "took longer than 1500 ms to fetch"},
  };
  for (const auto& [url, why] : refusals) {
    const absl::Time start = absl::Now();
    Answer a = AskGrpc(*r.stub, UrlRequest(item, url), {});
    INFO(url << ": " << a.status);
    CHECK(absl::IsInvalidArgument(a.status));
    CHECK(absl::StartsWith(a.status.message(), "chat.messages[0].content[0].image.url: "));
    CHECK(absl::StrContains(a.status.message(), why));
    CHECK(absl::Now() - start < absl::Seconds(5) * kSanitizerSlowdown);
  }
  // Over the OpenAI HTTP API: the same answer, and the same refusal as 400.
  const int http_port = std::stoi(r.stack->router().ready.fields.at("http"));
  httplib::Client http(r.hosts->address(r.stack->router_host()), http_port);
  http.set_read_timeout(60, 0);
  for (const auto& [path, status] :
       {std::pair<std::string, int>{"/img/" + item.image_file, 200}, {"/page.html", 400}}) {
    nlohmann::json body = {{"messages",
                            {{{"role", "user"},
                              {"content",
                               {{{"type", "image_url"}, {"image_url", {{"url", media.Url(path)}}}},
                                {{"type", "text"}, {"text", item.question}}}}}}},
                           {"temperature", 0},
                           {"max_tokens", 8}};
    auto res = http.Post("/v1/chat/completions", body.dump(), "application/json");
    REQUIRE(res);
    INFO(res->body);
    CHECK(res->status == status);
    const nlohmann::json reply = nlohmann::json::parse(res->body);
    if (status == 200) {
      CHECK(reply["choices"][0]["message"]["content"] == ref.text[0]);
    } else {
      CHECK(reply["error"]["message"] ==
            absl::StrCat("messages[0].content[0].image_url: ", media.Url(path),
                         " has content type \"text/html\", not an image"));
    }
  }
  // Each request counted by how its fetch ended: the four and the HTTP one
  // fetched, six refusals and the HTTP one refused, the slow body timed out.
  auto fetches = [&](const char* result) {
    return r.stack->Metric(r.stack->router(), "mmserve_router_media_fetches_total",
                           absl::StrCat("result=\"", result, "\""));
  };
  CHECK(fetches("fetched") == 5);
  CHECK(fetches("refused") == 7);
  CHECK(fetches("timed_out") == 1);
  // A client that gives up during a slow fetch.
  Answer gone =
      AskGrpc(*r.stub, UrlRequest(item, media.Url("/slow")), {.deadline = absl::Milliseconds(300)});
  CHECK(absl::IsDeadlineExceeded(gone.status));
  CheckNoLeaks(*r.stack);
  CHECK(WaitFor([&] { return OpenFds(router) <= fds; }, absl::Seconds(10)));
  INFO("router descriptors " << fds << " before, " << OpenFds(router) << " after");
  CHECK(OpenFds(router) <= fds);
}

TEST_CASE(
    "across hosts over tcp the answers equal the in-process engine's, also for fetched media") {
  if (Skipped()) return;
  NetStackOptions o;
  o.encoders = 2;
  o.languages = {"both"};
  auto hosts = NetHosts::Create(NetStack::HostsFor(o));
  REQUIRE(hosts.ok());
  MediaServer media((*hosts)->client_address());
  REQUIRE(media.ok());
  // The test's network is private: its range is trusted; its address and
  // two non-public ones (the address check still refuses those) are allowed.
  o.router_args = {"--allow_remote_media",
                   "--allow_http_media",
                   "--allowed_media_domains=" + (*hosts)->client_address() + ",10.0.0.1,127.0.0.1",
                   "--media_fetch_allow_private_cidrs=10.213.0.0/16",
                   "--max_media_fetch_bytes=200000",
                   "--media_fetch_timeout_ms=1500",
                   "--http_port=0"};
  Running r;
  r.hosts = std::move(*hosts);
  auto stack = NetStack::Start(*r.hosts, o);
  INFO(stack.status());
  REQUIRE(stack.ok());
  r.stack = std::move(*stack);
  r.stub = mmserve::v1::Inference::NewStub(InternalChannel(r.stack->router_address()));
  AskAndCompare(*r.stub, Items(8));
  CheckNoLeaks(*r.stack);
  CheckRemoteMedia(r, media);
}

TEST_CASE("delay, loss, a partition and a router restart between hosts") {
  if (Skipped()) return;
  NetStackOptions o;
  o.encoders = 2;
  o.languages = {"both", "both"};
  o.router_args = kRouterArgs;
  Running r = StartOnHosts(o);
  NetHosts& hosts = *r.hosts;
  NetStack& stack = *r.stack;
  auto& stub = r.stub;
  AskAndCompare(*stub, Items(8, 0));  // every instance connected to every encoder
  {
    // Remote media is off by default.
    Answer a = AskGrpc(*stub, UrlRequest(Demo().items[0], "https://img.example.com/a.png"), {});
    CHECK(a.status == absl::InvalidArgumentError(
                          "chat.messages[0].content[0].image.url: remote media is disabled on "
                          "this server; send a data: URL"));
  }

  // Delay: one at a time, so that the time to the first token is the
  // critical path's round trips times 2 x the one-way delay (every port,
  // the client's too, delays what it sends).
  int first = 8;
  std::vector<std::pair<int, absl::Duration>> ttft;
  for (const int ms : {0, 10, 50}) {
    SetAllLinks(hosts, {.delay = absl::Milliseconds(ms), .jitter = absl::Milliseconds(ms * 2 / 5)});
    ttft.emplace_back(ms, AskAndCompare(*stub, Items(4, first), 1));
    first += 4;
  }
  SetAllLinks(hosts, {});
  for (const auto& [ms, t] : ttft) {
    const double trips = ms == 0 ? 0 : absl::ToDoubleMilliseconds(t - ttft[0].second) / (2.0 * ms);
    WARN("one-way delay " << ms << " ms (jitter +-" << ms * 2 / 5 << " ms): mean TTFT "
                          << absl::ToDoubleMilliseconds(t) << " ms, round trips on the critical "
                          << "path " << trips);
  }
  CheckNoLeaks(stack);

  // 1% and 5% of the frames lost on every link: answers unchanged or a
  // clean error.
  for (const double loss : {0.01, 0.05}) {
    SetAllLinks(hosts, {.loss = loss});
    AskAndCompare(*stub, Items(6, first), 3, /*errors_ok=*/true);
    first += 6;
    SetAllLinks(hosts, {});
    CheckNoLeaks(stack);
  }

  // Router <-> language-1 partitioned, language-1 running: no placement
  // there; healed: placed there again.
  {
    launcher::Service& isolated = stack.language(1);
    hosts.Partition(stack.router_host(), stack.language_host(1), true);
    REQUIRE(stack.WaitHealthy(2, "language", 1, absl::Seconds(60)).ok());
    const double before = stack.Metric(isolated, "mmserve_language_requests_total");
    AskAndCompare(*stub, Items(8, first));
    first += 8;
    CHECK(stack.Metric(isolated, "mmserve_language_requests_total") == before);
    CHECK(isolated.process->alive());
    hosts.Partition(stack.router_host(), stack.language_host(1), false);
    REQUIRE(stack.WaitHealthy(2, "language", 2, absl::Seconds(60)).ok());
    bool used = false;
    for (int round = 0; round < 4 && !used; ++round) {
      AskAndCompare(*stub, Items(8, first));
      first += 8;
      used = stack.Metric(isolated, "mmserve_language_requests_total") > before;
    }
    CHECK(used);
    CheckNoLeaks(stack);
  }

  // The router killed with streams in flight and started again on the same
  // address: the streams end UNAVAILABLE, the instances register again.
  {
    AskOptions lo{.max_tokens = 3000, .ignore_eos = true};
    std::vector<GenerateRequest> reqs;
    for (int i : Items(2, first)) reqs.push_back(DemoRequest(Demo(), Demo().items[i], lo));
    first += 2;
    KilledStreams run = StreamAndKill(*stub, reqs, [&] { stack.KillRouter(); },
                                      {.streaming_tokens = 1, .deadline = absl::Seconds(120)});
    const absl::Status ended = run.AllUnavailable(absl::Seconds(10) * kSanitizerSlowdown);
    INFO(ended);
    CHECK(ended.ok());
    REQUIRE(stack.StartRouter().ok());
    REQUIRE(stack.WaitHealthy(2, "language", 2, absl::Seconds(60)).ok());
    CheckNoLeaks(stack);
    auto fresh = mmserve::v1::Inference::NewStub(InternalChannel(stack.router_address()));
    AskAndCompare(*fresh, Items(4, first));
    CheckNoLeaks(stack);
  }
}

// Streams `items` at once on threads of their own (ended by `Join`).
struct Background {
  std::vector<Answer> answers;
  std::vector<int64_t> ended_ns;
  std::thread thread;
  void Join() { thread.join(); }
};
std::unique_ptr<Background> AskInBackground(mmserve::v1::Inference::Stub& stub,
                                            const std::vector<int>& items) {
  auto b = std::make_unique<Background>();
  b->answers.resize(items.size());
  b->ended_ns.resize(items.size());
  b->thread = std::thread([&stub, items, b = b.get()] {
    ParallelFor(static_cast<int>(items.size()), static_cast<int>(items.size()), [&](int k) {
      b->answers[k] = AskGrpc(stub, DemoRequest(Demo(), Demo().items[items[k]], {}),
                              {.deadline = absl::Seconds(60)});
      b->ended_ns[k] = MonotonicNanos();
    });
  });
  return b;
}

// Each answer is the in-process engine's or UNAVAILABLE (never a deadline);
// returns how many were UNAVAILABLE.
int CheckOkOrUnavailable(const Background& b, const std::vector<int>& items) {
  const Reference& ref = InProcess(Demo(), *std::max_element(items.begin(), items.end()) + 1);
  int unavailable = 0;
  for (size_t k = 0; k < items.size(); ++k) {
    const Answer& a = b.answers[k];
    INFO("item " << items[k] << ": " << a.status);
    if (absl::IsUnavailable(a.status)) {
      ++unavailable;
      continue;
    }
    REQUIRE(a.status.ok());
    CHECK(a.token_ids == ref.ids[items[k]]);
  }
  return unavailable;
}

TEST_CASE("a link cut mid-embedding-transfer and mid-KV-hand-off, then restored") {
  if (Skipped()) return;
  NetStackOptions o;
  o.encoders = 2;
  o.languages = {"prefill", "decode"};
  o.router_args = kRouterArgs;
  o.encoder_args = {"--keep_for_seconds=5"};
  // Every hand-off waits between AllocateKv and its puts, so that a cut
  // lands inside it; lost transfers give up after 5 s, hand-offs after 5 s
  // (15 s under a sanitizer, where a loaded -O0 run took longer than 5 s
  // from AllocateKv to CommitKv with nothing cut).
  o.language_args = {"--transfer_timeout_ms=5000",
                     absl::StrCat("--kv_commit_timeout_ms=", 5000 * kSanitizerSlowdown),
                     "--test_kv_handoff_delay_ms=1500"};
  Running r = StartOnHosts(o);
  NetHosts& hosts = *r.hosts;
  NetStack& stack = *r.stack;
  auto& stub = r.stub;
  AskAndCompare(*stub, Items(4, 0));

  // encoder-0's and the prefill instance's links slowed (a transfer spans
  // 600 ms: init, chunks, done), then encoder-0 cut while it sends an
  // embedding (frames on the wire are lost too): its images are sent to
  // encoder-1 or end UNAVAILABLE; restored, it is used again and nothing
  // leaks.
  {
    // Placement decides which encoder gets the images, so both links are
    // slowed and the one seen sending is cut.
    for (int e = 0; e < 2; ++e) {
      hosts.SetLink(stack.encoder_host(e), {.delay = absl::Milliseconds(300)});
    }
    hosts.SetLink(stack.language_host(0), {.delay = absl::Milliseconds(300)});
    const std::vector<int> items = Items(6, 10);
    const double encoded[2] = {
        stack.Metric(stack.encoder(0), "mmserve_encoder_images_encoded_total"),
        stack.Metric(stack.encoder(1), "mmserve_encoder_images_encoded_total")};
    auto run = AskInBackground(*stub, items);
    int cut = -1;
    // An encoder holds this request's embeddings once it has encoded one
    // of its images (it keeps them --keep_for_seconds) or while it sends;
    // scrapes cross the slowed links, so the gauge alone can be missed.
    const bool sending = WaitFor([&] {
      for (int e = 0; e < 2 && cut < 0; ++e) {
        launcher::Service& s = stack.encoder(e);
        if (stack.Metric(s, "mmserve_encoder_transfers_active") > 0 ||
            stack.Metric(s, "mmserve_encoder_images_encoded_total") > encoded[e]) {
          cut = e;
        }
      }
      return cut >= 0;
    });
    if (cut < 0) cut = 0;
    launcher::Service& enc = stack.encoder(cut);
    hosts.SetLink(stack.encoder_host(cut), {.cut = true});
    run->Join();
    hosts.SetLink(stack.encoder_host(1 - cut), {});
    hosts.SetLink(stack.language_host(0), {});
    WARN("encoder-" << cut << " cut "
                    << (sending ? "while it holds or sends embeddings" : "(no transfer seen)")
                    << "; " << CheckOkOrUnavailable(*run, items) << " of " << items.size()
                    << " requests ended UNAVAILABLE");
    CHECK(sending);
    CHECK(stack.Metric(enc, "mmserve_encoder_images_encoded_total") == -1);  // unreachable
    AskAndCompare(*stub, Items(4, 20));                                      // on the other encoder
    hosts.SetLink(stack.encoder_host(cut), {});
    REQUIRE(stack.WaitHealthy(2, "prefill", 1, absl::Seconds(60)).ok());
    CheckNoLeaks(stack);
    AskAndCompare(*stub, Items(8, 30));
    CHECK(stack.Metric(enc, "mmserve_encoder_images_encoded_total") > encoded[cut]);
    CheckNoLeaks(stack);
  }

  // The decode instance cut once it holds the KV blocks of a hand-off: the
  // request ends UNAVAILABLE within its deadline; restored, it serves again.
  {
    launcher::Service& decode = stack.language(1);
    const std::vector<int> items = Items(1, 40);
    auto run = AskInBackground(*stub, items);
    const bool allocated =
        WaitFor([&] { return stack.Metric(decode, "mmserve_language_kv_blocks_used") > 0; });
    const int64_t cut_ns = MonotonicNanos();
    hosts.SetLink(stack.language_host(1), {.cut = true});
    run->Join();
    CHECK(allocated);
    CHECK(CheckOkOrUnavailable(*run, items) == 1);
    WARN("the request ended " << absl::ToDoubleMilliseconds(
                                     absl::Nanoseconds(run->ended_ns[0] - cut_ns))
                              << " ms after the cut of the decode instance");
    hosts.SetLink(stack.language_host(1), {});
    REQUIRE(stack.WaitHealthy(2, "decode", 1, absl::Seconds(60)).ok());
    CheckNoLeaks(stack);
    AskAndCompare(*stub, Items(4, 50));
    CheckNoLeaks(stack);
  }
}

TEST_CASE("the shm profile across hosts is refused at start with the reason") {
  if (Skipped()) return;
  NetStackOptions o;
  o.profile = "shm";
  o.ready_timeout = absl::Seconds(60);
  auto hosts = NetHosts::Create(NetStack::HostsFor(o));
  REQUIRE(hosts.ok());
  auto stack = NetStack::Start(**hosts, o);
  REQUIRE(!stack.ok());
  INFO(stack.status());
  CHECK(absl::StrContains(stack.status().message(), "language-0 exited"));
  CHECK(absl::StrContains(stack.status().message(),
                          "transport profile shm needs every instance on one host"));
}

}  // namespace
}  // namespace mmserve::testing
