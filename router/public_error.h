// What a client is told when its call fails: the one mapping from the
// status a call ends with (which may name instances, shared-memory
// segments, addresses, process ids or syscall errors) to the status the
// public gRPC and HTTP APIs return.
//
//   LOG(WARNING) << "request " << id << ": " << internal;   // the details
//   absl::Status shown = PublicStatus(internal, id);        // to the client
//
// Codes that say what was wrong with the request keep their reason:
// INVALID_ARGUMENT, OUT_OF_RANGE, NOT_FOUND, UNIMPLEMENTED, UNAUTHENTICATED,
// PERMISSION_DENIED, RESOURCE_EXHAUSTED (a limit or quota, e.g. "prompt +
// max_tokens need 40 KV blocks, the pool has 32") and CANCELLED (the
// client's own cancel). Every backend writes those reasons for clients.
// The others are failures of the service and become a short message by
// code plus the request id:
//   UNAVAILABLE        "the model backend failed; retry (request id ...)"
//   DEADLINE_EXCEEDED  "deadline exceeded (request id ...)"
//   anything else (INTERNAL, UNKNOWN, DATA_LOSS, ABORTED, FAILED_PRECONDITION:
//   a deployment or protocol fault, not the request's)
//                      "internal error in the model backend (request id ...)"
// docs/errors.md lists them for users.
//
// Thread-safe (pure functions).
#ifndef MMSERVE_ROUTER_PUBLIC_ERROR_H_
#define MMSERVE_ROUTER_PUBLIC_ERROR_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace mmserve::router {

// gRPC metadata key (trailing) and HTTP header carrying a call's request id.
inline constexpr char kRequestIdMetadata[] = "x-request-id";
inline constexpr char kRequestIdHeader[] = "X-Request-Id";

// Whether `code` keeps its reason at the public edge (the request's fault).
bool IsClientError(absl::StatusCode code);

// The status a client sees for `status`, the end of call `request_id`: OK
// unchanged; client errors keep their reason, failures of the service get a
// generic one. A non-OK result carries the request id (RequestIdOf), which
// the front ends send as kRequestIdMetadata / kRequestIdHeader.
absl::Status PublicStatus(const absl::Status& status, absl::string_view request_id);

// The request id PublicStatus attached to `status`; "" when none.
std::string RequestIdOf(const absl::Status& status);

// Whether a client should retry a call that ended with `code` after a pause:
// UNAVAILABLE and RESOURCE_EXHAUSTED, answered with HTTP Retry-After and gRPC
// trailing metadata "retry-after" (kRetryAfterSeconds).
bool IsRetryable(absl::StatusCode code);

}  // namespace mmserve::router

#endif  // MMSERVE_ROUTER_PUBLIC_ERROR_H_
