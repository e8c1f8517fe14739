// The one place absl::Status becomes grpc::Status (and back): service edges
// call these, nothing else does. Codes map one to one (both follow
// google.rpc.Code); messages are kept.
#ifndef MMSERVE_COMMON_GRPC_STATUS_H_
#define MMSERVE_COMMON_GRPC_STATUS_H_

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace mmserve {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace mmserve

#endif  // MMSERVE_COMMON_GRPC_STATUS_H_
