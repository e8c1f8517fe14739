// ElasticEchoHold: which member's end an elastic group's call ends with.
#include "router/elastic_echo_hold.h"

#include <catch2/catch.hpp>
#include <functional>
#include <string>
#include <vector>

#include "transfer/elastic_echo.h"

namespace mmserve::router {
namespace {

using Next = ElasticEchoHold::Next;

grpc::Status Echo(grpc::StatusCode code) {
  return grpc::Status(code, "elastic exchange: " + std::string(transfer::kElasticEcho));
}

// Members whose streams are open: a cancel each.
std::vector<std::function<void()>> Open(const std::vector<bool>& open) {
  std::vector<std::function<void()>> cancels;
  for (bool o : open) cancels.push_back(o ? std::function<void()>([] {}) : nullptr);
  return cancels;
}

TEST_CASE("an echo waits while another member is open; the refusal's reason decides") {
  ElasticEchoHold hold;
  const grpc::Status refusal(grpc::StatusCode::INVALID_ARGUMENT, "temperature: must be >= 0");
  CHECK(hold.OnClosed(0, Echo(grpc::StatusCode::INVALID_ARGUMENT), Open({false, true, true})) ==
        Next::kHold);
  CHECK(hold.held_member() == 0);
  // A second echo keeps the first.
  CHECK(hold.OnClosed(2, Echo(grpc::StatusCode::INVALID_ARGUMENT), Open({false, true, false})) ==
        Next::kHold);
  CHECK(hold.held_member() == 0);
  CHECK(hold.OnClosed(1, refusal, Open({false, false, false})) == Next::kAsUsual);
}

TEST_CASE("the first echo ends the call once no other member can say why") {
  SECTION("the last member echoes too") {
    ElasticEchoHold hold;
    REQUIRE(hold.OnClosed(1, Echo(grpc::StatusCode::UNAVAILABLE), Open({true, false})) ==
            Next::kHold);
    CHECK(hold.OnClosed(0, Echo(grpc::StatusCode::INVALID_ARGUMENT), Open({false, false})) ==
          Next::kEndHeld);
    CHECK(hold.held_member() == 1);
    CHECK(hold.held().error_code() == grpc::StatusCode::UNAVAILABLE);
  }
  SECTION("the last member closes OK") {
    ElasticEchoHold hold;
    REQUIRE(hold.OnClosed(0, Echo(grpc::StatusCode::UNAVAILABLE), Open({false, true})) ==
            Next::kHold);
    CHECK(hold.OnClosed(1, grpc::Status::OK, Open({false, false})) == Next::kEndHeld);
  }
  SECTION("an echo with nobody open and nothing held is the end as usual") {
    ElasticEchoHold hold;
    CHECK(hold.OnClosed(0, Echo(grpc::StatusCode::UNAVAILABLE), Open({false})) == Next::kAsUsual);
  }
}

TEST_CASE("ends that are not echoes pass as usual") {
  ElasticEchoHold hold;
  CHECK(hold.OnClosed(0, grpc::Status(grpc::StatusCode::UNAVAILABLE, "member lost"),
                      Open({false, true})) == Next::kAsUsual);
  CHECK(hold.OnClosed(1, grpc::Status::OK, Open({true, false})) == Next::kAsUsual);
  // The echo's words inside a message are no echo.
  CHECK(hold.OnClosed(0, grpc::Status(grpc::StatusCode::INTERNAL, "a peer gave up: then more"),
                      Open({false, true})) == Next::kAsUsual);
  CHECK(hold.held().ok());
}

}  // namespace
}  // namespace mmserve::router
