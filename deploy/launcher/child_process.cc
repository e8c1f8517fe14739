#include "deploy/launcher/child_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/clock.h"

namespace mmserve::launcher {

absl::StatusOr<std::unique_ptr<ChildProcess>> ChildProcess::Start(const ChildSpec& spec) {
  int out[2];
  if (pipe2(out, O_CLOEXEC) != 0) return absl::InternalError("pipe failed");
  int log_fd = -1;
  if (!spec.log.empty()) {
    log_fd = open(spec.log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (log_fd < 0) return absl::InternalError(absl::StrCat("cannot open ", spec.log));
  }
  std::vector<std::string> argv_storage = {spec.binary};
  argv_storage.insert(argv_storage.end(), spec.args.begin(), spec.args.end());
  std::vector<char*> argv;
  for (std::string& a : argv_storage) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError("fork failed");
  if (pid == 0) {
    // The child: die with the launcher, take signals as they come (the
    // launcher may block some), stdout to the pipe, stderr to the log.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    signal(SIGPIPE, SIG_DFL);
    dup2(out[1], 1);
    if (log_fd >= 0) dup2(log_fd, 2);
    execv(spec.binary.c_str(), argv.data());
    _exit(127);
  }
  close(out[1]);
  if (log_fd >= 0) close(log_fd);
  return std::unique_ptr<ChildProcess>(new ChildProcess(spec, pid, out[0]));
}

ChildProcess::~ChildProcess() {
  if (!reaped_) {
    kill(pid_, SIGKILL);
    Reap(true);
  }
  close(stdout_fd_);
}

bool ChildProcess::Reap(bool block) {
  if (reaped_) return true;
  int status = 0;
  const pid_t r = waitpid(pid_, &status, block ? 0 : WNOHANG);
  if (r != pid_) return false;
  reaped_ = true;
  exit_status_ = WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
  return true;
}

bool ChildProcess::alive() { return !Reap(false); }

void ChildProcess::Signal(int sig) const {
  if (!reaped_) kill(pid_, sig);
}

std::string ChildProcess::LogTail(size_t bytes) const {
  std::ifstream in(spec_.log);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string all = ss.str();
  return all.size() > bytes ? all.substr(all.size() - bytes) : all;
}

absl::StatusOr<ReadyLine> ChildProcess::WaitReady(absl::Duration timeout) {
  const Deadline deadline = Deadline::After(timeout);
  for (;;) {
    for (size_t nl = pending_.find('\n'); nl != std::string::npos; nl = pending_.find('\n')) {
      std::string line = pending_.substr(0, nl);
      pending_.erase(0, nl + 1);
      std::vector<std::string> words = absl::StrSplit(line, ' ', absl::SkipEmpty());
      if (words.size() < 3 || words[0] != "READY") continue;
      ReadyLine ready{words[1], words[2], {}};
      for (size_t i = 3; i < words.size(); ++i) {
        std::vector<std::string> kv = absl::StrSplit(words[i], absl::MaxSplits('=', 1));
        if (kv.size() == 2) ready.fields[kv[0]] = kv[1];
      }
      return ready;
    }
    if (deadline.Expired()) {
      return absl::DeadlineExceededError(
          absl::StrCat(spec_.name, " did not report ready in time; log:\n", LogTail()));
    }
    struct pollfd fd = {stdout_fd_, POLLIN, 0};
    poll(&fd, 1, 100);
    char buf[4096];
    const ssize_t n = (fd.revents & (POLLIN | POLLHUP)) ? read(stdout_fd_, buf, sizeof(buf)) : -1;
    if (n > 0) {
      pending_.append(buf, n);
    } else if (n == 0 || !alive()) {
      Reap(true);
      return absl::UnavailableError(absl::StrCat(spec_.name, " exited (status ", exit_status_,
                                                 ") before it was ready; log:\n", LogTail()));
    }
  }
}

int ChildProcess::Stop(absl::Duration grace) {
  if (reaped_) return exit_status_;
  kill(pid_, SIGTERM);
  const Deadline deadline = Deadline::After(grace);
  while (!deadline.Expired()) {
    if (Reap(false)) return exit_status_;
    usleep(10000);
  }
  kill(pid_, SIGKILL);
  Reap(true);
  return exit_status_;
}

}  // namespace mmserve::launcher
