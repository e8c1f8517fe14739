#include "router/media_http.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "router/media_fetch.h"

namespace mmserve::router {
namespace {

// The response head (status line, headers) and a chunked body's trailers.
constexpr size_t kMaxHeadBytes = 64 << 10;
// One chunk-size line.
constexpr size_t kMaxChunkLine = 1024;

absl::Status Bad(absl::string_view why) { return absl::InvalidArgumentError(why); }

// A connection to one address, plain or TLS, whose every wait ends at the
// deadline or when the FetchCancel shuts its socket down. Owns the socket.
class Connection {
 public:
  Connection(FetchCancel& cancel, absl::Time deadline) : cancel_(cancel), deadline_(deadline) {}
  ~Connection() {
    if (ssl_ != nullptr) SSL_free(ssl_);
    if (fd_ >= 0) {
      cancel_.Detach(fd_);
      ::close(fd_);
    }
  }
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  absl::Status Connect(const IpAddress& address, int port) {
    sockaddr_storage sa{};
    socklen_t len = 0;
    if (address.v6) {
      auto* in6 = reinterpret_cast<sockaddr_in6*>(&sa);
      in6->sin6_family = AF_INET6;
      in6->sin6_port = htons(static_cast<uint16_t>(port));
      std::memcpy(&in6->sin6_addr, address.bytes.data(), 16);
      len = sizeof(sockaddr_in6);
    } else {
      auto* in = reinterpret_cast<sockaddr_in*>(&sa);
      in->sin_family = AF_INET;
      in->sin_port = htons(static_cast<uint16_t>(port));
      std::memcpy(&in->sin_addr, address.bytes.data(), 4);
      len = sizeof(sockaddr_in);
    }
    fd_ = ::socket(sa.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd_ < 0) return absl::ResourceExhaustedError("no socket for the media fetch");
    int one = 1;
    ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (!cancel_.Attach(fd_)) return Stopped();
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&sa), len) != 0 && errno != EINPROGRESS) {
      return Bad("could not be reached");
    }
    RETURN_IF_ERROR(Wait(POLLOUT));
    int error = 0;
    socklen_t error_len = sizeof(error);
    ::getsockopt(fd_, SOL_SOCKET, SO_ERROR, &error, &error_len);
    if (error != 0) return cancel_.cancelled() ? Stopped() : Bad("could not be reached");
    return absl::OkStatus();
  }

  absl::Status StartTls(const MediaTls& tls, const MediaUrl& url) {
    if (tls.context() == nullptr) return absl::InternalError("the media TLS context did not load");
    ssl_ = SSL_new(tls.context());
    if (ssl_ == nullptr) return absl::InternalError("SSL_new failed");
    SSL_set_fd(ssl_, fd_);
    if (url.host_is_ip) {
      X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl_), url.host.c_str());
    } else {
      SSL_set_tlsext_host_name(ssl_, url.host.c_str());
      SSL_set1_host(ssl_, url.host.c_str());
    }
    for (;;) {
      ERR_clear_error();
      const int rc = SSL_connect(ssl_);
      if (rc == 1) break;
      const int e = SSL_get_error(ssl_, rc);
      if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
        RETURN_IF_ERROR(Wait(e == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT));
        continue;
      }
      if (cancel_.cancelled()) return Stopped();
      if (SSL_get_verify_result(ssl_) != X509_V_OK) {
        return Bad("presented a TLS certificate that does not verify for its host");
      }
      return Bad("failed the TLS handshake");
    }
    return absl::OkStatus();
  }

  absl::Status WriteAll(absl::string_view data) {
    while (!data.empty()) {
      ssize_t n;
      if (ssl_ != nullptr) {
        ERR_clear_error();
        const int rc = SSL_write(ssl_, data.data(), static_cast<int>(data.size()));
        if (rc <= 0) {
          RETURN_IF_ERROR(TlsWait(rc));
          continue;
        }
        n = rc;
      } else {
        n = ::send(fd_, data.data(), data.size(), MSG_NOSIGNAL);
        if (n < 0) {
          if (errno != EAGAIN && errno != EINTR) return Broken();
          RETURN_IF_ERROR(Wait(POLLOUT));
          continue;
        }
      }
      data.remove_prefix(static_cast<size_t>(n));
    }
    return absl::OkStatus();
  }

  // Appends what arrives to *out (at most `limit` bytes); 0 at the end of
  // the stream.
  absl::StatusOr<size_t> Read(std::string* out, size_t limit) {
    char buf[16 << 10];
    const size_t want = std::min(sizeof(buf), limit);
    for (;;) {
      ssize_t n;
      if (ssl_ != nullptr) {
        ERR_clear_error();
        const int rc = SSL_read(ssl_, buf, static_cast<int>(want));
        if (rc <= 0) {
          if (SSL_get_error(ssl_, rc) == SSL_ERROR_ZERO_RETURN) {
            if (cancel_.cancelled()) return Stopped();
            return 0;
          }
          RETURN_IF_ERROR(TlsWait(rc));
          continue;
        }
        n = rc;
      } else {
        n = ::recv(fd_, buf, want, 0);
        if (n < 0) {
          if (errno != EAGAIN && errno != EINTR) return Broken();
          RETURN_IF_ERROR(Wait(POLLIN));
          continue;
        }
        if (n == 0 && cancel_.cancelled()) return Stopped();
      }
      out->append(buf, static_cast<size_t>(n));
      return static_cast<size_t>(n);
    }
  }

 private:
  absl::Status Stopped() const { return absl::CancelledError("the media fetch was cancelled"); }
  absl::Status Broken() const {
    return cancel_.cancelled() ? Stopped() : Bad("broke the connection");
  }

  // Waits until the socket is ready for `events`, the deadline or a cancel.
  absl::Status Wait(short events) {
    for (;;) {
      const int64_t ms = absl::ToInt64Milliseconds(deadline_ - absl::Now());
      if (ms <= 0) return absl::DeadlineExceededError("the media fetch timed out");
      pollfd p{fd_, events, 0};
      const int rc = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(ms + 1, 1 << 30)));
      if (cancel_.cancelled()) return Stopped();
      if (rc > 0) return absl::OkStatus();
      if (rc < 0 && errno != EINTR) return Broken();
    }
  }

  // After a failed SSL_read / SSL_write: wait for what TLS needs, or fail.
  absl::Status TlsWait(int rc) {
    const int e = SSL_get_error(ssl_, rc);
    if (e == SSL_ERROR_WANT_READ) return Wait(POLLIN);
    if (e == SSL_ERROR_WANT_WRITE) return Wait(POLLOUT);
    return Broken();
  }

  FetchCancel& cancel_;
  const absl::Time deadline_;
  int fd_ = -1;
  SSL* ssl_ = nullptr;
};

