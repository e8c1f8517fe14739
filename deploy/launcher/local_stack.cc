#include "deploy/launcher/local_stack.h"

#include <signal.h>

#include <chrono>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/clock.h"
#include "common/file.h"
#include "common/grpc_server.h"
#include "common/status_macros.h"
#include "proto/inference.grpc.pb.h"

namespace mmserve::launcher {

std::string Service::grpc_address() const {
  auto it = ready.fields.find("grpc");
  return it == ready.fields.end() ? "" : it->second;
}

int Service::metrics_port() const {
  auto it = ready.fields.find("metrics");
  int port = -1;
  if (it != ready.fields.end() && absl::SimpleAtoi(it->second, &port)) return port;
  return -1;
}

namespace {

// The first key of an API key file, read as the router reads it (blank lines
// and lines starting with '#' skipped). The message never holds a key.
absl::StatusOr<std::string> FirstApiKey(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    line = absl::StripAsciiWhitespace(line);
    if (!line.empty() && !absl::StartsWith(line, "#")) return std::string(line);
  }
  return absl::InvalidArgumentError(path + ": no API key in the file");
}

}  // namespace

absl::StatusOr<std::unique_ptr<LocalStack>> LocalStack::Start(const StackOptions& options) {
  std::unique_ptr<LocalStack> s(new LocalStack(options));
  s->health_key_ = options.api_key;
  if (!options.api_key_file.empty() && s->health_key_.empty()) {
    ASSIGN_OR_RETURN(s->health_key_, FirstApiKey(options.api_key_file));
  }
  std::vector<std::string> router_args = {"--model_dir=" + options.model_dir,
                                          "--host=" + options.host,
                                          absl::StrCat("--port=", options.router_port),
                                          absl::StrCat("--http_port=", options.http_port),
                                          "--metrics_port=0",
                                          "--internal_address=" + options.host + ":0"};
  if (!options.api_key.empty()) router_args.push_back("--api_key=" + options.api_key);
  if (!options.api_key_file.empty()) {
    router_args.push_back("--api_key_file=" + options.api_key_file);
  }
  if (options.elastic > 0) router_args.push_back("--elastic");
  if (options.elastic > 0 && !options.elastic_step_models.empty()) {
    router_args.push_back("--elastic_step_models=" + options.elastic_step_models);
  }
  router_args.insert(router_args.end(), options.router_args.begin(), options.router_args.end());
  auto router = s->Launch("router", options.bin_dir + "/router/router", router_args);
  if (!router.ok()) return router.status();
  s->router_ = std::move(*router);
  s->router_address_ = s->router_.grpc_address();
  // Instances register on the internal plane (the router never serves
  // Registry on its public port).
  auto internal = s->router_.ready.fields.find("internal");
  if (internal == s->router_.ready.fields.end()) {
    return absl::InternalError("the router's READY line names no internal address");
  }
  s->registry_address_ = internal->second;
  int http = -1;
  auto it = s->router_.ready.fields.find("http");
  if (it != s->router_.ready.fields.end() && absl::SimpleAtoi(it->second, &http)) {
    s->http_port_ = http;
  }
  s->encoders_.resize(options.encoders);
  for (int i = 0; i < options.encoders; ++i) {
    if (absl::Status st = s->StartEncoder(i); !st.ok()) return st;
  }
  int languages = 1;
  if (s->elastic()) {
    s->elastic_.resize(options.elastic);
    for (int i = 0; i < options.elastic; ++i) {
      if (absl::Status st = s->StartRole("elastic", i); !st.ok()) return st;
    }
    languages = options.elastic;
  } else if (s->disaggregated()) {
    // Decode first: a prefill instance is useless to the router without one.
    s->decode_.resize(options.decode);
    s->prefill_.resize(options.prefill);
    for (int i = 0; i < options.decode; ++i) {
      if (absl::Status st = s->StartRole("decode", i); !st.ok()) return st;
    }
    for (int i = 0; i < options.prefill; ++i) {
      if (absl::Status st = s->StartRole("prefill", i); !st.ok()) return st;
    }
    languages = options.prefill;  // ListModels' prefill_instances
  } else if (absl::Status st = s->StartLanguage(); !st.ok()) {
    return st;
  }
  if (absl::Status st = s->WaitHealthy(options.encoders, languages, options.ready_timeout);
      !st.ok()) {
    return st;
  }
  return s;
}

LocalStack::~LocalStack() { Stop(); }

absl::StatusOr<Service> LocalStack::Launch(const std::string& name, const std::string& binary,
                                           std::vector<std::string> args) {
  ChildSpec spec{name, binary, std::move(args), options_.log_dir + "/" + name + ".log"};
  auto p = ChildProcess::Start(spec);
  if (!p.ok()) return p.status();
  auto ready = (*p)->WaitReady(options_.ready_timeout);
  if (!ready.ok()) return ready.status();
  Service svc;
  svc.id = ready->id;
  svc.process = std::move(*p);
  svc.ready = std::move(*ready);
  return svc;
}

