// The router's OpenAI-compatible HTTP API on cpp-httplib: POST
// /v1/chat/completions (JSON or SSE stream) and GET /v1/models, mapped by
// openai.h onto the same GenerateCall path as gRPC Generate. Errors are
// OpenAI-shaped JSON with the matching HTTP status; a client that hangs up
// mid-stream cancels its call.
//
//   ASSIGN_OR_RETURN(auto http, HttpFrontend::Start(context, tracker, "127.0.0.1", 8000));
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

class HttpFrontend {
 public:
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<HttpFrontend>> Start(
      const RouterContext& context, CallTracker& tracker, const std::string& host, int port);
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