// Bytes read and not yet consumed, over a Connection.
class Reader {
 public:
  explicit Reader(Connection& c) : c_(c) {}
  // Ensures `delimiter` is buffered within `max` bytes from the start;
  // returns its offset.
  absl::StatusOr<size_t> Until(absl::string_view delimiter, size_t max, absl::string_view what) {
    for (;;) {
      const size_t at = absl::string_view(buf_).find(delimiter, pos_);
      if (at != std::string::npos && at + delimiter.size() - pos_ <= max) return at;
      if (buf_.size() - pos_ > max)
        return Bad(absl::StrCat("sent ", what, " over ", max, " bytes"));
      ASSIGN_OR_RETURN(size_t n, c_.Read(&buf_, max + delimiter.size()));
      if (n == 0) return Bad("ended the response early");
    }
  }
  // Moves up to `n` buffered-or-read bytes to *out; 0 at the end of the stream.
  absl::StatusOr<size_t> Take(size_t n, std::string* out) {
    if (pos_ == buf_.size()) {
      buf_.clear();
      pos_ = 0;
      ASSIGN_OR_RETURN(size_t got, c_.Read(&buf_, n));
      if (got == 0) return 0;
    }
    const size_t k = std::min(n, buf_.size() - pos_);
    out->append(buf_, pos_, k);
    pos_ += k;
    return k;
  }
  std::string Consume(size_t end, size_t skip) {
    std::string s = buf_.substr(pos_, end - pos_);
    pos_ = end + skip;
    return s;
  }

 private:
  Connection& c_;
  std::string buf_;
  size_t pos_ = 0;
};

absl::StatusOr<HttpHead> ParseHead(absl::string_view head, bool* chunked) {
  std::vector<absl::string_view> lines = absl::StrSplit(head, "\r\n");
  HttpHead h;
  const std::vector<absl::string_view> status = absl::StrSplit(lines[0], absl::MaxSplits(' ', 2));
  if (status.size() < 2 || !absl::StartsWith(status[0], "HTTP/1.") ||
      !absl::SimpleAtoi(status[1], &h.status) || h.status < 100 || h.status > 999) {
    return Bad("sent a malformed response");
  }
  *chunked = false;
  for (size_t i = 1; i < lines.size(); ++i) {
    const size_t colon = lines[i].find(':');
    if (colon == absl::string_view::npos) return Bad("sent a malformed response header");
    const std::string name = absl::AsciiStrToLower(lines[i].substr(0, colon));
    const absl::string_view value = absl::StripAsciiWhitespace(lines[i].substr(colon + 1));
    if (name == "content-type") {
      h.content_type = std::string(value);
    } else if (name == "location") {
      h.location = std::string(value);
    } else if (name == "content-length") {
      int64_t n = -1;
      if (!absl::SimpleAtoi(value, &n) || n < 0 ||
          (h.content_length >= 0 && n != h.content_length)) {
        return Bad("sent a malformed Content-Length");
      }
      h.content_length = n;
    } else if (name == "transfer-encoding") {
      if (!absl::EqualsIgnoreCase(value, "chunked")) {
        return Bad(absl::StrCat("uses an unsupported Transfer-Encoding (", value, ")"));
      }
      *chunked = true;
    } else if (name == "content-encoding" && !absl::EqualsIgnoreCase(value, "identity")) {
      return Bad(absl::StrCat("is compressed (Content-Encoding: ", value, ")"));
    }
  }
  if (*chunked) h.content_length = -1;
  return h;
}

