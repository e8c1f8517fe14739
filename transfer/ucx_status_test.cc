#include "transfer/ucx_status.h"

#include <catch2/catch.hpp>

namespace mmserve::transfer {
namespace {

ucs_status_t Fails() { return UCS_ERR_UNREACHABLE; }

TEST_CASE("UCX_CALL keeps OK and in-progress as OK") {
  CHECK(UCX_CALL(UCS_OK).ok());
  CHECK(UCX_CALL(UCS_INPROGRESS).ok());
}

TEST_CASE("UCX_CALL records the call text and file:line of a failure") {
  absl::Status s = UCX_CALL(Fails());
  CHECK(absl::IsUnavailable(s));
  CHECK(s.message().find("Fails()") != absl::string_view::npos);
  CHECK(s.message().find("ucx_status_test.cc:") != absl::string_view::npos);
}

TEST_CASE("UCX codes map to the architecture's error codes") {
  CHECK(UcxStatusCode(UCS_ERR_CONNECTION_RESET) == absl::StatusCode::kUnavailable);
  CHECK(UcxStatusCode(UCS_ERR_ENDPOINT_TIMEOUT) == absl::StatusCode::kUnavailable);
  CHECK(UcxStatusCode(UCS_ERR_TIMED_OUT) == absl::StatusCode::kDeadlineExceeded);
  CHECK(UcxStatusCode(UCS_ERR_CANCELED) == absl::StatusCode::kCancelled);
  CHECK(UcxStatusCode(UCS_ERR_NO_MEMORY) == absl::StatusCode::kResourceExhausted);
}

}  // namespace
}  // namespace mmserve::transfer
