// A process's identity and the liveness check: this process is alive, a
// child is alive until SIGKILLed, gone while a zombie and after it is
// reaped; a reused pid (another start time) is gone; an identity of
// another boot or pid namespace, or an empty one, is unknown.
#include "transfer/peer_liveness.h"

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>

extern char** environ;

namespace mmserve::transfer {
namespace {

pid_t SpawnSleeper() {
  char sleep_path[] = "/bin/sleep";
  char seconds[] = "60";
  char* argv[] = {sleep_path, seconds, nullptr};
  pid_t pid = -1;
  REQUIRE(posix_spawn(&pid, argv[0], nullptr, nullptr, argv, environ) == 0);
  return pid;
}

TEST_CASE("this process is alive under its own identity", "[liveness]") {
  const ProcessIdentity& self = SelfProcessIdentity();
  REQUIRE(self.known());
  CHECK(self.pid == getpid());
  CHECK(self.start_ticks != 0);
  CHECK(self.boot_id.size() == 36);
  CHECK(LocalProcessIdentity(getpid()) == self);
  CHECK(CheckPeerProcess(self) == PeerState::kAlive);
}

TEST_CASE("a killed child is gone as a zombie and after it is reaped", "[liveness]") {
  const pid_t pid = SpawnSleeper();
  const ProcessIdentity child = LocalProcessIdentity(pid);
  REQUIRE(child.known());
  CHECK(CheckPeerProcess(child) == PeerState::kAlive);
  REQUIRE(kill(pid, SIGKILL) == 0);
  // Not reaped yet: a zombie once the signal is delivered.
  siginfo_t info{};
  REQUIRE(waitid(P_PID, pid, &info, WEXITED | WNOWAIT) == 0);
  CHECK(CheckPeerProcess(child) == PeerState::kGone);
  REQUIRE(waitpid(pid, nullptr, 0) == pid);
  CHECK(CheckPeerProcess(child) == PeerState::kGone);
}

TEST_CASE("a reused pid is gone; another boot, namespace or no identity is unknown", "[liveness]") {
  ProcessIdentity reused = SelfProcessIdentity();
  reused.start_ticks += 1;  // this pid, but a process started at another time
  CHECK(CheckPeerProcess(reused) == PeerState::kGone);
  ProcessIdentity other_boot = SelfProcessIdentity();
  other_boot.boot_id[0] = other_boot.boot_id[0] == '0' ? '1' : '0';
  CHECK(CheckPeerProcess(other_boot) == PeerState::kUnknown);
  ProcessIdentity other_ns = SelfProcessIdentity();
  other_ns.pid_namespace += 1;
  CHECK(CheckPeerProcess(other_ns) == PeerState::kUnknown);
  CHECK(CheckPeerProcess(ProcessIdentity()) == PeerState::kUnknown);
  ProcessIdentity unread = SelfProcessIdentity();
  unread.start_ticks = 0;  // no start time: the pid alone decides
  CHECK(CheckPeerProcess(unread) == PeerState::kAlive);
}

}  // namespace
}  // namespace mmserve::transfer
