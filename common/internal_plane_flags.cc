#include "common/internal_plane_flags.h"

#include "absl/flags/flag.h"
#include "common/internal_plane.h"

ABSL_FLAG(std::string, internal_address, "",
          "host:port of the internal gRPC services (router: Registry, never on the public port; "
          "empty: --host with --port + 1; encoder and language: their services, instead of "
          "--host:--port)");
ABSL_FLAG(std::string, cluster_token_file, "",
          "file whose first line is the cluster token every internal call carries and every "
          "internal service requires (empty: none)");

ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate chain: TLS on this process's gRPC servers (and the router's HTTP)");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA of every process's certificate: mutual TLS on the internal plane");

namespace mmserve {

absl::Status ConfigureInternalPlaneFromFlags() {
  return ConfigureInternalPlane({.cluster_token_file = absl::GetFlag(FLAGS_cluster_token_file),
                                 .tls_cert_file = absl::GetFlag(FLAGS_tls_cert),
                                 .tls_key_file = absl::GetFlag(FLAGS_tls_key),
                                 .tls_ca_file = absl::GetFlag(FLAGS_tls_ca)});
}

std::string InternalAddressFlag() { return absl::GetFlag(FLAGS_internal_address); }

}  // namespace mmserve
