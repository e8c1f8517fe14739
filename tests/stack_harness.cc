#include "tests/stack_harness.h"

#include <httplib.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "common/file.h"
#include "common/grpc_server.h"
#include "common/grpc_status.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "model/image_decode.h"
#include "tests/public_errors.h"
#include "worker/engine.h"

namespace mmserve::testing {

std::string RunfilesRoot() {
  if (const char* srcdir = std::getenv("TEST_SRCDIR")) return absl::StrCat(srcdir, "/mmserve");
  // bazel run, or the binary started by hand: its own runfiles tree.
  char self[4096] = {};
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  const std::string runfiles = absl::StrCat(std::string(self, n > 0 ? n : 0), ".runfiles/mmserve");
  return access(runfiles.c_str(), F_OK) == 0 ? runfiles : ".";
}

absl::StatusOr<std::vector<int32_t>> InProcessGreedy(const std::string& model_dir,
                                                     worker::EngineRequest request,
                                                     int max_tokens) {
  request.sampling.temperature = 0;
  request.sampling.max_tokens = max_tokens;
  request.sampling.ignore_eos = true;
  worker::EngineOptions o;
  o.model_dir = model_dir;
  o.kv_cache_bytes = int64_t{64} << 20;
  ASSIGN_OR_RETURN(std::unique_ptr<worker::LlmEngine> engine, worker::LlmEngine::Create(o));
  std::vector<int32_t> ids;
  RETURN_IF_ERROR(engine->AddRequest(std::move(request), [&ids](const worker::StreamEvent& e) {
    ids.insert(ids.end(), e.token_ids.begin(), e.token_ids.end());
  }));
  while (engine->has_unfinished()) RETURN_IF_ERROR(engine->Step());
  if (ids.size() != static_cast<size_t>(max_tokens)) {
    return absl::InternalError(
        absl::StrCat("the engine made ", ids.size(), " tokens, not ", max_tokens));
  }
  return ids;
}

const Reference& InProcess(const DemoSet& set, int n) {
  static absl::Mutex mu;
  static Reference* ref = new Reference;
  static std::unique_ptr<worker::LlmEngine> engine;
  absl::MutexLock lock(&mu);
  n = std::min<int>(n, set.items.size());
  const int have = static_cast<int>(ref->text.size());
  if (n <= have) return *ref;
  if (engine == nullptr) {
    worker::EngineOptions o;
    o.model_dir = DemoModelDir();
    o.max_num_seqs = 64;
    o.max_num_batched_tokens = 2048;
    o.kv_cache_bytes = 64ll << 20;
    auto created = worker::LlmEngine::Create(o);
    CHECK_OK(created.status());
    engine = std::move(*created);
  }
  ref->text.resize(n);
  ref->ids.resize(n);
  std::map<std::string, model::RgbImage> rgb;
  for (int i = have; i < n; ++i) {
    const DemoItem& item = set.items[i];
    if (!rgb.count(item.image_file)) {
      rgb[item.image_file] =
          model::DecodeImage(set.images.at(item.image_file), model::DecodeLimits()).value();
    }
    worker::EngineRequest req;
    req.id = absl::StrFormat("q%d", i);
    req.prompt = item.prompt;
    req.images.push_back(rgb[item.image_file]);
    req.sampling.temperature = 0;
    req.sampling.max_tokens = 8;
    CHECK_OK(engine->AddRequest(std::move(req), [i](const worker::StreamEvent& e) {
      ref->text[i] += e.text;
      ref->ids[i].insert(ref->ids[i].end(), e.token_ids.begin(), e.token_ids.end());
    }));
  }
  while (engine->has_unfinished()) CHECK_OK(engine->Step());
  return *ref;
}

std::string DemoModelDir() { return RunfilesRoot() + "/models/shapes-demo"; }
std::string EvalDir() { return RunfilesRoot() + "/tools/demo/eval_set"; }

const DemoSet& Demo() {
  static DemoSet* set = new DemoSet(LoadDemoSet(EvalDir()));
  return *set;
}

DemoSet LoadDemoSet(const std::string& eval_dir) {
  DemoSet set;
  auto text = ReadFileToString(eval_dir + "/eval.json");
  if (!text.ok()) return set;
  const nlohmann::json eval = nlohmann::json::parse(*text);
  for (const auto& it : eval["items"]) {
    DemoItem item;
    item.id = it["id"];
    item.image_file = it["image"];
    item.question = it["question"];
    item.prompt = it["prompt"];
    item.answer = it["answer"];
    if (set.images.count(item.image_file) == 0) {
      set.images[item.image_file] = ReadFileToString(eval_dir + "/" + item.image_file).value();
    }
    set.items.push_back(std::move(item));
  }
  return set;
}

namespace {

// One user message: the image (when given), then the question; greedy,
// ids included.
mmserve::v1::GenerateRequest UserRequest(const std::string* image, const std::string& question,
                                         const AskOptions& options) {
  mmserve::v1::GenerateRequest req;
  auto* msg = req.mutable_chat()->add_messages();
  msg->set_role("user");
  if (image != nullptr) msg->add_content()->mutable_image()->set_data(*image);
  msg->add_content()->set_text(question);
  req.mutable_sampling()->set_temperature(0);
  req.mutable_sampling()->set_max_tokens(options.max_tokens);
  req.mutable_sampling()->set_ignore_eos(options.ignore_eos);
  req.mutable_stream()->set_include_token_ids(true);
  return req;
}

}  // namespace

mmserve::v1::GenerateRequest DemoRequest(const DemoSet& set, const DemoItem& item,
                                         const AskOptions& options) {
  return UserRequest(&set.images.at(item.image_file), item.question, options);
}

mmserve::v1::GenerateRequest DemoTextRequest(const DemoItem& item, const AskOptions& options) {
  return UserRequest(nullptr, item.question, options);
}

Answer AskGrpc(mmserve::v1::Inference::Stub& stub, const mmserve::v1::GenerateRequest& request,
               const AskOptions& options) {
  Answer a;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + absl::ToChronoNanoseconds(options.deadline));
  if (!options.authorization.empty()) ctx.AddMetadata("authorization", options.authorization);
  auto reader = stub.Generate(&ctx, request);
  mmserve::v1::GenerateResponse r;
  while (reader->Read(&r)) {
    ++a.responses;
    a.text += r.text();
    for (uint32_t t : r.token_ids()) a.token_ids.push_back(static_cast<int32_t>(t));
    if (r.has_usage() && r.usage().cached_images() > 0) a.cache_hit_reported = true;
    if (options.cancel_after > 0 && a.responses == options.cancel_after) ctx.TryCancel();
  }
  a.status = FromGrpcStatus(reader->Finish());
  for (const auto& [key, value] : ctx.GetServerTrailingMetadata()) {
    if (key == "x-request-id") a.request_id = std::string(value.data(), value.size());
    if (key == "retry-after") a.retry_after = std::string(value.data(), value.size());
  }
  return a;
}

