// The fetch against a media server on this host's loopback: refusals of
// non-public addresses (with loopback trusted only where a case says so),
// redirects, size caps before and during the body, slow bodies, non-image
// bodies, cancellation, https with a CA made at test time, and a request's
// URLs fetched concurrently and put in place; no descriptor outlives them.
#include "router/media_fetch.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <httplib.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/metrics.h"
#include "common/sanitizer.h"
#include "router/openai.h"
#include "router/request_fetch.h"

namespace mmserve::router {
namespace {

std::string Png() {
  std::string png;
  REQUIRE(
      absl::Base64Unescape("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+"
                           "M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==",
                           &png));
  return png;
}

int OpenFds() {
  int n = 0;
  DIR* d = opendir("/proc/self/fd");
  while (readdir(d) != nullptr) ++n;
  closedir(d);
  return n;
}

// Media over HTTP (or HTTPS with a certificate) on 127.0.0.1.
class MediaServer {
 public:
  explicit MediaServer(
      std::unique_ptr<httplib::Server> server = std::make_unique<httplib::Server>())
      : server_(std::move(server)) {
    httplib::Server& s = *server_;
    const std::string png = Png();
    s.Get("/cat.png", [png](const httplib::Request&, httplib::Response& res) {
      res.set_content(png, "image/png");
    });
    s.Get("/untyped", [png](const httplib::Request&, httplib::Response& res) {
      res.set_content(png, "application/octet-stream");
    });
    s.Get("/to-cat",
          [](const httplib::Request&, httplib::Response& res) { res.set_redirect("/cat.png"); });
    s.Get("/to-private", [](const httplib::Request&, httplib::Response& res) {
      res.set_redirect("http://10.0.0.1/cat.png");
    });
    s.Get("/to-metadata", [](const httplib::Request&, httplib::Response& res) {
      res.set_redirect("http://169.254.169.254/latest/meta-data/");
    });
    s.Get("/loop",
          [](const httplib::Request&, httplib::Response& res) { res.set_redirect("/loop"); });
    s.Get("/big", [](const httplib::Request&, httplib::Response& res) {
      res.set_content(std::string(5000, 'x'), "image/png");
    });
    s.Get("/big-chunked", [png](const httplib::Request&, httplib::Response& res) {
      res.set_chunked_content_provider("image/png", [png](size_t offset, httplib::DataSink& sink) {
        if (offset >= 5000) {
          sink.done();
          return true;
        }
        const std::string chunk = offset == 0 ? png : std::string(500, 'x');
        return sink.write(chunk.data(), chunk.size());
      });
    });
    s.Get("/slow", [this, png](const httplib::Request&, httplib::Response& res) {
      res.set_chunked_content_provider(
          "image/png", [this, png](size_t offset, httplib::DataSink& sink) {
            if (offset >= png.size() || stopping_) {
              sink.done();
              return true;
            }
            absl::SleepFor(absl::Milliseconds(100));
            return sink.write(png.data() + offset, std::min<size_t>(10, png.size() - offset));
          });
    });
    s.Get("/page.html", [](const httplib::Request&, httplib::Response& res) {
      res.set_content("<html>hello</html>", "text/html; charset=utf-8");
    });
    s.Get("/fake.png", [](const httplib::Request&, httplib::Response& res) {
      res.set_content("<html>not a picture</html>", "image/png");
    });
    s.Get("/huge-head", [png](const httplib::Request&, httplib::Response& res) {
      for (int i = 0; i < 100; ++i)
        res.set_header(absl::StrCat("X-Pad-", i), std::string(1000, 'p'));
      res.set_content(png, "image/png");
    });
    s.Get("/gzip", [png](const httplib::Request&, httplib::Response& res) {
      res.set_header("Content-Encoding", "gzip");
      res.set_content(png, "image/png");
    });
    s.Get("/headers", [png](const httplib::Request& req, httplib::Response& res) {
      // Uncompressed bytes asked for, and the connection not kept.
      const bool plain = req.get_header_value("Accept-Encoding") == "identity" &&
                         req.get_header_value("Connection") == "close" &&
                         req.get_header_value("Accept") == "image/*";
      res.status = plain ? 200 : 500;
      res.set_content(png, "image/png");
    });
    port_ = s.bind_to_any_port("127.0.0.1");
    REQUIRE(port_ > 0);
    thread_ = std::thread([this] { server_->listen_after_bind(); });
  }
  ~MediaServer() {
    stopping_ = true;
    server_->stop();
    thread_.join();
  }
  std::string Url(const std::string& path, const char* scheme = "http") const {
    return absl::StrCat(scheme, "://127.0.0.1:", port_, path);
  }

