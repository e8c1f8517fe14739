#include "router/http_frontend.h"

#include <httplib.h>
#include <sys/socket.h>

#include <algorithm>
#include <deque>
#include <memory>
#include <optional>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "router/input_limits.h"
#include "router/openai.h"
#include "router/openai_completions.h"
#include "router/public_error.h"
#include "router/request_fetch.h"
#include "router/tool_request.h"

namespace mmserve::router {
namespace {

// A call's output, handed from gRPC threads to the HTTP handler thread.
struct Relay {
  absl::Mutex mu;
  std::deque<mmserve::v1::GenerateResponse> responses ABSL_GUARDED_BY(mu);
  std::optional<absl::Status> end ABSL_GUARDED_BY(mu);

  CallSink Sink(std::shared_ptr<Relay> self) {
    return {.on_response =
                [self](mmserve::v1::GenerateResponse r) {
                  absl::MutexLock lock(&self->mu);
                  self->responses.push_back(std::move(r));
                },
            .on_end =
                [self](absl::Status s) {
                  absl::MutexLock lock(&self->mu);
                  self->end = std::move(s);
                }};
  }
  bool Ready() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return !responses.empty() || end; }
};

// `s` is a public status: a client error's reason, or a generic failure
// carrying the request id (public_error.h).
void SendError(httplib::Response& res, const absl::Status& s) {
  res.status = HttpStatusFor(s.code());
  if (IsRetryable(s.code())) res.set_header("Retry-After", std::to_string(kRetryAfterSeconds));
  if (const std::string id = RequestIdOf(s); !id.empty()) res.set_header(kRequestIdHeader, id);
  res.set_content(ErrorJson(s), "application/json");
}

void SendHttpError(httplib::Response& res, int status, absl::string_view code,
                   absl::string_view message) {
  res.status = status;
  res.set_content(HttpErrorJson(status, code, message), "application/json");
}

// application/json, with or without parameters (charset); a request without
// a Content-Type is taken as JSON.
bool IsJsonContentType(const httplib::Request& req) {
  if (!req.has_header("Content-Type")) return true;
  std::string type = req.get_header_value("Content-Type");
  type = std::string(absl::StripAsciiWhitespace(type.substr(0, type.find(';'))));
  return absl::EqualsIgnoreCase(type, "application/json");
}

std::chrono::system_clock::time_point Deadline(const RouterContext& context) {
  return std::chrono::system_clock::now() +
         absl::ToChronoNanoseconds(context.options.default_timeout);
}

// Waits for the whole answer and replies with one JSON object (a
// ChatCompletionBuilder or TextCompletionBuilder).
template <typename Builder>
void ReplyWhole(Relay& relay, Builder reply, httplib::Response& res) {
  absl::MutexLock lock(&relay.mu);
  for (;;) {
    relay.mu.Await(absl::Condition(&relay, &Relay::Ready));
    while (!relay.responses.empty()) {
      reply.Add(relay.responses.front());
      relay.responses.pop_front();
    }
    if (relay.end) break;
  }
  if (!relay.end->ok()) return SendError(res, *relay.end);
  res.set_content(reply.Json(), "application/json");
}

// Streams the answer as server-sent events (a ChatCompletionStream or
// TextCompletionStream); a client that hangs up cancels the call.
template <typename Stream>
void StreamEvents(std::shared_ptr<Relay> relay, CallCancel call, std::shared_ptr<Stream> sse,
                  httplib::Response& res) {
  // Wait for the first event so that an early error still gets its HTTP
  // status.
  {
    absl::MutexLock lock(&relay->mu);
    relay->mu.Await(absl::Condition(relay.get(), &Relay::Ready));
    if (relay->responses.empty() && relay->end && !relay->end->ok()) {
      return SendError(res, *relay->end);
    }
  }
  res.set_chunked_content_provider(
      "text/event-stream",
      [relay, sse, call](size_t, httplib::DataSink& sink) {
        std::string out;
        bool done = false;
        {
          absl::MutexLock lock(&relay->mu);
          relay->mu.Await(absl::Condition(relay.get(), &Relay::Ready));
          while (!relay->responses.empty()) {
            out += sse->OnResponse(relay->responses.front());
            relay->responses.pop_front();
          }
          if (relay->end) {
            if (!relay->end->ok() && !sse->done()) out += sse->OnError(*relay->end);
            done = true;
          }
        }
        if (!out.empty() && !sink.write(out.data(), out.size())) {
          call("the HTTP client hung up");
          return false;
        }
        if (done) sink.done();
        return true;
      },
      [call](bool success) {
        if (!success) call("the HTTP client hung up");
      });
}

// POST /v1/chat/completions.
// The body, read as it arrives; INVALID_ARGUMENT as soon as its text alone
// cannot fit the context (the rest is never read).
absl::StatusOr<std::string> ReadBody(const RouterContext& ctx,
                                     const httplib::ContentReader& content_reader) {
  std::string body;
  JsonTextScanner scanner;
  const size_t max_text = ctx.options.max_prompt_bytes;
  bool too_long = false;
  content_reader([&](const char* data, size_t length) {
    if (too_long) return true;  // drained unread, so the client gets the answer
    body.append(data, length);
    if (max_text == 0) return true;
    scanner.Add(absl::string_view(data, length));
    too_long = scanner.lower_bound() > max_text;
    if (too_long) body.clear();
    return true;
  });
  if (!too_long) return body;
  return absl::InvalidArgumentError(absl::StrCat("the request's text has more than ", max_text,
                                                 " bytes; no such prompt fits the ",
                                                 ctx.options.max_model_len, "-token context"));
}

// What every OpenAI POST does first: a JSON body, read, and the client
// admitted. Null when `res` already holds the refusal.
struct Admitted {
  std::string body;
  PublicAccess::Lease lease;
  OpenAiLimits limits;
};

std::optional<Admitted> Admit(const RouterContext& ctx, const httplib::Request& req,
                              const httplib::ContentReader& content_reader,
                              httplib::Response& res) {
  if (!IsJsonContentType(req)) {
    SendHttpError(res, 415, "unsupported_media_type",
                  "the request body must be JSON (Content-Type: application/json)");
    return std::nullopt;
  }
  absl::StatusOr<std::string> body = ReadBody(ctx, content_reader);
  if (!body.ok()) {
    SendError(res, body.status());
    return std::nullopt;
  }
  Admitted a;
  a.body = *std::move(body);
  if (ctx.access != nullptr) {
    const std::string authorization = req.get_header_value("Authorization");
    auto admitted = ctx.access->Admit(ctx.access->ClientOf(authorization, req.remote_addr));
    if (!admitted.ok()) {
      SendError(res, admitted.status());
      return std::nullopt;
    }
    a.lease = *std::move(admitted);
  }
  a.limits.max_image_bytes = ctx.options.max_image_bytes;
  a.limits.max_images = ctx.options.max_images;
  a.limits.max_video_bytes = ctx.options.max_video_bytes;
  return a;
}

// Starts the call (the lease held until it ends) and replies: whole with
// Builder, or as SSE with Stream.
template <typename Builder, typename Stream>
void RunCall(const RouterContext& ctx, CallTracker& calls, Admitted admitted,
             const mmserve::v1::GenerateRequest& request, bool stream, Builder builder,
             std::shared_ptr<Stream> sse, httplib::Response& res) {
  auto relay = std::make_shared<Relay>();
  CallSink sink = relay->Sink(relay);
  sink.on_end = [lease = std::move(admitted.lease),
                 on_end = std::move(sink.on_end)](absl::Status s) mutable {
    lease.reset();
    on_end(std::move(s));
  };
  StartedCall call = StartTrackedCall(ctx, calls, request, std::move(sink), Deadline(ctx));
  res.set_header(kRequestIdHeader, call.id);
  if (!stream) return ReplyWhole(*relay, std::move(builder), res);
  StreamEvents(std::move(relay), std::move(call.cancel), std::move(sse), res);
}

void HandleChatCompletion(const RouterContext& ctx, CallTracker& calls, const httplib::Request& req,
                          const httplib::ContentReader& content_reader, httplib::Response& res) {
  std::optional<Admitted> admitted = Admit(ctx, req, content_reader, res);
  if (!admitted) return;
  absl::StatusOr<OpenAiChatRequest> chat =
      ParseChatCompletionRequest(admitted->body, admitted->limits);
  if (!chat.ok()) return SendError(res, chat.status());
  // Remote media is fetched here, on this handler's own thread (it blocks
  // until the fetch ends or times out).
  if (HasRemoteMedia(chat->request)) {
    absl::Status fetched =
        FetchRequestMedia(ctx.media, ctx.options, &chat->request, std::make_shared<FetchCancel>(),
                          OpenAiMediaField, ctx.media_metrics);
    if (!fetched.ok()) return SendError(res, fetched);
  }
  CompletionContext cc{ctx.options.model_id,
                       absl::ToUnixSeconds(absl::Now()),
                       chat->request.sampling().has_logprobs(),
                       chat->include_usage,
                       std::max<uint32_t>(chat->request.n(), 1),
                       ToolCallsParsed(chat->request)};
  RunCall(ctx, calls, *std::move(admitted), chat->request, chat->stream, ChatCompletionBuilder(cc),
          std::make_shared<ChatCompletionStream>(cc), res);
}

// POST /v1/completions.
void HandleCompletion(const RouterContext& ctx, CallTracker& calls, const httplib::Request& req,
                      const httplib::ContentReader& content_reader, httplib::Response& res) {
  std::optional<Admitted> admitted = Admit(ctx, req, content_reader, res);
  if (!admitted) return;
  absl::StatusOr<OpenAiCompletionRequest> c =
      ParseCompletionRequest(admitted->body, admitted->limits);
  if (!c.ok()) return SendError(res, c.status());
  CompletionContext cc{ctx.options.model_id, absl::ToUnixSeconds(absl::Now()),
                       c->request.sampling().has_logprobs(), c->include_usage,
                       std::max<uint32_t>(c->request.n(), 1)};
  RunCall(ctx, calls, *std::move(admitted), c->request, c->stream,
          TextCompletionBuilder(cc, c->echo), std::make_shared<TextCompletionStream>(cc, c->echo),
          res);
}

// The paths served and their methods; any other method on them gets 405.
constexpr std::pair<const char*, const char*> kRoutes[] = {{"/v1/chat/completions", "POST"},
                                                           {"/v1/completions", "POST"},
                                                           {"/v1/models", "GET"},
                                                           {"/health", "GET"}};

void AddRoutes(httplib::Server& srv, const RouterContext* ctx, CallTracker* calls) {
  srv.Get("/v1/models", [ctx](const httplib::Request&, httplib::Response& res) {
    res.set_content(ModelsJson(DescribeModels(*ctx), absl::ToUnixSeconds(absl::Now())),
                    "application/json");
  });
  srv.Get("/health", [ctx](const httplib::Request&, httplib::Response& res) {
    const bool ok = !ctx->instances->Healthy(Role::kLanguage).empty() ||
                    !ctx->instances->Healthy(Role::kElastic).empty() ||
                    (!ctx->instances->Healthy(Role::kPrefill).empty() &&
                     !ctx->instances->Healthy(Role::kDecode).empty());
    res.status = ok ? 200 : 503;
    res.set_content(ok ? "ok\n" : "no healthy language instance\n", "text/plain");
  });
  srv.Post("/v1/chat/completions", [ctx, calls](const httplib::Request& req, httplib::Response& res,
                                                const httplib::ContentReader& content_reader) {
    HandleChatCompletion(*ctx, *calls, req, content_reader, res);
  });
  srv.Post("/v1/completions", [ctx, calls](const httplib::Request& req, httplib::Response& res,
                                           const httplib::ContentReader& content_reader) {
    HandleCompletion(*ctx, *calls, req, content_reader, res);
  });
  for (const auto& [path, allowed] : kRoutes) {
    auto refuse = [path = path, allowed = allowed](const httplib::Request& req,
                                                   httplib::Response& res) {
      res.set_header("Allow", allowed);
      SendHttpError(res, 405, "method_not_allowed",
                    absl::StrCat(req.method, " is not allowed on ", path, "; use ", allowed));
    };
    if (std::string(allowed) != "GET") srv.Get(path, refuse);
    if (std::string(allowed) != "POST") srv.Post(path, refuse);
    srv.Put(path, refuse);
    srv.Patch(path, refuse);
    srv.Delete(path, refuse);
  }
}

// API keys before routing (so that unknown paths also need one), then
// OpenAI-shaped bodies for httplib's own refusals (404, 413, 400).
void AddGuards(httplib::Server& srv, const RouterContext* ctx, const HttpFrontendOptions& options) {
  const bool open_health = options.open_health;
  const size_t max_body = options.max_body_bytes;
  srv.set_pre_routing_handler([ctx, open_health, max_body](const httplib::Request& req,
                                                           httplib::Response& res) {
    // A body announced too long is refused before a byte of it is read, and
    // the connection closes (its unread body is never parsed).
    uint64_t length = 0;
    if (absl::SimpleAtoi(req.get_header_value("Content-Length"), &length) && length > max_body) {
      SendHttpError(res, 413, "request_too_large",
                    absl::StrCat("the request body exceeds ", max_body, " bytes"));
      return httplib::Server::HandlerResponse::Handled;
    }
    if (ctx->access == nullptr || (open_health && req.path == "/health")) {
      return httplib::Server::HandlerResponse::Unhandled;
    }
    absl::Status s = ctx->access->Authenticate(req.get_header_value("Authorization"));
    if (s.ok()) return httplib::Server::HandlerResponse::Unhandled;
    res.set_header("WWW-Authenticate", "Bearer");
    SendError(res, s);
    return httplib::Server::HandlerResponse::Handled;
  });
  srv.set_payload_max_length(max_body);
  // One request per connection: httplib closes every connection after its
  // response (and says so in a Connection: close header), so a refusal whose
  // body was left unread never leaves that body to be parsed as a request.
  srv.set_keep_alive_max_count(1);
  srv.set_error_handler(httplib::Server::HandlerWithResponse(
      [max_body](const httplib::Request& req, httplib::Response& res) {
        if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
        if (res.status == 404) {
          SendHttpError(res, 404, "not_found",
                        absl::StrCat("no route for ", req.method, " ", req.path));
        } else if (res.status == 413) {
          SendHttpError(res, 413, "request_too_large",
                        absl::StrCat("the request body exceeds ", max_body, " bytes"));
        } else {
          SendHttpError(res, res.status, "invalid_request", "the HTTP request was refused");
        }
        return httplib::Server::HandlerResponse::Handled;
      }));
}

}  // namespace