absl::Status TooLarge(size_t max) { return Bad(absl::StrCat("is larger than ", max, " bytes")); }

absl::Status ReadChunked(Reader& r, size_t max, std::string* body) {
  for (;;) {
    ASSIGN_OR_RETURN(size_t end, r.Until("\r\n", kMaxChunkLine, "a chunk header"));
    std::string line = r.Consume(end, 2);
    line = line.substr(0, line.find(';'));
    uint64_t size = 0;
    if (line.empty() || !absl::SimpleHexAtoi(absl::StripAsciiWhitespace(line), &size)) {
      return Bad("sent a malformed chunk");
    }
    if (size == 0) break;
    if (body->size() + size > max) return TooLarge(max);
    for (uint64_t left = size; left > 0;) {
      ASSIGN_OR_RETURN(size_t n, r.Take(left, body));
      if (n == 0) return Bad("ended the response early");
      left -= n;
    }
    ASSIGN_OR_RETURN(size_t crlf, r.Until("\r\n", kMaxChunkLine, "a chunk"));
    if (!r.Consume(crlf, 2).empty()) return Bad("sent a malformed chunk");
  }
  // Trailers, up to the blank line.
  for (size_t total = 0;;) {
    ASSIGN_OR_RETURN(size_t end, r.Until("\r\n", kMaxHeadBytes - total, "trailers"));
    const std::string line = r.Consume(end, 2);
    if (line.empty()) return absl::OkStatus();
    total += line.size() + 2;
  }
}

absl::Status ReadBody(Reader& r, const HttpHead& head, bool chunked, size_t max,
                      std::string* body) {
  if (chunked) return ReadChunked(r, max, body);
  if (head.content_length >= 0) {
    if (static_cast<uint64_t>(head.content_length) > max) return TooLarge(max);
    for (size_t left = static_cast<size_t>(head.content_length); left > 0;) {
      ASSIGN_OR_RETURN(size_t n, r.Take(left, body));
      if (n == 0) return Bad("ended the response early");
      left -= n;
    }
    return absl::OkStatus();
  }
  for (;;) {  // until the server closes
    ASSIGN_OR_RETURN(size_t n, r.Take(max + 1 - body->size(), body));
    if (n == 0) return absl::OkStatus();
    if (body->size() > max) return TooLarge(max);
  }
}

}  // namespace

MediaTls::MediaTls(const std::string& ca_file) {
  ctx_ = SSL_CTX_new(TLS_client_method());
  if (ctx_ == nullptr) return;
  SSL_CTX_set_min_proto_version(ctx_, TLS1_2_VERSION);
  SSL_CTX_set_verify(ctx_, SSL_VERIFY_PEER, nullptr);
  // A server that closes without close_notify ends a body sent until close
  // (as HTTP clients commonly accept); lengths and formats are checked.
  SSL_CTX_set_options(ctx_, SSL_OP_IGNORE_UNEXPECTED_EOF);
  const int loaded = ca_file.empty()
                         ? SSL_CTX_set_default_verify_paths(ctx_)
                         : SSL_CTX_load_verify_locations(ctx_, ca_file.c_str(), nullptr);
  if (loaded != 1) {
    SSL_CTX_free(ctx_);
    ctx_ = nullptr;
  }
}

MediaTls::~MediaTls() {
  if (ctx_ != nullptr) SSL_CTX_free(ctx_);
}

absl::StatusOr<HttpResult> HttpGet(const HttpGetRequest& request,
                                   const std::function<absl::Status(const HttpHead&)>& check_head) {
  const MediaUrl& url = *request.url;
  Connection c(*request.cancel, request.deadline);
  RETURN_IF_ERROR(c.Connect(request.address, url.port));
  if (url.https) RETURN_IF_ERROR(c.StartTls(*request.tls, url));
  RETURN_IF_ERROR(c.WriteAll(absl::StrCat(
      "GET ", url.target, " HTTP/1.1\r\nHost: ", url.HostHeader(), "\r\nAccept: ", request.accept,
      "\r\nAccept-Encoding: identity\r\n"
      "User-Agent: mmserve-media-fetch\r\n"
      "Connection: close\r\n\r\n")));
  Reader r(c);
  bool chunked = false;
  HttpResult result;
  // Interim responses (100 Continue, 103 Early Hints) come before the final one.
  for (int interim = 0;; ++interim) {
    ASSIGN_OR_RETURN(size_t end, r.Until("\r\n\r\n", kMaxHeadBytes, "response headers"));
    ASSIGN_OR_RETURN(result.head, ParseHead(r.Consume(end, 4), &chunked));
    if (result.head.status >= 200 || result.head.status == 101) break;
    if (interim == 8) return Bad("sent too many interim responses");
  }
  RETURN_IF_ERROR(check_head(result.head));
  if (result.head.status != 200) return result;
  RETURN_IF_ERROR(ReadBody(r, result.head, chunked, request.max_body, &result.body));
  return result;
}

}  // namespace mmserve::router
