// A child process (the transfer_peer helper) driven over its stdin/stdout, for
// multi-process tests and the benchmark.
//
//   ASSIGN_OR_RETURN(auto peer, PeerProcess::Spawn(PeerBinaryPath(argv0), {"--role=sender"}));
//   std::optional<std::string> line = peer->ReadLine(Deadline::After(absl::Seconds(5)));
//   peer->WriteLine("EXIT");
//   peer->Kill();  // SIGKILL and reap
//
// Lines are '\n'-terminated. The destructor kills a child that still runs.
// Not thread-safe, except Kill().
#ifndef MMSERVE_TRANSFER_PEER_PROCESS_H_
#define MMSERVE_TRANSFER_PEER_PROCESS_H_

#include <sys/types.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/clock.h"

namespace mmserve::transfer {

// Path of tests/peers/transfer_peer in this binary's runfiles.
std::string PeerBinaryPath();

class PeerProcess {
 public:
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<PeerProcess>> Spawn(
      const std::string& binary, const std::vector<std::string>& args);
  ~PeerProcess();
  PeerProcess(const PeerProcess&) = delete;
  PeerProcess& operator=(const PeerProcess&) = delete;

  // The next line without '\n', or nullopt at EOF or the deadline.
  std::optional<std::string> ReadLine(Deadline deadline);
  bool WriteLine(const std::string& line);
  // SIGKILL and wait for the child to be gone.
  void Kill();
  // Waits for a normal exit; returns the exit code, or -1 on deadline/signal.
  int Wait(Deadline deadline);
  pid_t pid() const { return pid_; }

 private:
  PeerProcess(pid_t pid, int in_fd, int out_fd) : pid_(pid), in_fd_(in_fd), out_fd_(out_fd) {}
  pid_t pid_;
  int in_fd_;   // child's stdin
  int out_fd_;  // child's stdout
  std::string pending_;
  bool reaped_ = false;
};

// Hex encoding of binary strings (worker addresses travel as text lines).
std::string ToHex(const std::string& bytes);
std::string FromHex(const std::string& hex);

}  // namespace mmserve::transfer

#endif  // MMSERVE_TRANSFER_PEER_PROCESS_H_
