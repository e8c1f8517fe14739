// The router's OpenAI-compatible HTTP API on cpp-httplib: POST
// /v1/chat/completions (JSON or SSE stream) and GET /v1/models, mapped by
// openai.h onto the same GenerateCall path as gRPC Generate, and GET /health.
// Errors are OpenAI-shaped JSON with the matching HTTP status, also for the
// refusals before any work: 401 (context.access wants a key), 404 (unknown
// path), 405 (known path, wrong method), 413 (body over max_body_bytes), 415
// (a Content-Type other than application/json), 429 with Retry-After (the
// client's concurrent calls at the cap), 400 for a body whose text alone
// cannot fit the context (router/input_limits.h, checked before parsing). A
// client that hangs up mid-stream cancels its call. http(s) image_url and
// video_url parts are fetched on the handler's thread before the call
// starts (router/request_fetch.h), within --media_fetch_timeout_ms.
//
//   ASSIGN_OR_RETURN(auto http, HttpFrontend::Start(context, tracker,
//                                                   {.host = "127.0.0.1", .port = 8000}));
//
// Thread-safe; Stop (or the destructor) waits for the server thread.
#ifndef MMSERVE_ROUTER_HTTP_FRONTEND_H_
#define MMSERVE_ROUTER_HTTP_FRONTEND_H_

#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "router/generate_call.h"
#include "router/router_service.h"

namespace httplib {
class Server;
}

namespace mmserve::router {

struct HttpFrontendOptions {
  std::string host = "127.0.0.1";
  int port = 0;  // 0: pick one
  size_t max_body_bytes = size_t{64} << 20;
  // GET /health without an API key.
  bool open_health = true;
  // PEM files: HTTPS instead of HTTP when both are set.
  std::string tls_cert_file;
  std::string tls_key_file;
  // Requests served at once: each holds one thread for its whole response
  // (a stream for as long as it generates); the rest wait for a thread.
  int threads = 256;
};

class HttpFrontend {
 public:
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<HttpFrontend>> Start(
      const RouterContext& context, CallTracker& tracker, const HttpFrontendOptions& options);
  ~HttpFrontend();
  int port() const { return port_; }
  void Stop();

 private:
  HttpFrontend() = default;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  int port_ = 0;
};

}  // namespace mmserve::router

#endif  // MMSERVE_ROUTER_HTTP_FRONTEND_H_