absl::StatusOr<std::unique_ptr<HttpFrontend>> HttpFrontend::Start(
    const RouterContext& context, CallTracker& tracker, const HttpFrontendOptions& options) {
  std::unique_ptr<HttpFrontend> f(new HttpFrontend());
  if (!options.tls_cert_file.empty()) {
    auto ssl = std::make_unique<httplib::SSLServer>(options.tls_cert_file.c_str(),
                                                    options.tls_key_file.c_str());
    if (!ssl->is_valid()) return absl::InvalidArgumentError("HTTPS: cannot load the certificate");
    f->server_ = std::move(ssl);
  } else {
    f->server_ = std::make_unique<httplib::Server>();
  }
  httplib::Server& srv = *f->server_;
  // httplib's default pool is max(8, cores - 1) threads: on a small host,
  // eight long streams would leave every later request waiting unseen.
  const size_t threads = static_cast<size_t>(std::max(1, options.threads));
  srv.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  // httplib (0.11) listens with a backlog of 5: a burst of clients
  // overflows it, the kernel falls back to SYN cookies and some of those
  // connections end unread ("Read" at the client). The socket-options hook
  // sees the listening socket; once bound, listen() again with the
  // system's largest backlog (Linux takes a new backlog on a listening
  // socket).
  int listen_fd = -1;
  srv.set_socket_options([&listen_fd](socket_t sock) {
    httplib::default_socket_options(sock);
    listen_fd = sock;
  });
  AddRoutes(srv, &context, &tracker);
  AddGuards(srv, &context, options);
  if (options.port == 0) {
    f->port_ = srv.bind_to_any_port(options.host);
  } else {
    f->port_ = srv.bind_to_port(options.host, options.port) ? options.port : -1;
  }
  if (f->port_ <= 0) {
    return absl::UnavailableError(
        absl::StrCat("HTTP: cannot listen on ", options.host, ":", options.port));
  }
  srv.set_socket_options(httplib::default_socket_options);  // listen_fd goes out of scope
  if (listen_fd < 0 || ::listen(listen_fd, SOMAXCONN) != 0) {
    return absl::InternalError("HTTP: cannot raise the listen backlog");
  }
  f->thread_ = std::thread([s = f->server_.get()] { s->listen_after_bind(); });
  return f;
}

HttpFrontend::~HttpFrontend() { Stop(); }

void HttpFrontend::Stop() {
  if (server_) server_->stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace mmserve::router
