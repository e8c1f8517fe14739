#include "bench/loadgen/target.h"

#include <grpcpp/grpcpp.h>
#include <httplib.h>

#include <atomic>
#include <chrono>
#include <nlohmann/json.hpp>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "bench/loadgen/encoder_target.h"
#include "common/grpc_server.h"
#include "common/grpc_status.h"
#include "proto/inference.grpc.pb.h"
#include "proto/language.grpc.pb.h"

namespace mmserve::loadgen {
namespace {

absl::Status WaitConnected(grpc::Channel& channel, const std::string& address,
                           absl::Duration timeout) {
  if (channel.WaitForConnected(std::chrono::system_clock::now() +
                               absl::ToChronoNanoseconds(timeout))) {
    return absl::OkStatus();
  }
  return absl::UnavailableError(
      absl::StrCat("no connection to ", address, " within ", absl::FormatDuration(timeout)));
}

// One server-streaming call: GenerateResponse and TokenBatch both carry
// token_ids and text. Deletes itself when done.
template <typename Request, typename Response>
class StreamCall final : public grpc::ClientReadReactor<Response> {
 public:
  using Starter =
      std::function<void(grpc::ClientContext*, const Request*, grpc::ClientReadReactor<Response>*)>;

  StreamCall(Request request, Record* record, const Stopwatch* clock, absl::Duration timeout,
             std::function<void()> done)
      : request_(std::move(request)), record_(record), clock_(clock), done_(std::move(done)) {
    ctx_.set_deadline(std::chrono::system_clock::now() + absl::ToChronoNanoseconds(timeout));
  }

  void Start(const Starter& starter) {
    starter(&ctx_, &request_, this);
    this->StartRead(&response_);
    this->StartCall();
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // OnDone follows.
    if (response_.token_ids_size() > 0) {
      const double now = clock_->ElapsedSeconds();
      if (record_->first_token_s < 0) record_->first_token_s = now;
      record_->token_s.push_back(now);
      record_->output_tokens += response_.token_ids_size();
      for (uint32_t id : response_.token_ids()) {
        record_->token_ids.push_back(static_cast<int32_t>(id));
      }
    }
    record_->text += response_.text();
    if (response_.has_usage()) {
      record_->usage_prompt_tokens = static_cast<int>(response_.usage().prompt_tokens());
      record_->usage_cached_prompt_tokens =
          static_cast<int>(response_.usage().cached_prompt_tokens());
    }
    this->StartRead(&response_);
  }

  void OnDone(const grpc::Status& status) override {
    record_->end_s = clock_->ElapsedSeconds();
    record_->status = FromGrpcStatus(status);
    std::function<void()> done = std::move(done_);
    delete this;
    done();
  }

 private:
  grpc::ClientContext ctx_;
  Request request_;
  Response response_;
  Record* const record_;
  const Stopwatch* const clock_;
  std::function<void()> done_;
};

class RouterTarget final : public Target {
 public:
  RouterTarget(const TargetOptions& o, const Stopwatch* clock)
      : channel_(InternalChannel(o.address)),
        stub_(v1::Inference::NewStub(channel_)),
        address_(o.address),
        clock_(clock),
        timeout_(o.timeout) {}

  absl::Status Connect(absl::Duration timeout) override {
    return WaitConnected(*channel_, address_, timeout);
  }

  void Send(const WorkItem& item, Record* record, std::function<void()> done) override {
    auto* call = new StreamCall<v1::GenerateRequest, v1::GenerateResponse>(
        GrpcRequest(item), record, clock_, timeout_, std::move(done));
    call->Start([this](grpc::ClientContext* ctx, const v1::GenerateRequest* req,
                       grpc::ClientReadReactor<v1::GenerateResponse>* r) {
      stub_->async()->Generate(ctx, req, r);
    });
  }

