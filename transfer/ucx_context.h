// A UCX context configured for one transport profile.
//
//   ASSIGN_OR_RETURN(std::unique_ptr<UcxContext> ctx, UcxContext::Create(TransportProfile::kShm));
//   ASSIGN_OR_RETURN(std::unique_ptr<UcxWorker> worker, UcxWorker::Create(*ctx, "encoder-0"));
//
// Profiles:
//   kTcp: UCX_TLS=tcp,self; endpoints use UCP_ERR_HANDLING_MODE_PEER, so a dead
//         peer fails its operations within ~0.1 s. Works across hosts.
//   kShm: shared memory (posix, sysv, cma) + self; error mode NONE (PEER would
//         disable shm in UCX 1.13), so a dead peer is caught by our deadlines.
//         Same host and same IPC namespace: the transfer engine's buffer is a
//         SysV segment its peers attach (containers: `ipc: host` or a shared
//         `ipc:` mode in docker-compose).
// Transports are set per context with ucp_config_modify, never through the
// environment, so both profiles can live in one process. The context outlives
// every worker, endpoint and registration made from it. Thread-safe
// (mt_workers_shared).
#ifndef MMSERVE_TRANSFER_UCX_CONTEXT_H_
#define MMSERVE_TRANSFER_UCX_CONTEXT_H_

#include <ucp/api/ucp.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace mmserve::transfer {

enum class TransportProfile { kTcp, kShm };

[[nodiscard]] absl::StatusOr<TransportProfile> ParseTransportProfile(absl::string_view name);
const char* TransportProfileName(TransportProfile profile);
// The UCX_TLS value a profile uses.
const char* TransportProfileTls(TransportProfile profile);
// The endpoint error mode a profile uses.
ucp_err_handling_mode_t TransportProfileErrMode(TransportProfile profile);

// Who can map this process's shared memory: "boot:<boot id> ipc:<IPC
// namespace inode>". Two processes with the same identity share a kernel and
// an IPC namespace (containers with `ipc: host` or `ipc: service:...` do,
// whatever their host names); peers advertise it in UcxPeer.host.
const std::string& HostIdentity();
// FAILED_PRECONDITION when `profile` is shm and `peer_host` (a peer's
// HostIdentity, empty: not advertised) is another host's: the shm profile
// only works between processes of one host and IPC namespace.
[[nodiscard]] absl::Status CheckSameHost(TransportProfile profile, absl::string_view peer_host,
                                         absl::string_view peer);

class UcxContext {
 public:
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<UcxContext>> Create(TransportProfile profile);
  ~UcxContext();
  UcxContext(const UcxContext&) = delete;
  UcxContext& operator=(const UcxContext&) = delete;

  ucp_context_h get() const { return context_; }
  TransportProfile profile() const { return profile_; }

 private:
  UcxContext(ucp_context_h context, TransportProfile profile)
      : context_(context), profile_(profile) {}
  ucp_context_h context_;
  TransportProfile profile_;
};

}  // namespace mmserve::transfer

#endif  // MMSERVE_TRANSFER_UCX_CONTEXT_H_
