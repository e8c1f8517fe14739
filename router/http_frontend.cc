#include "router/http_frontend.h"

#include <httplib.h>

#include <deque>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "router/openai.h"

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

void SendError(httplib::Response& res, const absl::Status& s) {
  res.status = HttpStatusFor(s.code());
  res.set_content(ErrorJson(s), "application/json");
}

std::chrono::system_clock::time_point Deadline(const RouterContext& context) {
  return std::chrono::system_clock::now() +
         absl::ToChronoNanoseconds(context.options.default_timeout);
}

// Waits for the whole answer and replies with one JSON object.
void ReplyChatCompletion(Relay& relay, const CompletionContext& cc, httplib::Response& res) {
  ChatCompletionBuilder reply(cc);
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

// Streams the answer as server-sent events; a client that hangs up cancels
// the call.
void StreamChatCompletion(std::shared_ptr<Relay> relay, std::shared_ptr<GenerateCall> call,
                          const CompletionContext& cc, httplib::Response& res) {
  // Wait for the first event so that an early error still gets its HTTP
  // status.
  {
    absl::MutexLock lock(&relay->mu);
    relay->mu.Await(absl::Condition(relay.get(), &Relay::Ready));
    if (relay->responses.empty() && relay->end && !relay->end->ok()) {
      return SendError(res, *relay->end);
    }
  }
  auto sse = std::make_shared<ChatCompletionStream>(cc);
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
          call->Cancel("the HTTP client hung up");
          return false;
        }
        if (done) sink.done();
        return true;
      },
      [call](bool success) {
        if (!success) call->Cancel("the HTTP client hung up");
      });
}

// POST /v1/chat/completions.
void HandleChatCompletion(const RouterContext& ctx, CallTracker& calls, const httplib::Request& req,
                          httplib::Response& res) {
  OpenAiLimits limits;
  limits.max_image_bytes = ctx.options.max_image_bytes;
  limits.max_images = ctx.options.max_images;
  limits.max_video_bytes = ctx.options.max_video_bytes;
  absl::StatusOr<OpenAiChatRequest> chat = ParseChatCompletionRequest(req.body, limits);
  if (!chat.ok()) return SendError(res, chat.status());
  CompletionContext cc{ctx.options.model_id, absl::ToUnixSeconds(absl::Now()),
                       chat->request.sampling().has_logprobs(), chat->include_usage};
  auto relay = std::make_shared<Relay>();
  auto call = StartTrackedCall(ctx, calls, chat->request, relay->Sink(relay), Deadline(ctx));
  if (!chat->stream) return ReplyChatCompletion(*relay, cc, res);
  StreamChatCompletion(std::move(relay), std::move(call), cc, res);
}

}  // namespace

absl::StatusOr<std::unique_ptr<HttpFrontend>> HttpFrontend::Start(const RouterContext& context,
                                                                  CallTracker& tracker,
                                                                  const std::string& host,
                                                                  int port) {
  std::unique_ptr<HttpFrontend> f(new HttpFrontend());
  f->server_ = std::make_unique<httplib::Server>();
  httplib::Server& srv = *f->server_;
  const RouterContext* ctx = &context;
  CallTracker* calls = &tracker;
  srv.Get("/v1/models", [ctx](const httplib::Request&, httplib::Response& res) {
    res.set_content(ModelsJson(DescribeModels(*ctx), absl::ToUnixSeconds(absl::Now())),
                    "application/json");
  });
  srv.Get("/health", [ctx](const httplib::Request&, httplib::Response& res) {
    const bool ok = !ctx->instances->Healthy(Role::kLanguage).empty() ||
                    (!ctx->instances->Healthy(Role::kPrefill).empty() &&
                     !ctx->instances->Healthy(Role::kDecode).empty());
    res.status = ok ? 200 : 503;
    res.set_content(ok ? "ok\n" : "no healthy language instance\n", "text/plain");
  });
  srv.Post("/v1/chat/completions",
           [ctx, calls](const httplib::Request& req, httplib::Response& res) {
             HandleChatCompletion(*ctx, *calls, req, res);
           });
  if (port == 0) {
    f->port_ = srv.bind_to_any_port(host);
  } else {
    f->port_ = srv.bind_to_port(host, port) ? port : -1;
  }
  if (f->port_ <= 0) {
    return absl::UnavailableError(absl::StrCat("HTTP: cannot listen on ", host, ":", port));
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
