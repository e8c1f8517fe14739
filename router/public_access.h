// Who may use the router's public API, and how much at once: API keys
// (HTTP "Authorization: Bearer <key>", gRPC metadata "authorization" with the
// same value) and a cap on each client's concurrent calls. Both front ends
// (router_service.cc, http_frontend.cc) ask the same object.
//
//   ASSIGN_OR_RETURN(std::vector<std::string> keys, LoadApiKeys(flag_keys, key_file));
//   PublicAccess access({.api_keys = keys, .max_calls_per_client = 64});
//   RETURN_IF_ERROR(access.Authenticate(authorization_header));
//   ASSIGN_OR_RETURN(PublicAccess::Lease lease,
//                    access.Admit(access.ClientOf(authorization_header, PeerHost(peer))));
//   // keep `lease` until the call ends
//
// Keys are compared in constant time and never logged or echoed in errors.
// Thread-safe.
#ifndef MMSERVE_ROUTER_PUBLIC_ACCESS_H_
#define MMSERVE_ROUTER_PUBLIC_ACCESS_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace mmserve::router {

// Seconds a refused client is told to wait (HTTP Retry-After, gRPC trailing
// metadata "retry-after").
inline constexpr int kRetryAfterSeconds = 1;

// The keys of --api_key (each) and --api_key_file (one a line; blank lines
// and lines starting with '#' skipped). INVALID_ARGUMENT for an empty key or
// one with whitespace inside; the message never holds a key.
[[nodiscard]] absl::StatusOr<std::vector<std::string>> LoadApiKeys(
    const std::vector<std::string>& keys, const std::string& key_file);

// "1.2.3.4" from gRPC's "ipv4:1.2.3.4:5678", "::1" from "ipv6:[::1]:5678";
// anything else unchanged.
std::string PeerHost(absl::string_view grpc_peer);

struct PublicAccessOptions {
  std::vector<std::string> api_keys;  // empty: no key needed
  int max_calls_per_client = 0;       // 0: no cap
};

class PublicAccess {
 public:
  // Held for a call's life; releasing it frees the client's slot.
  using Lease = std::shared_ptr<void>;

  explicit PublicAccess(PublicAccessOptions options);

  bool keys_required() const { return !options_.api_keys.empty(); }
  // OK when no keys are set or `authorization` is "Bearer <one of them>";
  // UNAUTHENTICATED otherwise.
  [[nodiscard]] absl::Status Authenticate(absl::string_view authorization) const;
  // The client a call counts against: its key (when keys are set) or its
  // host.
  std::string ClientOf(absl::string_view authorization, absl::string_view host) const;
  // A slot for one call of `client`; RESOURCE_EXHAUSTED when it already has
  // max_calls_per_client calls running.
  [[nodiscard]] absl::StatusOr<Lease> Admit(const std::string& client);
  // Calls running for `client` (tests).
  int Running(const std::string& client) const;

 private:
  void Release(const std::string& client);

  const PublicAccessOptions options_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, int> running_ ABSL_GUARDED_BY(mu_);
};

}  // namespace mmserve::router

#endif  // MMSERVE_ROUTER_PUBLIC_ACCESS_H_
