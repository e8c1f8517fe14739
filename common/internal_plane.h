// Trust on the internal plane (Registry, Encoder, Language: the services only
// mmserve processes call): an optional cluster token, a shared secret every
// internal call carries as metadata "x-mmserve-cluster-token" and every
// internal handler checks. Configured once per process, before any internal
// channel or server exists; InternalChannel (common/grpc_server.h) attaches
// the token to every call it makes.
//
//   // main, after flag parsing:
//   RETURN_IF_ERROR(ConfigureInternalPlane({.cluster_token_file = flag}));
//   // every internal unary handler, first thing:
//   if (auto* refused = RefuseUnlessCluster(ctx)) return refused;
//   // streaming handlers: if (absl::Status s = CheckClusterToken(*ctx); !s.ok()) ...
//
// A wrong or missing token is UNAUTHENTICATED; the token is never logged or
// echoed. Thread-safe after ConfigureInternalPlane.
#ifndef MMSERVE_COMMON_INTERNAL_PLANE_H_
#define MMSERVE_COMMON_INTERNAL_PLANE_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/support/client_interceptor.h"

namespace mmserve {

inline constexpr char kClusterTokenMetadata[] = "x-mmserve-cluster-token";

struct InternalPlaneOptions {
  // A file whose first line is the token; empty: no token.
  std::string cluster_token_file;
  // The token itself (tests); used when cluster_token_file is empty.
  std::string cluster_token;
};

// Reads the token. INVALID_ARGUMENT for an empty token file or a token with
// characters metadata cannot carry; NOT_FOUND for a missing file.
[[nodiscard]] absl::Status ConfigureInternalPlane(const InternalPlaneOptions& options);

// OK when no token is configured or the call carries it.
[[nodiscard]] absl::Status CheckClusterToken(const grpc::ServerContextBase& ctx);

// Null when the call may proceed, else the call's reactor, already finished
// with UNAUTHENTICATED.
grpc::ServerUnaryReactor* RefuseUnlessCluster(grpc::CallbackServerContext* ctx);

// The interceptors InternalChannel adds: the token on every call (none when
// no token is configured).
std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>>
InternalClientInterceptors();

}  // namespace mmserve

#endif  // MMSERVE_COMMON_INTERNAL_PLANE_H_
