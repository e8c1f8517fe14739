// Trust on the internal plane (Registry, Encoder, Language: the services only
// mmserve processes call): an optional cluster token, a shared secret every
// internal call carries as metadata "x-mmserve-cluster-token" and every
// internal handler checks, and optional TLS: with a certificate and key the
// process's servers speak TLS, and with a CA too the internal plane is
// mutual TLS (servers require client certificates from the CA, channels
// present theirs and verify servers against the CA). Configured once per
// process, before any internal channel or server exists; InternalChannel
// (common/grpc_server.h) uses the credentials and attaches the token.
//
//   // main, after flag parsing:
//   RETURN_IF_ERROR(ConfigureInternalPlane({.cluster_token_file = flag}));
//   // every internal unary handler is one ServeInternal call:
//   return ServeInternal(ctx, [&] { return ToGrpcStatus(core_.CommitKv(*request)); });
//   // a service's streams open through one function of the service that
//   // calls CheckClusterToken(*ctx) first.
//
// The check sits in that one entry per service, not before the handlers,
// because gRPC C++ offers no place before them that can refuse a call with a
// status: server interceptors cannot fail an RPC, and an
// AuthMetadataProcessor works only on TLS servers. A handler that does not
// go through it fails tests/stack_security_test.cc, which calls every method
// of every internal service (from the proto descriptors) without the token.
//
// A wrong or missing token is UNAUTHENTICATED; the token is never logged or
// echoed. Thread-safe after ConfigureInternalPlane.
#ifndef MMSERVE_COMMON_INTERNAL_PLANE_H_
#define MMSERVE_COMMON_INTERNAL_PLANE_H_

#include <memory>
#include <string>
#include <type_traits>
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
  // PEM files: this process's certificate chain and key, and the CA that
  // signs every process's certificate (empty: no TLS / no mutual TLS).
  std::string tls_cert_file;
  std::string tls_key_file;
  std::string tls_ca_file;
};

// Reads the token. INVALID_ARGUMENT for an empty token file or a token with
// characters metadata cannot carry; NOT_FOUND for a missing file.
[[nodiscard]] absl::Status ConfigureInternalPlane(const InternalPlaneOptions& options);

// OK when no token is configured or the call carries it.
[[nodiscard]] absl::Status CheckClusterToken(const grpc::ServerContextBase& ctx);

// Null when the call may proceed, else the call's reactor, already finished
// with UNAUTHENTICATED.
grpc::ServerUnaryReactor* RefuseUnlessCluster(grpc::CallbackServerContext* ctx);

// The one entry of an internal unary handler: UNAUTHENTICATED without the
// cluster token, else `body` runs. A body that returns a grpc::Status
// finishes the call with it; one that returns the call's reactor finishes
// it itself (later, for an answer that comes from another thread).
template <typename Body>
grpc::ServerUnaryReactor* ServeInternal(grpc::CallbackServerContext* ctx, Body&& body) {
  if (grpc::ServerUnaryReactor* refused = RefuseUnlessCluster(ctx)) return refused;
  if constexpr (std::is_same_v<decltype(body()), grpc::ServerUnaryReactor*>) {
    return body();
  } else {
    const grpc::Status status = body();
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    reactor->Finish(status);
    return reactor;
  }
}

// Credentials for an internal-plane server: mutual TLS with a CA, TLS with
// only a certificate, else plaintext.
std::shared_ptr<grpc::ServerCredentials> InternalServerCredentials();
// Credentials for a public server (the router's): TLS when a certificate is
// configured (no client certificate asked), else plaintext.
std::shared_ptr<grpc::ServerCredentials> PublicServerCredentials();
// Credentials InternalChannel uses: TLS verified against the CA, with this
// process's certificate as the client's, when a CA is configured; else
// plaintext.
std::shared_ptr<grpc::ChannelCredentials> InternalChannelCredentials();
// The configured certificate and key files ("" when none).
std::string TlsCertFile();
std::string TlsKeyFile();

// The interceptors InternalChannel adds: the token on every call (none when
// no token is configured).
std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>>
InternalClientInterceptors();

}  // namespace mmserve

#endif  // MMSERVE_COMMON_INTERNAL_PLANE_H_
