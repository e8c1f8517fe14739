// Whether a peer process on this host is still alive: the dead-peer check
// for transfers whose transport does not report one (the elastic
// boards over the shm profile).
//
//   const ProcessIdentity me = SelfProcessIdentity();   // sent to the peers
//   ...
//   if (CheckPeerProcess(peer) == PeerState::kGone) { /* end the wait: UNAVAILABLE */ }
//
// Why this and not UCX: UCX 1.13 reports a dead peer only in error mode
// PEER, which disables its shared-memory transports,
// and keepalive needs that mode too. A peer that shares our shared memory
// shares the host's kernel, so the kernel can answer instead: a process
// identity is {boot id, pid namespace, pid, start time}. The boot id names
// the kernel run (another host or a reboot differs), the pid namespace
// makes the pid mean the same process to both sides (containers with
// their own pid namespace differ), and the start time (field 22 of
// /proc/<pid>/stat, clock ticks since boot) tells a reused pid apart.
//
// CheckPeerProcess says kGone only when it is sure: kill(pid, 0) gives
// ESRCH, or /proc/<pid>/stat shows another start time or a zombie (a
// SIGKILLed child its parent has not reaped yet). It says kUnknown when the
// identity is empty or from another boot or pid namespace (the caller keeps
// its deadlines: across hosts UCX tcp reports lost peers itself), and never
// guesses from an unreadable /proc (hidepid): kAlive or kUnknown then.
// Cost: one kill(2) and one small /proc read, a few microseconds; callers
// check at an interval (tens of milliseconds), not per poll.
// Thread-safety: every function is thread-safe.
#ifndef MMSERVE_TRANSFER_PEER_LIVENESS_H_
#define MMSERVE_TRANSFER_PEER_LIVENESS_H_

#include <sys/types.h>

#include <cstdint>
#include <string>

#include "absl/time/time.h"

namespace mmserve::transfer {

// How often a wait on peers checks their processes (ucx_notice_board.h).
inline constexpr absl::Duration kLivenessInterval = absl::Milliseconds(50);

struct ProcessIdentity {
  std::string boot_id;         // /proc/sys/kernel/random/boot_id; empty: unknown
  uint64_t pid_namespace = 0;  // inode of /proc/self/ns/pid
  int32_t pid = 0;
  uint64_t start_ticks = 0;  // 0: not read (no pid-reuse check)
  bool known() const { return pid > 0 && !boot_id.empty() && pid_namespace != 0; }
  bool operator==(const ProcessIdentity& o) const {
    return boot_id == o.boot_id && pid_namespace == o.pid_namespace && pid == o.pid &&
           start_ticks == o.start_ticks;
  }
};

// This process's identity (read once; empty fields where /proc is absent).
const ProcessIdentity& SelfProcessIdentity();
// The identity of process `pid` of this host and pid namespace, as it would
// give it itself (tests hand a child's to a board).
ProcessIdentity LocalProcessIdentity(pid_t pid);

enum class PeerState { kAlive, kGone, kUnknown };
PeerState CheckPeerProcess(const ProcessIdentity& peer);

}  // namespace mmserve::transfer

#endif  // MMSERVE_TRANSFER_PEER_LIVENESS_H_
