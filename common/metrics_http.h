// Serves a metrics::Registry as Prometheus text on GET /metrics.
//
//   metrics::Registry registry;
//   ASSIGN_OR_RETURN(std::unique_ptr<metrics::MetricsServer> server,
//                    metrics::MetricsServer::Start(registry, "0.0.0.0", flag_metrics_port));
//   LOG(INFO) << "metrics on port " << server->port();
//   ...
//   server.reset();  // stops accepting and joins the serving threads
//
// The server (cpp-httplib) runs on its own listening thread plus a small pool
// for connections; a scrape renders the registry on a pool thread. Any other
// path answers 404. The registry must outlive the server. Thread-safety:
// port() is thread-safe; destroy the server from one thread.
#ifndef MMSERVE_COMMON_METRICS_HTTP_H_
#define MMSERVE_COMMON_METRICS_HTTP_H_

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "common/metrics.h"

namespace httplib {
class Server;
}  // namespace httplib

namespace mmserve::metrics {

// Content-Type of the text exposition format.
inline constexpr char kPrometheusContentType[] = "text/plain; version=0.0.4; charset=utf-8";

class MetricsServer {
 public:
  // Binds host:port (port 0 picks a free one) and starts serving. A failed
  // bind (port in use, bad address) is UNAVAILABLE with the address in the
  // message; a port outside 0..65535 is INVALID_ARGUMENT.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(
      const Registry& registry, const std::string& host, int port);

  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;
  // Stops the server and joins its threads.
  ~MetricsServer();

  // The bound port (the chosen one when Start was given 0).
  int port() const { return port_; }

 private:
  MetricsServer(std::unique_ptr<httplib::Server> server, int port);

  std::unique_ptr<httplib::Server> server_;
  int port_;
  std::atomic<bool> listen_returned_{false};
  std::thread thread_;
};

}  // namespace mmserve::metrics

#endif  // MMSERVE_COMMON_METRICS_HTTP_H_
