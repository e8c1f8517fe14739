#include "transfer/ucx_status.h"

#include "absl/strings/str_cat.h"

namespace mmserve::transfer {

absl::StatusCode UcxStatusCode(ucs_status_t status) {
  switch (status) {
    case UCS_OK:
    case UCS_INPROGRESS:
      return absl::StatusCode::kOk;
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_ENDPOINT_TIMEOUT:
    case UCS_ERR_REJECTED:
    case UCS_ERR_NOT_CONNECTED:
    case UCS_ERR_IO_ERROR:
    case UCS_ERR_SOME_CONNECTS_FAILED:
      return absl::StatusCode::kUnavailable;
    case UCS_ERR_TIMED_OUT:
      return absl::StatusCode::kDeadlineExceeded;
    case UCS_ERR_NO_MEMORY:
    case UCS_ERR_NO_RESOURCE:
    case UCS_ERR_EXCEEDS_LIMIT:
      return absl::StatusCode::kResourceExhausted;
    case UCS_ERR_CANCELED:
      return absl::StatusCode::kCancelled;
    case UCS_ERR_INVALID_PARAM:
    case UCS_ERR_INVALID_ADDR:
    case UCS_ERR_MESSAGE_TRUNCATED:
      return absl::StatusCode::kInvalidArgument;
    case UCS_ERR_UNSUPPORTED:
      return absl::StatusCode::kUnimplemented;
    case UCS_ERR_NO_ELEM:
      return absl::StatusCode::kNotFound;
    default:
      return absl::StatusCode::kInternal;
  }
}

absl::Status UcxStatus(ucs_status_t status, absl::string_view what) {
  absl::StatusCode code = UcxStatusCode(status);
  if (code == absl::StatusCode::kOk) return absl::OkStatus();
  return absl::Status(code, absl::StrCat(what, ": ", ucs_status_string(status)));
}

namespace ucx_internal {

absl::Status UcxCallStatus(ucs_status_t status, const char* call, const char* file, int line) {
  if (UcxStatusCode(status) == absl::StatusCode::kOk) return absl::OkStatus();
  return UcxStatus(status, absl::StrCat(call, " at ", file, ":", line));
}

}  // namespace ucx_internal
}  // namespace mmserve::transfer
