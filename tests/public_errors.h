// Checks that what a client sees when its call fails says nothing about the
// deployment: no process id, shared-memory or segment name, instance id,
// address or syscall error; failures of the service carry the request id.
//
//   const std::vector<std::string> internals = StackInternals(*stack);  // before a kill
//   ...
//   absl::Status s = CheckPublicError(end.status, end.request_id, internals);
//   INFO(s);
//   CHECK(s.ok());
#ifndef MMSERVE_TESTS_PUBLIC_ERRORS_H_
#define MMSERVE_TESTS_PUBLIC_ERRORS_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "deploy/launcher/local_stack.h"

namespace mmserve::testing {

// What identifies the stack's processes: every instance id, process id (and
// each child's, the TP ranks), gRPC address and port, metrics port. Take it
// before a kill.
std::vector<std::string> StackInternals(launcher::LocalStack& stack);

// The first fragment of `message` that tells about the deployment, or ""
// when none: one of `internals` (a number only as a whole number), an
// instance id ("decode-0"), /dev/shm or an mmserve segment name, an IP
// address or host:port, gRPC's address schemes, a syscall name, or any
// errno's strerror text. `request_id` (chosen by the client, or assigned)
// is left out first.
std::string InternalDetail(absl::string_view message, absl::string_view request_id,
                           const std::vector<std::string>& internals);

// OK when `status`, as a client saw it with `request_id` from the
// x-request-id metadata or X-Request-Id header, is a public error: a
// request id was sent; a failure of the service (not a client error) names
// it in its message; and nothing in the message tells about the deployment.
absl::Status CheckPublicError(const absl::Status& status, absl::string_view request_id,
                              const std::vector<std::string>& internals);

}  // namespace mmserve::testing

#endif  // MMSERVE_TESTS_PUBLIC_ERRORS_H_
