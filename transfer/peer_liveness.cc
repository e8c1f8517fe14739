#include "transfer/peer_liveness.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace mmserve::transfer {
namespace {

// A small /proc file's text; empty when it cannot be read.
std::string ReadSmall(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return {};
  char buf[1024];
  std::string out;
  for (;;) {
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  return out;
}

// The state letter and start time of /proc/<pid>/stat; false when it
// cannot be read or parsed. The command name may hold spaces and ')': the
// fields start after the last ')'.
bool ReadStat(pid_t pid, char* state, uint64_t* start_ticks) {
  const std::string text = ReadSmall(absl::StrCat("/proc/", pid, "/stat"));
  const size_t close_paren = text.rfind(')');
  if (close_paren == std::string::npos) return false;
  const std::vector<absl::string_view> fields =
      absl::StrSplit(absl::string_view(text).substr(close_paren + 1), ' ', absl::SkipEmpty());
  // fields[0] is field 3 (state), so field 22 (starttime) is fields[19].
  if (fields.size() < 20 || fields[0].empty()) return false;
  *state = fields[0][0];
  return absl::SimpleAtoi(fields[19], start_ticks);
}

uint64_t PidNamespace() {
  struct stat st;
  return stat("/proc/self/ns/pid", &st) == 0 ? static_cast<uint64_t>(st.st_ino) : 0;
}

}  // namespace

ProcessIdentity LocalProcessIdentity(pid_t pid) {
  static const std::string* boot_id =
      new std::string(absl::StripAsciiWhitespace(ReadSmall("/proc/sys/kernel/random/boot_id")));
  ProcessIdentity id;
  id.boot_id = *boot_id;
  id.pid_namespace = PidNamespace();
  id.pid = static_cast<int32_t>(pid);
  char state = 0;
  if (!ReadStat(pid, &state, &id.start_ticks)) id.start_ticks = 0;
  return id;
}

const ProcessIdentity& SelfProcessIdentity() {
  static const ProcessIdentity* self = new ProcessIdentity(LocalProcessIdentity(getpid()));
  return *self;
}

PeerState CheckPeerProcess(const ProcessIdentity& peer) {
  const ProcessIdentity& self = SelfProcessIdentity();
  if (!peer.known() || !self.known() || peer.boot_id != self.boot_id ||
      peer.pid_namespace != self.pid_namespace) {
    return PeerState::kUnknown;
  }
  if (kill(peer.pid, 0) != 0 && errno == ESRCH) return PeerState::kGone;
  char state = 0;
  uint64_t start = 0;
  if (!ReadStat(peer.pid, &state, &start)) return PeerState::kUnknown;  // hidepid, or it just went
  if (state == 'Z' || state == 'X') return PeerState::kGone;            // killed, not yet reaped
  if (peer.start_ticks != 0 && start != peer.start_ticks) return PeerState::kGone;  // pid reused
  return PeerState::kAlive;
}

}  // namespace mmserve::transfer