 private:
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Inference::Stub> stub_;
  const std::string address_;
  const Stopwatch* const clock_;
  const absl::Duration timeout_;
};

class LanguageTarget final : public Target {
 public:
  LanguageTarget(const TargetOptions& o, const Stopwatch* clock)
      : channel_(InternalChannel(o.address)),
        stub_(internal::v1::Language::NewStub(channel_)),
        address_(o.address),
        clock_(clock),
        timeout_(o.timeout) {}

  absl::Status Connect(absl::Duration timeout) override {
    return WaitConnected(*channel_, address_, timeout);
  }

  void Send(const WorkItem& item, Record* record, std::function<void()> done) override {
    auto request = LanguageRequest(item, absl::StrCat("loadgen-", next_id_++));
    if (!request.ok()) {
      record->status = request.status();
      record->end_s = clock_->ElapsedSeconds();
      done();
      return;
    }
    auto* call = new StreamCall<internal::v1::PrefillRequest, internal::v1::TokenBatch>(
        std::move(*request), record, clock_, timeout_, std::move(done));
    call->Start([this](grpc::ClientContext* ctx, const internal::v1::PrefillRequest* req,
                       grpc::ClientReadReactor<internal::v1::TokenBatch>* r) {
      stub_->async()->Prefill(ctx, req, r);
    });
  }

 private:
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<internal::v1::Language::Stub> stub_;
  const std::string address_;
  const Stopwatch* const clock_;
  const absl::Duration timeout_;
  std::atomic<int64_t> next_id_{0};
};

absl::StatusCode HttpCode(int status) {
  switch (status) {
    case 400:
      return absl::StatusCode::kInvalidArgument;
    case 404:
      return absl::StatusCode::kNotFound;
    case 413:
    case 429:
      return absl::StatusCode::kResourceExhausted;
    case 499:
      return absl::StatusCode::kCancelled;
    case 501:
      return absl::StatusCode::kUnimplemented;
    case 503:
      return absl::StatusCode::kUnavailable;
    case 504:
      return absl::StatusCode::kDeadlineExceeded;
    case 500:
      return absl::StatusCode::kInternal;
    default:
      return absl::StatusCode::kUnknown;
  }
}

// The Status code an SSE error event's string error.code names (the router's
// ErrorCodeFor), or UNKNOWN.
absl::StatusCode ErrorEventCode(const nlohmann::json& code) {
  if (!code.is_string()) return absl::StatusCode::kUnknown;
  const std::string name = code.get<std::string>();
  if (name == "invalid_api_key") return absl::StatusCode::kUnauthenticated;
  if (name == "rate_limit_exceeded") return absl::StatusCode::kResourceExhausted;
  for (int c = 0; c <= static_cast<int>(absl::StatusCode::kUnauthenticated); ++c) {
    const auto status_code = static_cast<absl::StatusCode>(c);
    if (absl::AsciiStrToLower(absl::StatusCodeToString(status_code)) == name) return status_code;
  }
  return absl::StatusCode::kUnknown;
}

// One thread per request: cpp-httplib's client blocks.
class HttpTarget final : public Target {
 public:
  HttpTarget(std::string host, int port, const TargetOptions& o, const Stopwatch* clock)
      : host_(std::move(host)), port_(port), clock_(clock), timeout_(o.timeout) {}

