#include "transfer/peer_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>

#include "absl/strings/str_cat.h"

extern char** environ;

namespace mmserve::transfer {

std::string PeerBinaryPath() {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  if (srcdir != nullptr) return absl::StrCat(srcdir, "/mmserve/tests/peers/transfer_peer");
  char self[4096] = {};
  ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  std::string exe(self, n > 0 ? n : 0);
  return absl::StrCat(exe, ".runfiles/mmserve/tests/peers/transfer_peer");
}

absl::StatusOr<std::unique_ptr<PeerProcess>> PeerProcess::Spawn(
    const std::string& binary, const std::vector<std::string>& args) {
  int to_child[2], from_child[2];
  if (pipe2(to_child, O_CLOEXEC) != 0 || pipe2(from_child, O_CLOEXEC) != 0) {
    return absl::InternalError("pipe failed");
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, to_child[0], 0);
  posix_spawn_file_actions_adddup2(&actions, from_child[1], 1);
  std::vector<std::string> argv_storage = {binary};
  argv_storage.insert(argv_storage.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : argv_storage) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  int rc = posix_spawn(&pid, binary.c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  close(to_child[0]);
  close(from_child[1]);
  if (rc != 0) {
    close(to_child[1]);
    close(from_child[0]);
    return absl::InternalError(absl::StrCat("posix_spawn ", binary, ": ", rc));
  }
  signal(SIGPIPE, SIG_IGN);  // writes to a killed child must fail, not kill us
  return std::unique_ptr<PeerProcess>(new PeerProcess(pid, to_child[1], from_child[0]));
}

PeerProcess::~PeerProcess() {
  Kill();
  close(in_fd_);
  close(out_fd_);
}

std::optional<std::string> PeerProcess::ReadLine(Deadline deadline) {
  while (true) {
    size_t nl = pending_.find('\n');
    if (nl != std::string::npos) {
      std::string line = pending_.substr(0, nl);
      pending_.erase(0, nl + 1);
      return line;
    }
    struct pollfd fd = {out_fd_, POLLIN, 0};
    int64_t ms = absl::ToInt64Milliseconds(deadline.Remaining());
    if (deadline.Expired() || poll(&fd, 1, static_cast<int>(std::min<int64_t>(ms, 1 << 30))) <= 0) {
      return std::nullopt;
    }
    char buf[65536];
    ssize_t n = read(out_fd_, buf, sizeof(buf));
    if (n <= 0) return std::nullopt;
    pending_.append(buf, n);
  }
}

bool PeerProcess::WriteLine(const std::string& line) {
  std::string data = line + "\n";
  return write(in_fd_, data.data(), data.size()) == static_cast<ssize_t>(data.size());
}

void PeerProcess::Kill() {
  if (reaped_) return;
  kill(pid_, SIGKILL);
  waitpid(pid_, nullptr, 0);
  reaped_ = true;
}

int PeerProcess::Wait(Deadline deadline) {
  if (reaped_) return -1;
  while (!deadline.Expired()) {
    int status = 0;
    pid_t r = waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      reaped_ = true;
      return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    }
    usleep(1000);
  }
  return -1;
}

std::string ToHex(const std::string& bytes) {
  static const char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    out.push_back(kDigits[c >> 4]);
    out.push_back(kDigits[c & 15]);
  }
  return out;
}

std::string FromHex(const std::string& hex) {
  auto nibble = [](char c) { return c <= '9' ? c - '0' : c - 'a' + 10; };
  std::string out(hex.size() / 2, '\0');
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] = static_cast<char>(nibble(hex[2 * i]) << 4 | nibble(hex[2 * i + 1]));
  }
  return out;
}

}  // namespace mmserve::transfer