 private:
  std::unique_ptr<httplib::Server> server_;
  std::atomic<bool> stopping_{false};
  std::thread thread_;
  int port_ = 0;
};

// Answers each connection with the canned bytes for its request path, then
// closes it: responses an HTTP library would not send.
class RawServer {
 public:
  explicit RawServer(std::map<std::string, std::string> responses)
      : responses_(std::move(responses)) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    REQUIRE(::bind(fd_, reinterpret_cast<sockaddr*>(&a), len) == 0);
    REQUIRE(::listen(fd_, 16) == 0);
    REQUIRE(::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) == 0);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] { Serve(); });
  }
  ~RawServer() {
    ::shutdown(fd_, SHUT_RDWR);
    thread_.join();
    ::close(fd_);
  }
  std::string Url(const std::string& path) const {
    return absl::StrCat("http://127.0.0.1:", port_, path);
  }

 private:
  void Serve() {
    for (;;) {
      const int c = ::accept(fd_, nullptr, nullptr);
      if (c < 0) return;
      std::string request;
      char buf[4096];
      while (request.find("\r\n\r\n") == std::string::npos) {
        const ssize_t n = ::recv(c, buf, sizeof(buf), 0);
        if (n <= 0) break;
        request.append(buf, static_cast<size_t>(n));
      }
      const size_t space = request.find(' ');
      const std::string path = request.substr(space + 1, request.find(' ', space + 1) - space - 1);
      const auto it = responses_.find(path);
      const std::string& out = it != responses_.end() ? it->second : responses_.begin()->second;
      (void)::send(c, out.data(), out.size(), MSG_NOSIGNAL);
      ::close(c);
    }
  }

  const std::map<std::string, std::string> responses_;
  int fd_ = -1;
  int port_ = 0;
  std::thread thread_;
};

// Remote media on, plain http allowed, this host's loopback trusted.
MediaFetchOptions Trusting() {
  MediaFetchOptions o;
  o.enabled = true;
  o.allow_http = true;
  o.trusted_ranges = *ParseCidrList("127.0.0.0/8");
  o.timeout = absl::Seconds(5);
  return o;
}

absl::StatusOr<FetchedMedia> Get(const MediaFetchOptions& o, const std::string& url,
                                 size_t max_bytes = 4000) {
  FetchCancel cancel;
  return MediaFetcher(o).Fetch(url, MediaKind::kImage, max_bytes, absl::Now() + o.timeout, cancel);
}

void CheckRefused(const absl::StatusOr<FetchedMedia>& got, const std::string& why) {
  REQUIRE_FALSE(got.ok());
  INFO(got.status());
  CHECK(absl::IsInvalidArgument(got.status()));
  CHECK_THAT(std::string(got.status().message()), Catch::Contains(why));
  CHECK_THAT(std::string(got.status().message()), !Catch::Contains("127.0.0.1:0"));
}

TEST_CASE("a trusted host's image is fetched with its bytes and type") {
  MediaServer server;
  absl::StatusOr<FetchedMedia> got = Get(Trusting(), server.Url("/cat.png"));
  REQUIRE(got.ok());
  CHECK(got->data == Png());
  CHECK(got->mime_type == "image/png");
  got = Get(Trusting(), server.Url("/untyped"));
  REQUIRE(got.ok());
  CHECK(got->data == Png());
  got = Get(Trusting(), server.Url("/to-cat"));  // one redirect, followed
  REQUIRE(got.ok());
  CHECK(got->data == Png());
  CHECK(Get(Trusting(), server.Url("/headers")).ok());
}

TEST_CASE("non-public addresses are refused unless trusted, also after a redirect") {
  MediaServer server;
  MediaFetchOptions o = Trusting();
  o.trusted_ranges.clear();
  CheckRefused(Get(o, server.Url("/cat.png")), "resolves to a loopback address");
  CheckRefused(Get(o, "http://[::1]:1/cat.png"), "resolves to a loopback address");
  CheckRefused(Get(o, "http://[::ffff:127.0.0.1]:1/x"), "resolves to a loopback address");
  CheckRefused(Get(o, "http://169.254.169.254/latest/meta-data/"), "a link-local address");
  CheckRefused(Get(o, "http://10.1.2.3/x.png"), "resolves to a private address");
  CheckRefused(Get(o, "http://localhost:1/x.png"), "names a local host name");
  CheckRefused(Get(o, "http://metadata.google.internal/x"), "names an internal host name");
  CheckRefused(Get(Trusting(), server.Url("/to-private")),
               "http://10.0.0.1/cat.png resolves to a private address");
  CheckRefused(Get(Trusting(), server.Url("/to-metadata")), "resolves to a link-local address");
  CheckRefused(Get(Trusting(), server.Url("/loop")), "redirects more than 3 times");
}

