#include "common/service_process.h"

#include <signal.h>

#include <cstdio>
#include <ctime>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/internal_plane.h"
#include "common/logging.h"

namespace mmserve {

absl::StatusOr<std::unique_ptr<ServiceProcess>> ServiceProcess::Start(
    ServiceProcessOptions options, const std::vector<grpc::Service*>& services,
    metrics::Registry& registry) {
  std::unique_ptr<ServiceProcess> p(new ServiceProcess());
  const std::string address = options.grpc_address.empty()
                                  ? absl::StrCat(options.host, ":", options.port)
                                  : options.grpc_address;
  GrpcServerOptions grpc_options = options.grpc;
  // Unless the binary chose (the router's public port), the internal plane's.
  if (!grpc_options.credentials) grpc_options.credentials = InternalServerCredentials();
  auto server = StartGrpcServer(address, services, grpc_options);
  if (!server.ok()) return server.status();
  p->server_ = *std::move(server);
  if (options.metrics_port >= 0) {
    auto ms = metrics::MetricsServer::Start(registry, options.host, options.metrics_port);
    if (!ms.ok()) return ms.status();
    p->metrics_ = *std::move(ms);
  }
  p->advertise_ = options.advertise.empty()
                      ? absl::StrCat(address.substr(0, address.rfind(':')), ":", p->server_->port())
                      : options.advertise;
  p->options_ = std::move(options);
  return p;
}

ServiceProcess::~ServiceProcess() { Deregister(); }

void ServiceProcess::Register(const std::string& router, internal::v1::InstanceInfo instance,
                              std::function<internal::v1::LoadReport()> load) {
  if (router.empty()) return;
  instance.set_grpc_address(advertise_);
  registry_loop_ = std::make_unique<EventLoop>(EventLoopOptions{.name = "registry"});
  registration_ = std::make_unique<RegistryClient>(
      RegistryClientOptions{
          .router = router,
          .instance = std::move(instance),
          .load = std::move(load),
          .on_refused = [this](const absl::Status& why) { refused_.Request(why); }},
      registry_loop_.get());
  registration_->Start();
}

void ServiceProcess::Ready(absl::string_view ready_fields) {
  server_->SetServing(true);
  // One machine-readable line for launchers (stdout), then logs on stderr.
  const std::string fields =
      ready_fields.empty()
          ? absl::StrCat(options_.instance_id, " grpc=", advertise_, " metrics=", metrics_port())
          : std::string(ready_fields);
  std::printf("READY %s %s\n", options_.name.c_str(), fields.c_str());
  std::fflush(stdout);
}

int ServiceProcess::WaitForTerminationSignal() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  // Signals are blocked in every thread (BlockTerminationSignals), so they
  // wait here; a stop request is seen within one tick.
  const timespec tick = {0, 100 * 1000 * 1000};
  while ((options_.stop == nullptr || !options_.stop->requested()) && !refused_.requested()) {
    const int sig = sigtimedwait(&set, nullptr, &tick);
    if (sig == SIGTERM || sig == SIGINT) {
      LOG(INFO) << options_.name << " " << options_.instance_id << ": signal " << sig
                << ", draining";
      return sig;
    }
  }
  LOG(INFO) << options_.name << " " << options_.instance_id << ": stop requested, draining";
  return 0;
}

void StopRequest::Request(const absl::Status& why) {
  if (requested_.exchange(true, std::memory_order_acq_rel)) return;
  LOG(ERROR) << "out of service, stopping: " << why;
}

void ServiceProcess::Deregister() {
  if (registration_) registration_->Stop();
}

int ExitWithError(absl::string_view name, const absl::Status& status, int exit_code) {
  std::fprintf(stderr, "%.*s: %s\n", static_cast<int>(name.size()), name.data(),
               status.ToString().c_str());
  return exit_code;
}

int ExitWithUsage(absl::string_view name, absl::string_view message) {
  std::fprintf(stderr, "%.*s: %.*s\n", static_cast<int>(name.size()), name.data(),
               static_cast<int>(message.size()), message.data());
  return 2;
}

}  // namespace mmserve