  ~HttpTarget() override {
    // Threads are detached; each decrements `live_` as its last act.
    while (live_.load() > 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }

  // A TCP connect to the port (each request opens its own connection).
  absl::Status Connect(absl::Duration timeout) override {
    const Deadline deadline = Deadline::After(timeout);
    do {
      httplib::Client cli(host_, port_);
      cli.set_connection_timeout(1, 0);
      if (auto res = cli.Get("/health")) return absl::OkStatus();
      absl::SleepFor(absl::Milliseconds(100));
    } while (!deadline.Expired());
    return absl::UnavailableError(absl::StrCat("no HTTP answer from ", host_, ":", port_,
                                               " within ", absl::FormatDuration(timeout)));
  }

  void Send(const WorkItem& item, Record* record, std::function<void()> done) override {
    ++live_;
    std::thread([this, body = HttpBody(item), record, done = std::move(done)] {
      Run(body, record);
      done();
      --live_;
    }).detach();
  }

 private:
  void Run(const std::string& body, Record* record) {
    httplib::Client cli(host_, port_);
    const int64_t secs = absl::ToInt64Seconds(timeout_);
    cli.set_read_timeout(secs, 0);
    cli.set_write_timeout(secs, 0);
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/chat/completions";
    req.set_header("Content-Type", "application/json");
    req.body = body;
    std::string pending, raw;
    bool finished = false;
    absl::Status stream_error;
    req.content_receiver = [&](const char* data, size_t len, uint64_t, uint64_t) {
      raw.append(data, len);
      pending.append(data, len);
      for (size_t end = pending.find("\n\n"); end != std::string::npos;
           end = pending.find("\n\n")) {
        const std::string event = pending.substr(0, end);
        pending.erase(0, end + 2);
        if (event.rfind("data: ", 0) != 0) continue;
        const std::string payload = event.substr(6);
        if (payload == "[DONE]") {
          finished = true;
          continue;
        }
        const nlohmann::json j = nlohmann::json::parse(payload, nullptr, false);
        if (j.is_discarded()) continue;
        if (j.contains("error")) {
          stream_error = absl::Status(
              ErrorEventCode(j["error"].contains("code") ? j["error"]["code"] : nlohmann::json()),
              j["error"].value("message", payload));
          continue;
        }
        if (j.contains("usage") && j["usage"].is_object()) {
          record->output_tokens = j["usage"].value("completion_tokens", 0);
        }
        if (!j.contains("choices") || j["choices"].empty()) continue;
        const auto& delta = j["choices"][0]["delta"];
        if (delta.contains("content") && delta["content"].is_string() &&
            !delta["content"].get<std::string>().empty()) {
          const double now = clock_->ElapsedSeconds();
          if (record->first_token_s < 0) record->first_token_s = now;
          record->token_s.push_back(now);
          record->text += delta["content"].get<std::string>();
        }
      }
      return true;
    };
    httplib::Response res;
    httplib::Error error = httplib::Error::Success;
    const bool sent = cli.send(req, res, error);
    record->end_s = clock_->ElapsedSeconds();
    if (!sent) {
      record->status =
          absl::UnavailableError(absl::StrCat("HTTP request failed: ", httplib::to_string(error)));
    } else if (res.status != 200) {
      record->status =
          absl::Status(HttpCode(res.status), absl::StrCat("HTTP ", res.status, ": ", raw));
    } else if (!stream_error.ok()) {
      record->status = stream_error;
    } else if (!finished) {
      record->status = absl::UnavailableError("the event stream ended without [DONE]");
    }
  }

  const std::string host_;
  const int port_;
  const Stopwatch* const clock_;
  const absl::Duration timeout_;
  std::atomic<int> live_{0};
};

}  // namespace

absl::StatusOr<std::unique_ptr<Target>> MakeTarget(const TargetOptions& options,
                                                   const Stopwatch* clock) {
  if (options.kind == "router") return std::make_unique<RouterTarget>(options, clock);
  if (options.kind == "language") return std::make_unique<LanguageTarget>(options, clock);
  if (options.kind == "http") {
    std::vector<std::string> parts = absl::StrSplit(options.address, absl::MaxSplits(':', 1));
    int port = 0;
    if (parts.size() != 2 || parts[0].empty() || !absl::SimpleAtoi(parts[1], &port) || port <= 0 ||
        port > 65535) {
      return absl::InvalidArgumentError(
          absl::StrCat("http target address must be host:port, got '", options.address, "'"));
    }
    return std::make_unique<HttpTarget>(parts[0], port, options, clock);
  }
  if (options.kind == "encoder") return MakeEncoderTarget(options, clock);
  return absl::InvalidArgumentError(
      absl::StrCat("unknown target '", options.kind, "' (router, language, http or encoder)"));
}

}  // namespace mmserve::loadgen