Answer AskHttp(int port, const DemoSet& set, const DemoItem& item) {
  Answer a;
  nlohmann::json body;
  body["messages"] = nlohmann::json::array(
      {{{"role", "user"},
        {"content", nlohmann::json::array(
                        {{{"type", "image_url"},
                          {"image_url",
                           {{"url", "data:image/png;base64," +
                                        absl::Base64Escape(set.images.at(item.image_file))}}}},
                         {{"type", "text"}, {"text", item.question}}})}}});
  body["temperature"] = 0;
  body["max_tokens"] = 8;
  httplib::Client cli("127.0.0.1", port);
  cli.set_read_timeout(60, 0);
  auto res = cli.Post("/v1/chat/completions", body.dump(), "application/json");
  if (!res) {
    a.status =
        absl::UnavailableError(absl::StrCat("no HTTP response: ", httplib::to_string(res.error())));
    return a;
  }
  const nlohmann::json reply = nlohmann::json::parse(res->body, nullptr, false);
  if (res->status != 200 || reply.is_discarded()) {
    a.status = absl::UnknownError(absl::StrCat("HTTP ", res->status, ": ", res->body));
    return a;
  }
  a.text = reply["choices"][0]["message"]["content"].get<std::string>();
  return a;
}

void ParallelFor(int n, int threads, const std::function<void(int)>& fn) {
  std::atomic<int> next{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&] {
      for (int i = next++; i < n; i = next++) fn(i);
    });
  }
  for (auto& t : pool) t.join();
}