absl::Status LocalStack::StartEncoder(int i) {
  const std::string id = absl::StrCat("encoder-", i);
  std::vector<std::string> args = {"--model_dir=" + options_.model_dir,
                                   "--host=" + options_.host,
                                   "--port=0",
                                   "--metrics_port=0",
                                   "--instance_id=" + id,
                                   "--router=" + registry_address_,
                                   "--profile=" + options_.profile};
  args.insert(args.end(), options_.encoder_args.begin(), options_.encoder_args.end());
  auto svc = Launch(id, options_.bin_dir + "/encoder_service/encoder", args);
  if (!svc.ok()) return svc.status();
  encoders_[i] = std::move(*svc);
  return absl::OkStatus();
}

absl::Status LocalStack::StartLanguage() {
  std::vector<std::string> args = {"--model_dir=" + options_.model_dir,
                                   "--host=" + options_.host,
                                   "--port=0",
                                   "--metrics_port=0",
                                   "--instance_id=language-0",
                                   "--router=" + registry_address_,
                                   "--profile=" + options_.profile};
  args.insert(args.end(), options_.language_args.begin(), options_.language_args.end());
  auto svc = Launch("language-0", options_.bin_dir + "/language_service/language", args);
  if (!svc.ok()) return svc.status();
  language_ = std::move(*svc);
  return absl::OkStatus();
}

absl::Status LocalStack::StartRole(const std::string& role, int i) {
  const std::string id = absl::StrCat(role, "-", i);
  std::vector<std::string> args = {"--model_dir=" + options_.model_dir,
                                   "--host=" + options_.host,
                                   "--port=0",
                                   "--metrics_port=0",
                                   "--instance_id=" + id,
                                   "--role=" + role,
                                   "--router=" + registry_address_,
                                   "--profile=" + options_.profile};
  args.insert(args.end(), options_.language_args.begin(), options_.language_args.end());
  if (role == "decode") {
    args.insert(args.end(), options_.decode_args.begin(), options_.decode_args.end());
  }
  if (role == "prefill") {
    args.insert(args.end(), options_.prefill_args.begin(), options_.prefill_args.end());
  }
  auto svc = Launch(id, options_.bin_dir + "/language_service/language", args);
  if (!svc.ok()) return svc.status();
  (role == "decode" ? decode_ : role == "elastic" ? elastic_ : prefill_)[i] = std::move(*svc);
  return absl::OkStatus();
}

absl::Status LocalStack::WaitHealthy(int encoders, int languages, absl::Duration timeout) {
  auto stub = mmserve::v1::Inference::NewStub(InternalChannel(router_address_));
  const Deadline deadline = Deadline::After(timeout);
  std::string last = "no answer";
  while (!deadline.Expired()) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(1));
    if (!health_key_.empty()) ctx.AddMetadata("authorization", "Bearer " + health_key_);
    mmserve::v1::ListModelsResponse resp;
    grpc::Status s = stub->ListModels(&ctx, mmserve::v1::ListModelsRequest(), &resp);
    if (s.ok() && resp.models_size() > 0) {
      const auto& m = resp.models(0);
      if (static_cast<int>(m.encoder_instances()) == encoders &&
          static_cast<int>(m.prefill_instances()) == languages) {
        return absl::OkStatus();
      }
      last = absl::StrCat(m.encoder_instances(), " encoders and ", m.prefill_instances(),
                          " language instances healthy");
    } else if (!s.ok()) {
      last = s.error_message();
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  return absl::DeadlineExceededError(absl::StrCat("the router did not see ", encoders,
                                                  " encoders and ", languages,
                                                  " language instances healthy: ", last));
}

std::vector<std::string> LocalStack::Exited() {
  std::vector<std::string> out;
  auto check = [&out](Service& s) {
    if (s.process && !s.process->alive()) {
      out.push_back(
          absl::StrCat(s.process->spec().name, " (status ", s.process->exit_status(), ")"));
      s.process.reset();
    }
  };
  check(router_);
  for (Service& e : encoders_) check(e);
  check(language_);
  for (Service& p : prefill_) check(p);
  for (Service& d : decode_) check(d);
  for (Service& x : elastic_) check(x);
  return out;
}

void LocalStack::Stop(absl::Duration grace) {
  // Everyone gets SIGTERM at once (they drain in parallel), then each is
  // reaped, SIGKILLed past the grace.
  std::vector<Service*> all = {&router_, &language_};
  for (Service& e : encoders_) all.push_back(&e);
  for (Service& p : prefill_) all.push_back(&p);
  for (Service& d : decode_) all.push_back(&d);
  for (Service& x : elastic_) all.push_back(&x);
  for (Service* s : all) {
    if (s->process) s->process->Signal(SIGTERM);
  }
  for (Service* s : all) {
    if (s->process) s->process->Stop(grace);
  }
}

}  // namespace mmserve::launcher
