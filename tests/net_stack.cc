#include "tests/net_stack.h"

#include <signal.h>

#include <algorithm>
#include <cstdlib>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/clock.h"

namespace mmserve::testing {

std::vector<std::string> NetStack::Flags(const std::string& binary, int host, const std::string& id,
                                         const std::string& role) const {
  const std::string address = hosts_.address(host);
  std::vector<std::string> f = {"--model_dir=" + DemoModelDir(), "--host=" + address,
                                "--metrics_port=0"};
  if (binary == "router") {
    f.push_back(absl::StrCat("--port=", router_port_));
    f.push_back(absl::StrCat("--internal_address=", address, ":", registry_port_));
    f.push_back("--http_port=-1");
    f.insert(f.end(), options_.router_args.begin(), options_.router_args.end());
    return f;
  }
  f.insert(f.end(), {"--port=0", "--instance_id=" + id, "--router=" + registry_address_,
                     "--profile=" + options_.profile});
  if (binary == "encoder") {
    f.insert(f.end(), options_.encoder_args.begin(), options_.encoder_args.end());
  } else {
    f.push_back("--role=" + role);
    f.insert(f.end(), options_.language_args.begin(), options_.language_args.end());
  }
  return f;
}

absl::StatusOr<launcher::Service> NetStack::Launch(int host, const std::string& name,
                                                   const std::string& binary,
                                                   const std::vector<std::string>& args) {
  std::vector<std::string> argv = hosts_.Command(host, binary, args);
  launcher::ChildSpec spec{name, argv[0], std::vector<std::string>(argv.begin() + 1, argv.end()),
                           log_dir_ + "/" + name + ".log"};
  auto p = launcher::ChildProcess::Start(spec);
  if (!p.ok()) return p.status();
  auto ready = (*p)->WaitReady(options_.ready_timeout);
  if (!ready.ok()) return ready.status();
  launcher::Service svc;
  svc.id = ready->id;
  svc.process = std::move(*p);
  svc.ready = std::move(*ready);
  return svc;
}

absl::StatusOr<std::unique_ptr<NetStack>> NetStack::Start(NetHosts& hosts,
                                                          const NetStackOptions& options) {
  if (hosts.size() < HostsFor(options)) return absl::InvalidArgumentError("too few hosts");
  std::unique_ptr<NetStack> s(new NetStack(hosts, options));
  const char* out = std::getenv("TEST_UNDECLARED_OUTPUTS_DIR");
  s->log_dir_ = out != nullptr ? out : "/tmp";
  if (absl::Status st = s->StartRouter(); !st.ok()) return st;
  const std::string bin = RunfilesRoot();
  s->encoders_.resize(options.encoders);
  for (int i = 0; i < options.encoders; ++i) {
    const std::string id = absl::StrCat("encoder-", i);
    auto e = s->Launch(s->encoder_host(i), id, bin + "/encoder_service/encoder",
                       s->Flags("encoder", s->encoder_host(i), id, ""));
    if (!e.ok()) return e.status();
    s->encoders_[i] = std::move(*e);
  }
  // Decode instances first: a prefill instance is useless without one.
  s->languages_.resize(options.languages.size());
  for (const bool decode : {true, false}) {
    for (size_t i = 0; i < options.languages.size(); ++i) {
      const std::string& role = options.languages[i];
      if ((role == "decode") != decode) continue;
      const std::string id = absl::StrCat(role == "both" ? "language" : role, "-", i);
      const int host = s->language_host(static_cast<int>(i));
      auto l = s->Launch(host, id, bin + "/language_service/language",
                         s->Flags("language", host, id, role));
      if (!l.ok()) return l.status();
      s->languages_[i] = std::move(*l);
    }
  }
  for (const std::string role : {"both", "prefill", "decode"}) {
    const int n =
        static_cast<int>(std::count(options.languages.begin(), options.languages.end(), role));
    if (n == 0) continue;
    if (absl::Status st = s->WaitHealthy(options.encoders, role == "both" ? "language" : role, n,
                                         options.ready_timeout);
        !st.ok()) {
      return st;
    }
  }
  return s;
}

NetStack::~NetStack() {
  std::vector<launcher::Service*> all = {&router_};
  for (auto& e : encoders_) all.push_back(&e);
  for (auto& l : languages_) all.push_back(&l);
  for (auto* s : all) {
    if (s->process) s->process->Signal(SIGTERM);
  }
  for (auto* s : all) {
    if (s->process) s->process->Stop(absl::Seconds(15));
  }
}

void NetStack::KillRouter() {
  if (router_.process) router_.process->Stop(absl::ZeroDuration());
}

absl::Status NetStack::StartRouter() {
  auto r = Launch(router_host(), "router", RunfilesRoot() + "/router/router",
                  Flags("router", router_host(), "", ""));
  if (!r.ok()) return r.status();
  router_ = std::move(*r);
  router_address_ = router_.grpc_address();
  std::vector<std::string> hp = absl::StrSplit(router_address_, ':');
  if (hp.size() != 2 || !absl::SimpleAtoi(hp[1], &router_port_)) {
    return absl::InternalError("router address " + router_address_);
  }
  // Instances register on the router's internal plane; a restart keeps it.
  auto internal = router_.ready.fields.find("internal");
  if (internal == router_.ready.fields.end()) return absl::InternalError("no internal address");
  registry_address_ = internal->second;
  hp = absl::StrSplit(registry_address_, ':');
  if (hp.size() != 2 || !absl::SimpleAtoi(hp[1], &registry_port_)) {
    return absl::InternalError("router internal address " + registry_address_);
  }
  return absl::OkStatus();
}

double NetStack::Metric(launcher::Service& service, const std::string& name,
                        const std::string& labels) {
  std::vector<std::string> hp = absl::StrSplit(service.grpc_address(), ':');
  return ScrapeMetricAt(hp[0], service.metrics_port(), name, labels);
}

absl::Status NetStack::WaitHealthy(int encoders, const std::string& role, int instances,
                                   absl::Duration timeout) {
  const Deadline deadline = Deadline::After(timeout);
  double e = -1, l = -1;
  std::vector<launcher::Service*> all = {&router_};
  for (auto& s : encoders_) all.push_back(&s);
  for (auto& s : languages_) all.push_back(&s);
  while (!deadline.Expired()) {
    for (launcher::Service* s : all) {
      if (s->process && !s->process->alive()) {
        return absl::UnavailableError(
            absl::StrCat(s->process->spec().name, " exited; log:\n", s->process->LogTail()));
      }
    }
    e = Metric(router_, "mmserve_router_healthy_instances", "role=\"encoder\"");
    l = Metric(router_, "mmserve_router_healthy_instances", "role=\"" + role + "\"");
    if (e == encoders && l == instances) return absl::OkStatus();
    absl::SleepFor(absl::Milliseconds(50));
  }
  return absl::DeadlineExceededError(absl::StrCat("the router saw ", e, " encoders and ", l, " ",
                                                  role, " instances healthy, not ", encoders,
                                                  " and ", instances));
}

Leaks NetStack::WaitForNoLeaks(absl::Duration timeout) {
  const Deadline deadline = Deadline::After(timeout);
  Leaks l;
  do {
    l.language_embedding_blocks_used = l.language_kv_blocks_used = l.language_requests_live = 0;
    for (auto& lang : languages_) {
      l.language_embedding_blocks_used += Metric(lang, "mmserve_language_embedding_blocks_used");
      l.language_kv_blocks_used += Metric(lang, "mmserve_language_kv_blocks_used");
      l.language_requests_live += Metric(lang, "mmserve_language_requests_live");
    }
    l.encoder_embedding_blocks_used = 0;
    for (auto& e : encoders_) {
      l.encoder_embedding_blocks_used += Metric(e, "mmserve_encoder_embedding_blocks_used");
    }
    l.router_calls_live = Metric(router_, "mmserve_router_calls_live");
    if (l.zero()) return l;
    absl::SleepFor(absl::Milliseconds(100));
  } while (!deadline.Expired());
  return l;
}

}  // namespace mmserve::testing
