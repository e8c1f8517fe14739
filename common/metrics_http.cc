#include "common/metrics_http.h"

#include <httplib.h>
#include <sys/socket.h>

#include <chrono>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace mmserve::metrics {
namespace {

// Scrapes are rare and small: two connection threads instead of httplib's
// default of max(8, cores - 1).
constexpr size_t kConnectionThreads = 2;

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(const Registry& registry,
                                                                    const std::string& host,
                                                                    int port) {
  if (port < 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("metrics port out of range: ", port));
  }
  auto server = std::make_unique<httplib::Server>();
  // httplib takes ownership of the queue it gets from this factory (its API
  // hands back a raw pointer).
  server->new_task_queue = [] { return new httplib::ThreadPool(kConnectionThreads); };
  // httplib's default sets SO_REUSEPORT, which lets a second server (say, a
  // second service started with the same --metrics_port) bind the same port
  // silently and steal half the scrapes. SO_REUSEADDR alone still allows a
  // quick restart while a closed socket sits in TIME_WAIT.
  server->set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  server->set_keep_alive_timeout(2);
  server->set_read_timeout(5);
  server->set_write_timeout(5);
  server->Get("/metrics", [&registry](const httplib::Request&, httplib::Response& res) {
    res.set_content(registry.Render(), kPrometheusContentType);
  });

  int bound = port;
  if (port == 0) {
    bound = server->bind_to_any_port(host);
    if (bound < 0) {
      return absl::UnavailableError(
          absl::StrCat("metrics server: cannot bind ", host, " on any port"));
    }
  } else if (!server->bind_to_port(host, port)) {
    return absl::UnavailableError(
        absl::StrCat("metrics server: cannot bind ", host, ":", port, " (in use or bad address)"));
  }
  return std::unique_ptr<MetricsServer>(new MetricsServer(std::move(server), bound));
}

MetricsServer::MetricsServer(std::unique_ptr<httplib::Server> server, int port)
    : server_(std::move(server)), port_(port) {
  thread_ = std::thread([this] {
    if (!server_->listen_after_bind()) {
      LOG(ERROR) << "metrics server on port " << port_ << " failed";
    }
    listen_returned_.store(true);
  });
  // httplib's stop() does nothing until the accept loop has started, so wait
  // for it here: a server destroyed right after Start still shuts down.
  while (!server_->is_running() && !listen_returned_.load()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

MetricsServer::~MetricsServer() {
  server_->stop();
  thread_.join();
}

}  // namespace mmserve::metrics
