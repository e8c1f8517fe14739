#include "common/internal_plane_flags.h"

#include "absl/flags/flag.h"
#include "common/internal_plane.h"

ABSL_FLAG(std::string, internal_address, "",
          "host:port of the internal gRPC services (router: Registry, off the public port; "
          "encoder and language: their services, instead of --host:--port)");
ABSL_FLAG(std::string, cluster_token_file, "",
          "file whose first line is the cluster token every internal call carries and every "
          "internal service requires (empty: none)");

namespace mmserve {

absl::Status ConfigureInternalPlaneFromFlags() {
  return ConfigureInternalPlane({.cluster_token_file = absl::GetFlag(FLAGS_cluster_token_file)});
}

std::string InternalAddressFlag() { return absl::GetFlag(FLAGS_internal_address); }

}  // namespace mmserve