absl::Status KilledStreams::AllUnavailable(absl::Duration within) const {
  std::string wrong;
  for (size_t i = 0; i < streams.size(); ++i) {
    const StreamEnd& s = streams[i];
    const absl::Duration after_kill = absl::Nanoseconds(s.ended_at_ns - killed_at_ns);
    if (!s.streamed || s.status.code() != absl::StatusCode::kUnavailable || after_kill > within) {
      absl::StrAppend(&wrong, "stream ", i, (s.streamed ? "" : " never streamed,"), " ended with ",
                      s.status.ToString(), " after ", s.tokens, " tokens, ",
                      absl::FormatDuration(after_kill), " after the kill; ");
    }
  }
  if (wrong.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(wrong);
}

absl::Status KilledStreams::AllPublic(const std::vector<std::string>& internals) const {
  std::string wrong;
  for (size_t i = 0; i < streams.size(); ++i) {
    const StreamEnd& s = streams[i];
    const absl::Status p = CheckPublicError(s.status, s.request_id, internals);
    if (!p.ok()) absl::StrAppend(&wrong, "stream ", i, (s.http ? " (HTTP): " : ": "), p.message());
    // A streamed HTTP response has sent its headers before it fails.
    if (absl::IsUnavailable(s.status) && s.retry_after.empty() && !(s.http && s.streamed)) {
      absl::StrAppend(&wrong, "stream ", i, (s.http ? " (HTTP)" : ""), ": no retry-after; ");
    }
  }
  if (wrong.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(wrong);
}

std::string OpenAiStreamBody(const mmserve::v1::GenerateRequest& request) {
  nlohmann::json messages = nlohmann::json::array();
  if (request.has_chat()) {
    for (const auto& m : request.chat().messages()) {
      nlohmann::json content = nlohmann::json::array();
      for (const auto& part : m.content()) {
        if (part.has_image()) {
          content.push_back(
              {{"type", "image_url"},
               {"image_url",
                {{"url", "data:image/png;base64," + absl::Base64Escape(part.image().data())}}}});
        } else {
          content.push_back({{"type", "text"}, {"text", part.text()}});
        }
      }
      messages.push_back({{"role", m.role()}, {"content", std::move(content)}});
    }
  } else {
    messages.push_back({{"role", "user"}, {"content", request.raw().text()}});
  }
  nlohmann::json body;
  body["messages"] = std::move(messages);
  body["temperature"] = request.sampling().temperature();
  body["max_tokens"] = request.sampling().max_tokens();
  body["ignore_eos"] = request.sampling().ignore_eos();
  body["stream"] = true;
  return body.dump();
}

namespace {

absl::StatusCode CodeNamed(const std::string& name) {
  for (int c = 1; c <= 16; ++c) {
    const auto code = static_cast<absl::StatusCode>(c);
    if (absl::AsciiStrToLower(absl::StatusCodeToString(code)) == name) return code;
  }
  if (name == "rate_limit_exceeded") return absl::StatusCode::kResourceExhausted;
  if (name == "invalid_api_key") return absl::StatusCode::kUnauthenticated;
  return absl::StatusCode::kUnknown;
}

// The status an OpenAI error object ({"error": {"message", "code"}}) stands for.
absl::Status FromErrorJson(const nlohmann::json& j) {
  const nlohmann::json& e = j["error"];
  const std::string code = e.contains("code") && e["code"].is_string() ? e["code"] : "";
  return absl::Status(CodeNamed(code), e.value("message", ""));
}

// One streamed chat completion over HTTP, read to its end; `on_token` runs
// for each content chunk.
void StreamHttp(int port, const std::string& body, absl::Duration deadline, StreamEnd& end,
                const std::function<void()>& on_token) {
  end.http = true;
  httplib::Client cli("127.0.0.1", port);
  const int64_t secs = deadline == absl::InfiniteDuration() ? 600 : absl::ToInt64Seconds(deadline);
  cli.set_read_timeout(secs, 0);
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/chat/completions";
  req.set_header("Content-Type", "application/json");
  req.body = body;
  std::string pending, raw;
  req.content_receiver = [&](const char* data, size_t len, uint64_t, uint64_t) {
    raw.append(data, len);
    pending.append(data, len);
    for (size_t at = pending.find("\n\n"); at != std::string::npos; at = pending.find("\n\n")) {
      const std::string event = pending.substr(0, at);
      pending.erase(0, at + 2);
      if (event.rfind("data: ", 0) != 0 || event == "data: [DONE]") continue;
      const nlohmann::json j = nlohmann::json::parse(event.substr(6), nullptr, false);
      if (j.is_discarded()) continue;
      if (j.contains("error")) {
        end.status = FromErrorJson(j);
      } else if (j.contains("choices") && !j["choices"].empty() &&
                 j["choices"][0]["delta"].contains("content") &&
                 j["choices"][0]["delta"]["content"].is_string() &&
                 !j["choices"][0]["delta"]["content"].get<std::string>().empty()) {
        ++end.tokens;
        on_token();
      }
    }
    return true;
  };
  httplib::Response res;
  httplib::Error error = httplib::Error::Success;
  const bool sent = cli.send(req, res, error);
  end.request_id = res.get_header_value("X-Request-Id");
  end.retry_after = res.get_header_value("Retry-After");
  if (!sent) {
    end.status =
        absl::UnavailableError(absl::StrCat("no HTTP response: ", httplib::to_string(error)));
  } else if (res.status != 200) {
    const nlohmann::json j = nlohmann::json::parse(raw, nullptr, false);
    end.status = j.is_discarded() || !j.contains("error")
                     ? absl::UnknownError(absl::StrCat("HTTP ", res.status, ": ", raw))
                     : FromErrorJson(j);
  }
}

}  // namespace

StreamEnd AskHttpStream(int port, const mmserve::v1::GenerateRequest& request,
                        absl::Duration deadline) {
  StreamEnd end;
  StreamHttp(port, OpenAiStreamBody(request), deadline, end, [] {});
  end.streamed = end.tokens > 0;
  end.ended_at_ns = MonotonicNanos();
  return end;
}

KilledStreams StreamAndKill(mmserve::v1::Inference::Stub& stub,
                            const std::vector<mmserve::v1::GenerateRequest>& requests,
                            const std::function<void()>& kill, const StreamKillOptions& options) {
  const int n = static_cast<int>(requests.size());
  KilledStreams out;
  out.streams.resize(n);
  absl::Mutex mu;
  int settled = 0;  // streams streaming or ended
  std::thread killer([&] {
    {
      absl::MutexLock lock(&mu);
      auto all_settled = [&] { return settled >= n; };
      mu.AwaitWithTimeout(absl::Condition(&all_settled), options.wait);
    }
    out.killed_at_ns = MonotonicNanos();
    kill();
  });
  const int first_http = options.http_port > 0 ? n - options.http_streams : n;
  ParallelFor(n, n, [&](int i) {
    StreamEnd& end = out.streams[i];
    if (i >= first_http) {
      StreamHttp(options.http_port, OpenAiStreamBody(requests[i]), options.deadline, end, [&] {
        if (!end.streamed && end.tokens >= std::max(1, options.streaming_tokens)) {
          end.streamed = true;
          absl::MutexLock lock(&mu);
          ++settled;
        }
      });
      end.ended_at_ns = MonotonicNanos();
      if (!end.streamed) {
        absl::MutexLock lock(&mu);
        ++settled;
      }
      return;
    }
    grpc::ClientContext ctx;
    if (options.deadline != absl::InfiniteDuration()) {
      ctx.set_deadline(std::chrono::system_clock::now() +
                       absl::ToChronoNanoseconds(options.deadline));
    }
    auto reader = stub.Generate(&ctx, requests[i]);
    mmserve::v1::GenerateResponse resp;
    while (reader->Read(&resp)) {
      end.tokens += resp.token_ids_size();
      if (!end.streamed && end.tokens >= options.streaming_tokens) {
        end.streamed = true;
        absl::MutexLock lock(&mu);
        ++settled;
      }
    }
    end.status = FromGrpcStatus(reader->Finish());
    end.ended_at_ns = MonotonicNanos();
    for (const auto& [key, value] : ctx.GetServerTrailingMetadata()) {
      if (key == "x-request-id") end.request_id = std::string(value.data(), value.size());
      if (key == "retry-after") end.retry_after = std::string(value.data(), value.size());
    }
    if (!end.streamed) {
      absl::MutexLock lock(&mu);
      ++settled;
    }
  });
  killer.join();
  return out;
}

double ScrapeMetric(int port, const std::string& name, const std::string& labels) {
  return ScrapeMetricAt("127.0.0.1", port, name, labels);
}

double ScrapeMetricAt(const std::string& host, int port, const std::string& name,
                      const std::string& labels) {
  if (port <= 0) return -1;
  httplib::Client cli(host, port);
  cli.set_connection_timeout(2, 0);
  cli.set_read_timeout(5, 0);
  auto res = cli.Get("/metrics");
  if (!res || res->status != 200) return -1;
  double total = 0;
  bool found = false;
  std::istringstream in(res->body);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    const size_t space = line.rfind(' ');
    const std::string key = line.substr(0, space);
    const std::string metric = key.substr(0, key.find('{'));
    if (metric != name) continue;
    if (!labels.empty() && key.find(labels) == std::string::npos) continue;
    double v = 0;
    if (absl::SimpleAtod(line.substr(space + 1), &v)) {
      total += v;
      found = true;
    }
  }
  return found ? total : -1;
}

bool Leaks::zero() const {
  return language_embedding_blocks_used == 0 && language_kv_blocks_used == 0 &&
         language_requests_live == 0 && encoder_embedding_blocks_used == 0 &&
         router_calls_live == 0;
}

std::string Leaks::ToString() const {
  return absl::StrCat("language embedding blocks ", language_embedding_blocks_used,
                      ", language KV blocks ", language_kv_blocks_used, ", language requests ",
                      language_requests_live, ", encoder embedding blocks ",
                      encoder_embedding_blocks_used, ", router calls ", router_calls_live);
}

Leaks WaitForNoLeaks(launcher::LocalStack& stack, absl::Duration timeout) {
  const Deadline deadline = Deadline::After(timeout);
  Leaks l;
  do {
    // Summed over the prefill and decode instances when disaggregated; an
    // unreachable one (-1) makes the sum non-zero.
    std::vector<launcher::Service*> langs;
    if (stack.elastic()) {
      // The live elastic instances (a killed one's survivors).
      for (int i = 0; i < stack.num_elastic(); ++i) {
        if (stack.elastic(i).process && stack.elastic(i).process->alive()) {
          langs.push_back(&stack.elastic(i));
        }
      }
    } else if (stack.disaggregated()) {
      langs = {&stack.prefill(0), &stack.decode(0)};
    } else {
      langs = {&stack.language()};
    }
    l.language_embedding_blocks_used = l.language_kv_blocks_used = l.language_requests_live = 0;
    for (launcher::Service* lang : langs) {
      const int lp = lang->metrics_port();
      l.language_embedding_blocks_used +=
          ScrapeMetric(lp, "mmserve_language_embedding_blocks_used");
      l.language_kv_blocks_used += ScrapeMetric(lp, "mmserve_language_kv_blocks_used");
      l.language_requests_live += ScrapeMetric(lp, "mmserve_language_requests_live");
    }
    l.encoder_embedding_blocks_used = 0;
    for (int i = 0; i < stack.num_encoders(); ++i) {
      if (!stack.encoder(i).process || !stack.encoder(i).process->alive()) continue;
      l.encoder_embedding_blocks_used +=
          ScrapeMetric(stack.encoder(i).metrics_port(), "mmserve_encoder_embedding_blocks_used");
    }
    l.router_calls_live = ScrapeMetric(stack.router().metrics_port(), "mmserve_router_calls_live");
    if (l.zero()) return l;
    absl::SleepFor(absl::Milliseconds(100));
  } while (!deadline.Expired());
  return l;
}

void UseElasticPair(launcher::StackOptions& o) {
  o.elastic = 2;
  if (kSanitizerSlowdown > 1) o.language_args.push_back("--elastic_layer_timeout_ms=10000");
}

std::vector<pid_t> ChildrenOf(pid_t pid) {
  std::vector<pid_t> out;
  std::error_code ec;
  for (const auto& task :
       std::filesystem::directory_iterator(absl::StrCat("/proc/", pid, "/task"), ec)) {
    std::ifstream in(task.path() / "children");
    pid_t child;
    while (in >> child) out.push_back(child);
  }
  return out;
}

launcher::StackOptions TestStackOptions(int encoders, const std::string& profile) {
  launcher::StackOptions o;
  o.bin_dir = RunfilesRoot();
  o.model_dir = DemoModelDir();
  const char* out = std::getenv("TEST_UNDECLARED_OUTPUTS_DIR");
  o.log_dir = out != nullptr ? out : "/tmp";
  o.encoders = encoders;
  o.profile = profile;
  o.http_port = 0;
  o.language_args = {"--kv_cache_mb=64", "--threads=1"};
  o.encoder_args = {"--keep_for_seconds=5"};
  // Under a sanitizer on a loaded machine a busy instance can miss two
  // 500 ms health polls in a row, or send no heartbeat for 3 s, and drop
  // out of placement for seconds, failing requests a test expects to
  // succeed. A dead instance is still seen at once (its polls fail, they do
  // not time out), after three.
  if (kSanitizerSlowdown > 1) {
    o.router_args = {"--poll_timeout_ms=3000", "--down_after=3", "--heartbeat_timeout_ms=10000"};
  }
  return o;
}

launcher::StackOptions ResumeStackOptions() {
  launcher::StackOptions o = TestStackOptions(1, "shm");
  o.router_args.push_back("--presize=false");
  o.language_args.push_back("--embedding_block_size=4");
  o.language_args.push_back("--default_blocks=1");
  o.encoder_args.push_back("--block_size=4");
  return o;
}

}  // namespace mmserve::testing
