#include "common/metrics_http.h"

#include <httplib.h>

#include <catch2/catch.hpp>
#include <memory>
#include <string>

namespace mmserve::metrics {
namespace {

TEST_CASE("MetricsServer on port 0 serves the registry on GET /metrics", "[metrics_http]") {
  Registry registry;
  Counter& requests = registry.GetCounter("mmserve_test_requests_total", "Requests.");
  requests.Increment(5);

  absl::StatusOr<std::unique_ptr<MetricsServer>> server =
      MetricsServer::Start(registry, "127.0.0.1", 0);
  REQUIRE(server.ok());
  int port = (*server)->port();
  CHECK(port > 0);

  httplib::Client client("127.0.0.1", port);
  client.set_connection_timeout(5);
  client.set_read_timeout(5);
  httplib::Result res = client.Get("/metrics");
  REQUIRE(res);
  CHECK(res->status == 200);
  CHECK(res->get_header_value("Content-Type") == kPrometheusContentType);
  CHECK(res->body == registry.Render());
  CHECK(res->body.find("mmserve_test_requests_total 5\n") != std::string::npos);

  // Every scrape renders the registry afresh.
  requests.Increment();
  res = client.Get("/metrics");
  REQUIRE(res);
  CHECK(res->body.find("mmserve_test_requests_total 6\n") != std::string::npos);

  res = client.Get("/elsewhere");
  REQUIRE(res);
  CHECK(res->status == 404);
}

TEST_CASE("MetricsServer reports a port in use as a Status", "[metrics_http]") {
  Registry registry;
  auto first = MetricsServer::Start(registry, "127.0.0.1", 0);
  REQUIRE(first.ok());
  auto second = MetricsServer::Start(registry, "127.0.0.1", (*first)->port());
  REQUIRE_FALSE(second.ok());
  CHECK(second.status().code() == absl::StatusCode::kUnavailable);
  CHECK(second.status().message().find(std::to_string((*first)->port())) != std::string::npos);

  CHECK(MetricsServer::Start(registry, "127.0.0.1", 70000).status().code() ==
        absl::StatusCode::kInvalidArgument);
  // An address this host does not have (TEST-NET-1).
  CHECK_FALSE(MetricsServer::Start(registry, "192.0.2.1", 0).ok());
}

TEST_CASE("MetricsServer stops promptly when destroyed right after Start", "[metrics_http]") {
  Registry registry;
  for (int i = 0; i < 5; ++i) {
    auto server = MetricsServer::Start(registry, "127.0.0.1", 0);
    REQUIRE(server.ok());
  }  // each destructor must join, not hang
  // And the port is free again after the server is gone.
  int port;
  {
    auto server = MetricsServer::Start(registry, "127.0.0.1", 0);
    REQUIRE(server.ok());
    port = (*server)->port();
  }
  auto again = MetricsServer::Start(registry, "127.0.0.1", port);
  CHECK(again.ok());
}

}  // namespace
}  // namespace mmserve::metrics
