// UCX return codes as absl::Status, with the failing call's text and place.
//
//   RETURN_IF_ERROR(UCX_CALL(ucp_worker_create(context, &params, &worker)));
//   absl::Status s = UcxStatus(UCS_ERR_UNREACHABLE, "send to peer");
//
// UCX_CALL evaluates a ucs_status_t expression once; UCS_OK and
// UCS_INPROGRESS are OK, anything else becomes an error whose message is
// "<call text> at <file>:<line>: <ucs_status_string>". Codes:
// a lost peer -> UNAVAILABLE, a timeout ->
// DEADLINE_EXCEEDED, out of memory -> RESOURCE_EXHAUSTED, a cancelled request
// -> CANCELLED, bad arguments -> INVALID_ARGUMENT, the rest -> INTERNAL.
// Thread-safe (pure functions).
#ifndef MMSERVE_TRANSFER_UCX_STATUS_H_
#define MMSERVE_TRANSFER_UCX_STATUS_H_

#include <ucs/type/status.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace mmserve::transfer {

// The absl code a UCX status maps to (kOk for UCS_OK and UCS_INPROGRESS).
absl::StatusCode UcxStatusCode(ucs_status_t status);

// An absl::Status for `status` describing `what` (e.g. the call text).
[[nodiscard]] absl::Status UcxStatus(ucs_status_t status, absl::string_view what);

namespace ucx_internal {
[[nodiscard]] absl::Status UcxCallStatus(ucs_status_t status, const char* call, const char* file,
                                         int line);
}  // namespace ucx_internal

}  // namespace mmserve::transfer

#define UCX_CALL(expr) \
  ::mmserve::transfer::ucx_internal::UcxCallStatus((expr), #expr, __FILE__, __LINE__)

#endif  // MMSERVE_TRANSFER_UCX_STATUS_H_
