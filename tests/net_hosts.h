// Test hosts: one network namespace (and IPC namespace) per host, each with an
// `eth0` TAP device whose frames a switch in the test process forwards to the
// other hosts' TAPs, and a TAP in the test's own namespace (the "client"
// port) so the test reaches every host. Addresses come from 10.213.<n>.0/24,
// a range this helper owns (<n> picked under a lock so parallel test runs do
// not collide). The switch can delay, jitter, drop and cut each host's link
// and partition pairs of hosts: the kernels these tests run on have no
// `sch_netem`, so the switch is the network emulator.
//
//   ASSIGN_OR_RETURN(auto hosts, NetHosts::Create(3));
//   // hosts->Command(1, binary, args): argv that runs `binary` on host 1
//   hosts->SetLink(1, {.delay = absl::Milliseconds(50), .jitter = absl::Milliseconds(20)});
//   hosts->Partition(0, 2, true);
//   // ~NetHosts: the switch stops, the namespaces are deleted.
//
// Everything is removed by the destructor, also when a test fails; Create
// first deletes namespaces of this prefix left by processes that died.
// Thread-safe.
#ifndef MMSERVE_TESTS_NET_HOSTS_H_
#define MMSERVE_TESTS_NET_HOSTS_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace mmserve::testing {

// What happens to the frames a host sends (like netem on its eth0).
struct LinkFault {
  absl::Duration delay = absl::ZeroDuration();
  absl::Duration jitter = absl::ZeroDuration();  // uniform in [-jitter, +jitter]
  double loss = 0;                               // probability per frame
  bool cut = false;                              // drops frames to and from the host
};

// Why these tests cannot run here (not root, no namespaces or TAP), or OK.
absl::Status NetHostsSupported();

// Runs a command to its end; its output, or an error with the output.
absl::StatusOr<std::string> RunCommand(const std::vector<std::string>& argv);

class NetHosts {
 public:
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<NetHosts>> Create(int hosts);
  ~NetHosts();
  NetHosts(const NetHosts&) = delete;
  NetHosts& operator=(const NetHosts&) = delete;

  int size() const { return static_cast<int>(ports_.size()) - 1; }
  // Host i's namespace name and IPv4 address.
  const std::string& ns(int i) const { return ports_[i].ns; }
  const std::string& address(int i) const { return ports_[i].address; }
  // The test process's address on the switch, and its TAP device (for
  // UCX_NET_DEVICES, so this process's UCX traffic crosses the switch).
  const std::string& client_address() const { return ports_.back().address; }
  const std::string& client_device() const { return client_device_; }
  // argv that runs `binary args...` on host i (its network and a new IPC
  // namespace), with UCX restricted to the host's eth0.
  std::vector<std::string> Command(int host, const std::string& binary,
                                   const std::vector<std::string>& args) const;

  // Faults on the frames host i sends (and, with cut, receives: a cut also
  // loses the frames on the wire).
  void SetLink(int host, const LinkFault& fault);
  // The client port's own link (frames the test sends).
  void SetClientLink(const LinkFault& fault);
  // Drops every frame between hosts a and b (on) or stops doing so.
  void Partition(int a, int b, bool on);
  // Frames the switch dropped (loss, cuts, partitions) since Create.
  int64_t dropped() const;

 private:
  struct Port {
    std::string ns;  // empty for the client port
    std::string address;
    int fd = -1;
  };
  struct Pending {
    int64_t release_ns;
    int from;
    std::string frame;
  };
  NetHosts() = default;
  absl::Status Build(int hosts);
  void Loop();
  int64_t Flush(int64_t now_ns) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Forward(int from, const std::string& frame, int64_t now_ns)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Enqueue(int from, int to, const std::string& frame, int64_t now_ns)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool Drops(int from, int to) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int PortOf(const uint8_t* mac) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  std::string prefix_;
  std::string client_device_;
  std::vector<Port> ports_;  // the hosts, then the client port
  int wake_[2] = {-1, -1};
  std::thread thread_;

  mutable absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<LinkFault> faults_ ABSL_GUARDED_BY(mu_);  // per port
  std::vector<std::pair<int, int>> partitions_ ABSL_GUARDED_BY(mu_);
  std::vector<std::vector<uint8_t>> macs_ ABSL_GUARDED_BY(mu_);   // learned, per port
  std::vector<std::deque<Pending>> queues_ ABSL_GUARDED_BY(mu_);  // per egress port, FIFO
  uint64_t rng_ ABSL_GUARDED_BY(mu_) = 0x9e3779b97f4a7c15ull;
  int64_t dropped_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace mmserve::testing

#endif  // MMSERVE_TESTS_NET_HOSTS_H_
