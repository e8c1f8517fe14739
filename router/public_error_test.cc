#include "router/public_error.h"

#include <catch2/catch.hpp>
#include <string>

namespace mmserve::router {
namespace {

TEST_CASE("client errors keep their reason and carry the request id", "[public_error]") {
  for (const absl::Status& s :
       {absl::InvalidArgumentError("messages[0].content[1]: not an image"),
        absl::OutOfRangeError("max_tokens: 99999 is above 4096"),
        absl::NotFoundError("unknown model \"x\""), absl::UnimplementedError("n: only 1"),
        absl::UnauthenticatedError("a valid API key is required"),
        absl::PermissionDeniedError("not allowed"),
        absl::ResourceExhaustedError("prompt + max_tokens need 40 KV blocks, the pool has 32"),
        absl::CancelledError("cancelled by the client")}) {
    INFO(s);
    CHECK(IsClientError(s.code()));
    const absl::Status shown = PublicStatus(s, "req-1");
    CHECK(shown.code() == s.code());
    CHECK(shown.message() == s.message());
    CHECK(RequestIdOf(shown) == "req-1");
  }
}

TEST_CASE("failures of the service become a generic message by code with the request id",
          "[public_error]") {
  const std::string detail =
      "decode instance decode-0 failed: tensor-parallel instance (/mmserve-tp-decode-0-10428) "
      "is out of service; recvmsg:Connection reset by peer at 10.0.0.7:50061";
  struct Case {
    absl::StatusCode code;
    std::string message;
  };
  for (const Case& c : {
           Case{absl::StatusCode::kUnavailable, "the model backend failed; retry (request id r7)"},
           Case{absl::StatusCode::kDeadlineExceeded, "deadline exceeded (request id r7)"},
           Case{absl::StatusCode::kInternal, "internal error in the model backend (request id r7)"},
           Case{absl::StatusCode::kUnknown, "internal error in the model backend (request id r7)"},
           Case{absl::StatusCode::kDataLoss, "internal error in the model backend (request id r7)"},
           Case{absl::StatusCode::kAborted, "internal error in the model backend (request id r7)"},
           Case{absl::StatusCode::kAlreadyExists,
                "internal error in the model backend (request id r7)"},
           Case{absl::StatusCode::kFailedPrecondition,
                "internal error in the model backend (request id r7)"},
       }) {
    const absl::Status shown = PublicStatus(absl::Status(c.code, detail), "r7");
    INFO(shown);
    CHECK(!IsClientError(c.code));
    CHECK(shown.code() == c.code);
    CHECK(shown.message() == c.message);
    CHECK(RequestIdOf(shown) == "r7");
  }
}

TEST_CASE("OK stays OK, and a status never mapped has no request id", "[public_error]") {
  CHECK(PublicStatus(absl::OkStatus(), "r1").ok());
  CHECK(RequestIdOf(absl::OkStatus()).empty());
  CHECK(RequestIdOf(absl::UnavailableError("x")).empty());
}

TEST_CASE("only UNAVAILABLE and RESOURCE_EXHAUSTED ask the client to retry", "[public_error]") {
  CHECK(IsRetryable(absl::StatusCode::kUnavailable));
  CHECK(IsRetryable(absl::StatusCode::kResourceExhausted));
  for (absl::StatusCode code : {absl::StatusCode::kOk, absl::StatusCode::kInvalidArgument,
                                absl::StatusCode::kDeadlineExceeded, absl::StatusCode::kInternal,
                                absl::StatusCode::kCancelled, absl::StatusCode::kUnauthenticated}) {
    CHECK(!IsRetryable(code));
  }
}

}  // namespace
}  // namespace mmserve::router
