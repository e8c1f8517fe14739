#include "common/grpc_status.h"

#include <catch2/catch.hpp>

namespace mmserve {
namespace {

TEST_CASE("the status codes the services use map to the same gRPC codes", "[grpc_status]") {
  struct Case {
    absl::Status in;
    grpc::StatusCode want;
  };
  Case cases[] = {
      {absl::InvalidArgumentError("bad image"), grpc::StatusCode::INVALID_ARGUMENT},
      {absl::ResourceExhaustedError("pool full"), grpc::StatusCode::RESOURCE_EXHAUSTED},
      {absl::UnavailableError("peer died"), grpc::StatusCode::UNAVAILABLE},
      {absl::DeadlineExceededError("late"), grpc::StatusCode::DEADLINE_EXCEEDED},
      {absl::CancelledError("client went away"), grpc::StatusCode::CANCELLED},
      {absl::NotFoundError("no such model"), grpc::StatusCode::NOT_FOUND},
      {absl::InternalError("bug"), grpc::StatusCode::INTERNAL},
  };
  for (const Case& c : cases) {
    grpc::Status g = ToGrpcStatus(c.in);
    CHECK(g.error_code() == c.want);
    CHECK(g.error_message() == std::string(c.in.message()));
    absl::Status back = FromGrpcStatus(g);
    CHECK(back == c.in);
  }
  CHECK(ToGrpcStatus(absl::OkStatus()).ok());
  CHECK(FromGrpcStatus(grpc::Status::OK).ok());
}

}  // namespace
}  // namespace mmserve