TEST_CASE("scheme and allow-list are checked before any connection") {
  MediaServer server;
  MediaFetchOptions o = Trusting();
  o.allow_http = false;
  CheckRefused(Get(o, server.Url("/cat.png")), "plain http://");
  o = Trusting();
  o.hosts = *MediaHostList::Parse("*.example.com,img.example.org");
  CheckRefused(Get(o, server.Url("/cat.png")), "is not on a host this server fetches media from");
  o.hosts = *MediaHostList::Parse("127.0.0.1");
  CHECK(Get(o, server.Url("/cat.png")).ok());
  CheckRefused(Get(o, "http://unresolvable.invalid/x"), "is not on a host");
}

TEST_CASE("oversized bodies are refused by Content-Length and while chunks arrive") {
  MediaServer server;
  CheckRefused(Get(Trusting(), server.Url("/big")), "is 5000 bytes; at most 4000");
  CheckRefused(Get(Trusting(), server.Url("/big-chunked")), "is larger than 4000 bytes");
}

TEST_CASE("bodies that are not images, oversized heads and compressed bodies are refused") {
  MediaServer server;
  CheckRefused(Get(Trusting(), server.Url("/page.html")),
               "has content type \"text/html\", not an image");
  CheckRefused(Get(Trusting(), server.Url("/fake.png")), "is not an image");
  CheckRefused(Get(Trusting(), server.Url("/nothing-here")), "answered HTTP 404");
  CheckRefused(Get(Trusting(), server.Url("/huge-head")), "sent response headers over 65536 bytes");
  CheckRefused(Get(Trusting(), server.Url("/gzip")), "is compressed (Content-Encoding: gzip)");
}

TEST_CASE("a slow body is refused at the timeout, and a cancel stops a fetch at once") {
  MediaServer server;
  MediaFetchOptions o = Trusting();
  o.timeout = absl::Milliseconds(400);
  const absl::Time start = absl::Now();
  absl::StatusOr<FetchedMedia> slow = Get(o, server.Url("/slow"));
  CHECK(absl::IsDeadlineExceeded(slow.status()));
  CHECK(slow.status().message() == server.Url("/slow") + " took longer than 400 ms to fetch");
  CHECK(absl::Now() - start < absl::Milliseconds(1500) * kSanitizerSlowdown);

  FetchCancel cancel;
  std::thread canceller([&cancel] {
    absl::SleepFor(absl::Milliseconds(200));
    cancel.Cancel();
  });
  const absl::Time t0 = absl::Now();
  absl::StatusOr<FetchedMedia> got = MediaFetcher(Trusting())
                                         .Fetch(server.Url("/slow"), MediaKind::kImage, 4000,
                                                absl::Now() + absl::Seconds(30), cancel);
  canceller.join();
  CHECK(absl::IsCancelled(got.status()));
  CHECK(absl::Now() - t0 < absl::Seconds(2) * kSanitizerSlowdown);
  // Once cancelled, a later fetch with it fails before connecting.
  CHECK(absl::IsCancelled(MediaFetcher(Trusting())
                              .Fetch(server.Url("/cat.png"), MediaKind::kImage, 4000,
                                     absl::Now() + absl::Seconds(5), cancel)
                              .status()));
}

bool MakeCertificates(const std::string& dir) {
  const std::string script = absl::StrCat(
      "set -e; cd ", dir,
      "; openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 2"
      " -subj /CN=mmserve-media-test-ca 2>/dev/null"
      "; openssl req -newkey rsa:2048 -nodes -keyout node.key -out node.csr -subj /CN=media"
      " 2>/dev/null"
      "; printf 'subjectAltName=IP:127.0.0.1\\nbasicConstraints=CA:FALSE\\n' > ext.cnf"
      "; openssl x509 -req -in node.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out node.pem"
      " -days 2 -extfile ext.cnf 2>/dev/null");
  return std::system(script.c_str()) == 0;
}

TEST_CASE("https verifies the server against the CA bundle given, else the system's") {
  signal(SIGPIPE, SIG_IGN);  // as in the router: TLS writes use write(2)
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = tmp != nullptr ? tmp : "/tmp";
  REQUIRE(MakeCertificates(dir));
  MediaServer server(std::make_unique<httplib::SSLServer>((dir + "/node.pem").c_str(),
                                                          (dir + "/node.key").c_str()));
  MediaFetchOptions o = Trusting();
  o.allow_http = false;
  o.ca_file = dir + "/ca.pem";
  absl::StatusOr<FetchedMedia> got = Get(o, server.Url("/cat.png", "https"));
  INFO(got.status());
  REQUIRE(got.ok());
  CHECK(got->data == Png());
  o.ca_file.clear();
  CheckRefused(Get(o, server.Url("/cat.png", "https")), "TLS certificate that does not verify");
}

