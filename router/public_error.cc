#include "router/public_error.h"

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"

namespace mmserve::router {

bool IsClientError(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kUnimplemented:
    case absl::StatusCode::kUnauthenticated:
    case absl::StatusCode::kPermissionDenied:
    case absl::StatusCode::kResourceExhausted:
    case absl::StatusCode::kCancelled:
      return true;
    default:
      return false;
  }
}

namespace {

constexpr char kRequestIdPayload[] = "type.mmserve.dev/request_id";

absl::Status Generic(const absl::Status& status, absl::string_view request_id) {
  const std::string id = absl::StrCat(" (request id ", request_id, ")");
  switch (status.code()) {
    case absl::StatusCode::kUnavailable:
      return absl::UnavailableError(absl::StrCat("the model backend failed; retry", id));
    case absl::StatusCode::kDeadlineExceeded:
      return absl::DeadlineExceededError(absl::StrCat("deadline exceeded", id));
    default:
      return absl::Status(status.code(), absl::StrCat("internal error in the model backend", id));
  }
}

}  // namespace

absl::Status PublicStatus(const absl::Status& status, absl::string_view request_id) {
  if (status.ok()) return status;
  absl::Status out = IsClientError(status.code()) ? absl::Status(status.code(), status.message())
                                                  : Generic(status, request_id);
  out.SetPayload(kRequestIdPayload, absl::Cord(request_id));
  return out;
}

std::string RequestIdOf(const absl::Status& status) {
  const auto id = status.GetPayload(kRequestIdPayload);
  return id ? std::string(*id) : std::string();
}

bool IsRetryable(absl::StatusCode code) {
  return code == absl::StatusCode::kUnavailable || code == absl::StatusCode::kResourceExhausted;
}

}  // namespace mmserve::router
