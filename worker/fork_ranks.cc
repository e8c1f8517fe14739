#include "worker/fork_ranks.h"

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"

namespace mmserve::worker {

pid_t ForkChild(const std::function<int()>& fn) {
  std::fflush(nullptr);
  const pid_t pid = fork();
  if (pid < 0) {
    std::perror("fork");
    std::abort();
  }
  if (pid == 0) {
    int code = 1;
    try {
      code = fn();
    } catch (...) {
      code = 1;
    }
    std::fflush(nullptr);
    _exit(code);
  }
  return pid;
}

int WaitChild(pid_t pid) {
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 255;
}

std::vector<int> RunForkedRanks(int world_size, const std::function<int(int rank)>& fn) {
  std::vector<pid_t> children;
  for (int r = 1; r < world_size; ++r) children.push_back(ForkChild([&fn, r] { return fn(r); }));
  std::vector<int> codes(world_size);
  codes[0] = fn(0);
  for (int r = 1; r < world_size; ++r) codes[r] = WaitChild(children[r - 1]);
  return codes;
}

std::string UniqueInstanceId(const std::string& prefix) {
  static std::atomic<int> counter{0};
  return absl::StrCat(prefix, "-", getpid(), "-", counter++);
}

}  // namespace mmserve::worker