TEST_CASE("responses an HTTP library would not send are read or refused by the reason") {
  const std::string png = Png();
  RawServer server({
      {"/interim-then-close",
       "HTTP/1.1 103 Early Hints\r\nLink: </a.css>\r\n\r\n"
       "HTTP/1.1 200 OK\r\nContent-Type: image/png\r\n\r\n" +
           png},
      {"/garbage", "SSH-2.0-OpenSSH_9.2\r\n\r\n"},
      {"/short", "HTTP/1.1 200 OK\r\nContent-Length: 500\r\n\r\n" + png},
      {"/bad-chunk", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"},
      {"/te-gzip", "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"},
      {"/two-lengths", "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n"},
      {"/close-too-long", "HTTP/1.1 200 OK\r\n\r\n" + std::string(5000, 'x')},
  });
  absl::StatusOr<FetchedMedia> got = Get(Trusting(), server.Url("/interim-then-close"));
  INFO(got.status());
  REQUIRE(got.ok());
  CHECK(got->data == png);
  CheckRefused(Get(Trusting(), server.Url("/garbage")), "sent a malformed response");
  CheckRefused(Get(Trusting(), server.Url("/short")), "ended the response early");
  CheckRefused(Get(Trusting(), server.Url("/bad-chunk")), "sent a malformed chunk");
  CheckRefused(Get(Trusting(), server.Url("/te-gzip")), "unsupported Transfer-Encoding");
  CheckRefused(Get(Trusting(), server.Url("/two-lengths")), "malformed Content-Length");
  CheckRefused(Get(Trusting(), server.Url("/close-too-long")), "is larger than 4000 bytes");
}

mmserve::v1::GenerateRequest ChatWith(const std::vector<std::string>& urls) {
  mmserve::v1::GenerateRequest r;
  auto* m = r.mutable_chat()->add_messages();
  m->set_role("user");
  m->add_content()->set_text("what is it?");
  for (const std::string& u : urls) m->add_content()->mutable_image()->set_url(u);
  m->add_content()->mutable_image()->set_data(Png());
  return r;
}

TEST_CASE("a request's URLs are fetched concurrently and replaced by their bytes") {
  MediaServer server;
  auto fetcher = std::make_shared<const MediaFetcher>(Trusting());
  RouterOptions limits;
  metrics::Registry registry;
  const MediaFetchMetrics counts(registry);
  const int fds = OpenFds();
  // Three slow images (7 pieces 100 ms apart each) take about as long as one.
  mmserve::v1::GenerateRequest r =
      ChatWith({server.Url("/slow"), server.Url("/slow"), server.Url("/slow")});
  REQUIRE(HasRemoteMedia(r));
  const absl::Time start = absl::Now();
  absl::Status s = FetchRequestMedia(fetcher, limits, &r, std::make_shared<FetchCancel>(),
                                     GrpcMediaField, &counts);
  INFO(s);
  REQUIRE(s.ok());
  CHECK(absl::Now() - start < absl::Milliseconds(1800) * kSanitizerSlowdown);
  CHECK_FALSE(HasRemoteMedia(r));
  for (int j = 1; j <= 4; ++j) {
    const auto& image = r.chat().messages(0).content(j).image();
    CHECK(image.source_case() == mmserve::v1::Image::kData);
    CHECK(image.data() == Png());
  }
  CHECK(r.chat().messages(0).content(1).image().mime_type() == "image/png");

  // The failing one is named by its field.
  r = ChatWith({server.Url("/cat.png"), server.Url("/page.html")});
  s = FetchRequestMedia(fetcher, limits, &r, std::make_shared<FetchCancel>(), OpenAiMediaField,
                        &counts);
  CHECK(absl::IsInvalidArgument(s));
  CHECK_THAT(std::string(s.message()),
             Catch::StartsWith("messages[0].content[2].image_url: " + server.Url("/page.html")));

  // A timeout names the URL still fetching.
  MediaFetchOptions quick = Trusting();
  quick.timeout = absl::Milliseconds(300);
  r = ChatWith({server.Url("/slow")});
  s = FetchRequestMedia(std::make_shared<const MediaFetcher>(quick), limits, &r,
                        std::make_shared<FetchCancel>(), GrpcMediaField, &counts);
  CHECK(absl::IsInvalidArgument(s));
  CHECK(s.message() == absl::StrCat("chat.messages[0].content[1].image.url: ", server.Url("/slow"),
                                    " took longer than 300 ms to fetch"));

  // A client that goes away ends the wait with CANCELLED.
  auto cancel = std::make_shared<FetchCancel>();
  r = ChatWith({server.Url("/slow")});
  std::thread canceller([cancel] {
    absl::SleepFor(absl::Milliseconds(150));
    cancel->Cancel();
  });
  s = FetchRequestMedia(fetcher, limits, &r, cancel, GrpcMediaField, &counts);
  canceller.join();
  CHECK(absl::IsCancelled(s));
  // One request of each ending counted, each fetch's time observed.
  r = ChatWith({"https://img.example.com/a.png"});
  CHECK_FALSE(FetchRequestMedia(nullptr, limits, &r, std::make_shared<FetchCancel>(),
                                GrpcMediaField, &counts)
                  .ok());
  CHECK(counts.fetched.value() == 1);
  CHECK(counts.refused.value() == 1);
  CHECK(counts.timed_out.value() == 1);
  CHECK(counts.cancelled.value() == 1);
  CHECK(counts.disabled.value() == 1);
  CHECK_THAT(registry.Render(), Catch::Contains("mmserve_router_media_fetch_seconds_count 4"));

  // Every socket is closed once the fetch threads end.
  const absl::Time until = absl::Now() + absl::Seconds(5);
  while (OpenFds() > fds && absl::Now() < until) absl::SleepFor(absl::Milliseconds(20));
  CHECK(OpenFds() <= fds);
}

TEST_CASE("URLs are refused when remote media is off, and inside frame lists") {
  RouterOptions limits;
  mmserve::v1::GenerateRequest r = ChatWith({"https://img.example.com/cat.png"});
  absl::Status s =
      FetchRequestMedia(nullptr, limits, &r, std::make_shared<FetchCancel>(), OpenAiMediaField);
  CHECK(s.message() ==
        "messages[0].content[1].image_url: remote media is disabled on this server; send a "
        "data: URL");
  s = FetchRequestMedia(std::make_shared<const MediaFetcher>(MediaFetchOptions()), limits, &r,
                        std::make_shared<FetchCancel>(), GrpcMediaField);
  CHECK(s.message() ==
        "chat.messages[0].content[1].image.url: remote media is disabled on this server; send a "
        "data: URL");
  mmserve::v1::GenerateRequest frames;
  frames.mutable_raw()->set_text("x");
  frames.mutable_raw()->add_videos()->mutable_frames()->add_frames()->set_url("https://x.com/a");
  REQUIRE(HasRemoteMedia(frames));
  s = FetchRequestMedia(std::make_shared<const MediaFetcher>(Trusting()), limits, &frames,
                        std::make_shared<FetchCancel>(), GrpcMediaField);
  CHECK(s.message() ==
        "raw.videos[0].frames.frames[0].url: video frames must carry their bytes, not a URL");
  // No URL: nothing to do, whatever the setting.
  mmserve::v1::GenerateRequest plain = ChatWith({});
  CHECK_FALSE(HasRemoteMedia(plain));
  CHECK(FetchRequestMedia(nullptr, limits, &plain, std::make_shared<FetchCancel>(), GrpcMediaField)
            .ok());
}

TEST_CASE("the OpenAI mapping keeps http(s) image_url and video_url parts as URLs to fetch") {
  const std::string body = R"({"messages": [{"role": "user", "content": [
      {"type": "image_url", "image_url": {"url": "https://img.example.com/cat.png"}},
      {"type": "image_url", "image_url": "HTTP://img.example.com/dog.png"},
      {"type": "video_url", "video_url": {"url": "https://v.example.com/a.mp4", "fps": 2}}]}]})";
  absl::StatusOr<OpenAiChatRequest> chat = ParseChatCompletionRequest(body, OpenAiLimits());
  REQUIRE(chat.ok());
  const auto& parts = chat->request.chat().messages(0).content();
  CHECK(parts[0].image().url() == "https://img.example.com/cat.png");
  CHECK(parts[0].image().data().empty());
  CHECK(parts[1].image().url() == "HTTP://img.example.com/dog.png");
  CHECK(parts[2].video().url() == "https://v.example.com/a.mp4");
  CHECK(parts[2].video().fps() == 2);
  CHECK(HasRemoteMedia(chat->request));
}

}  // namespace
}  // namespace mmserve::router
