// One supervised child process of a local mmserve topology: started with its
// stderr appended to a log file, its stdout read for the service's READY line
// ("READY <kind> <id> grpc=<addr> [http=<port>] metrics=<port>"), killed with
// the launcher (PR_SET_PDEATHSIG), stopped with SIGTERM and then SIGKILL.
//
//   ASSIGN_OR_RETURN(auto p, ChildProcess::Start({.name = "encoder-0", .binary = path,
//                                                 .args = {...}, .log = "/tmp/enc.log"}));
//   ASSIGN_OR_RETURN(ReadyLine ready, p->WaitReady(absl::Seconds(60)));
//   p->Stop(absl::Seconds(10));  // SIGTERM, SIGKILL after the grace
//
// Not thread-safe, except Signal() and alive().
#ifndef MMSERVE_DEPLOY_LAUNCHER_CHILD_PROCESS_H_
#define MMSERVE_DEPLOY_LAUNCHER_CHILD_PROCESS_H_

#include <sys/types.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace mmserve::launcher {

struct ChildSpec {
  std::string name;
  std::string binary;
  std::vector<std::string> args;
  std::string log;  // stderr goes here (appended); empty: inherit
};

// The fields of a READY line: kind, id and key=value pairs.
struct ReadyLine {
  std::string kind;
  std::string id;
  std::map<std::string, std::string> fields;
};

class ChildProcess {
 public:
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<ChildProcess>> Start(const ChildSpec& spec);
  ~ChildProcess();  // SIGKILL if still running
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  // Waits for the READY line; UNAVAILABLE when the child exits first (the
  // message holds the tail of its log), DEADLINE_EXCEEDED on timeout.
  [[nodiscard]] absl::StatusOr<ReadyLine> WaitReady(absl::Duration timeout);
  void Signal(int sig) const;
  // SIGTERM, then SIGKILL after `grace`; returns the exit status (-signal
  // when killed by one). Idempotent.
  int Stop(absl::Duration grace);
  // Whether the process still runs (reaps it when it exited).
  bool alive();
  // The exit status once it ended (see Stop).
  int exit_status() const { return exit_status_; }
  pid_t pid() const { return pid_; }
  const ChildSpec& spec() const { return spec_; }
  std::string LogTail(size_t bytes = 2000) const;

 private:
  ChildProcess(ChildSpec spec, pid_t pid, int stdout_fd)
      : spec_(std::move(spec)), pid_(pid), stdout_fd_(stdout_fd) {}
  bool Reap(bool block);

  const ChildSpec spec_;
  const pid_t pid_;
  int stdout_fd_;
  std::string pending_;
  bool reaped_ = false;
  int exit_status_ = 0;
};

}  // namespace mmserve::launcher

#endif  // MMSERVE_DEPLOY_LAUNCHER_CHILD_PROCESS_H_
