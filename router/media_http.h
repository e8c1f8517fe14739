// One HTTP/1.1 GET for the media fetch, over a connection made here to
// exactly one address (never a DNS lookup), plain or TLS (the server's
// certificate verified for the URL's host, SNI set). Every wait is bounded
// by the deadline, the response head and chunk framing are capped, the
// body is capped at max_body while it arrives, and a FetchCancel shuts the
// connection down from any thread. Redirects are returned, not followed.
// (A client of its own over OpenSSL rather than cpp-httplib's: that one
// (0.11) bounds neither the response head nor the whole transfer, and can
// only be stopped safely once connected; libcurl would add a package and,
// for static builds, its whole dependency tree.)
//
//   MediaTls tls(options.ca_file);  // once; shared by every fetch
//   ASSIGN_OR_RETURN(HttpResult r, HttpGet({.url = &url, .address = a, ...}, check_head));
//
// Errors are INVALID_ARGUMENT with a reason to follow the URL ("could not
// be reached", "sent a malformed response"), CANCELLED when cancelled and
// DEADLINE_EXCEEDED past the deadline. Thread-safe (MediaTls too). TLS
// writes go through write(2): the process must ignore SIGPIPE, as the
// router does (common/grpc_server.cc).
#ifndef MMSERVE_ROUTER_MEDIA_HTTP_H_
#define MMSERVE_ROUTER_MEDIA_HTTP_H_

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "router/media_address.h"
#include "router/media_url.h"

typedef struct ssl_ctx_st SSL_CTX;

namespace mmserve::router {

class FetchCancel;

// The TLS client context of the media fetch: peers verified against
// `ca_file` (PEM) or, when empty, the system's CAs; TLS 1.2 at least.
class MediaTls {
 public:
  explicit MediaTls(const std::string& ca_file);
  ~MediaTls();
  MediaTls(const MediaTls&) = delete;
  MediaTls& operator=(const MediaTls&) = delete;
  // Null when the context or its CAs could not be loaded.
  SSL_CTX* context() const { return ctx_; }

 private:
  SSL_CTX* ctx_ = nullptr;
};

// The status line and the headers the fetch looks at.
struct HttpHead {
  int status = 0;
  std::string content_type;     // as sent
  std::string location;         // redirects
  int64_t content_length = -1;  // -1: none (chunked or until close)
};

struct HttpResult {
  HttpHead head;
  std::string body;  // read only for a 200 that the head check passed
};

struct HttpGetRequest {
  const MediaUrl* url = nullptr;
  IpAddress address;              // connect here; url->host names it for Host and TLS
  const MediaTls* tls = nullptr;  // https
  std::string accept;             // the Accept header
  size_t max_body = 0;
  absl::Time deadline;
  FetchCancel* cancel = nullptr;
};

// The response head is checked by `check_head` before any body is read (a
// non-OK status stops the transfer with it); only a 200's body is read.
[[nodiscard]] absl::StatusOr<HttpResult> HttpGet(
    const HttpGetRequest& request, const std::function<absl::Status(const HttpHead&)>& check_head);

}  // namespace mmserve::router

#endif  // MMSERVE_ROUTER_MEDIA_HTTP_H_
