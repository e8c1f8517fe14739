// The internal plane's flags, shared by the router, encoder and language
// binaries: --internal_address (where the internal gRPC services listen) and
// --cluster_token_file (common/internal_plane.h).
//
//   if (absl::Status s = ConfigureInternalPlaneFromFlags(); !s.ok()) return ExitWithError(...);
//   options.grpc_address = InternalAddressFlag();  // "" when not given
//
// Call from main after flag parsing, before any channel exists.
#ifndef MMSERVE_COMMON_INTERNAL_PLANE_FLAGS_H_
#define MMSERVE_COMMON_INTERNAL_PLANE_FLAGS_H_

#include <string>

#include "absl/status/status.h"

namespace mmserve {

[[nodiscard]] absl::Status ConfigureInternalPlaneFromFlags();
std::string InternalAddressFlag();

}  // namespace mmserve

#endif  // MMSERVE_COMMON_INTERNAL_PLANE_FLAGS_H_
