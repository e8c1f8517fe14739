#include "tests/net_hosts.h"

#include <dirent.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/clock.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace mmserve::testing {
namespace {

constexpr char kPrefix[] = "mmsn";  // namespaces and devices of this helper
constexpr char kLockFile[] = "/tmp/mmserve-net-hosts.lock";

std::string FirstExisting(const std::vector<std::string>& paths) {
  for (const std::string& p : paths) {
    if (access(p.c_str(), X_OK) == 0) return p;
  }
  return "";
}

const std::string& IpBinary() {
  static const std::string* ip =
      new std::string(FirstExisting({"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"}));
  return *ip;
}

const std::string& UnshareBinary() {
  static const std::string* u =
      new std::string(FirstExisting({"/usr/bin/unshare", "/bin/unshare"}));
  return *u;
}

// Opens a TAP device `name` in namespace `ns` (the caller's when empty): the
// open happens on a thread that joins the namespace, so the device is born
// there and the fd stays bound to it.
absl::StatusOr<int> OpenTap(const std::string& ns, const std::string& name) {
  absl::StatusOr<int> result = absl::InternalError("not run");
  std::thread t([&] {
    if (!ns.empty()) {
      const int nsfd = open(absl::StrCat("/run/netns/", ns).c_str(), O_RDONLY | O_CLOEXEC);
      if (nsfd < 0 || setns(nsfd, CLONE_NEWNET) != 0) {
        result = absl::InternalError(
            absl::StrCat("cannot join namespace ", ns, ": ", std::strerror(errno)));
        if (nsfd >= 0) close(nsfd);
        return;
      }
      close(nsfd);
    }
    const int fd = open("/dev/net/tun", O_RDWR | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
      result = absl::InternalError(absl::StrCat("/dev/net/tun: ", std::strerror(errno)));
      return;
    }
    struct ifreq ifr = {};
    ifr.ifr_flags = IFF_TAP | IFF_NO_PI;
    strncpy(ifr.ifr_name, name.c_str(), IFNAMSIZ - 1);
    if (ioctl(fd, TUNSETIFF, &ifr) != 0) {
      result = absl::InternalError(absl::StrCat("TUNSETIFF ", name, ": ", std::strerror(errno)));
      close(fd);
      return;
    }
    result = fd;
  });
  t.join();
  return result;
}

// Subnets 10.213.<n>.0/24 that an interface of this namespace already uses.
std::set<int> UsedSubnets() {
  std::set<int> used;
  struct ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return used;
  for (struct ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET) continue;
    const uint32_t ip = ntohl(reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr.s_addr);
    if ((ip >> 16) == ((10u << 8) | 213u)) used.insert((ip >> 8) & 0xff);
  }
  freeifaddrs(list);
  return used;
}

// Deletes namespaces of this helper whose creating process is gone.
void RemoveStaleNamespaces() {
  DIR* dir = opendir("/run/netns");
  if (dir == nullptr) return;
  std::vector<std::string> stale;
  while (struct dirent* e = readdir(dir)) {
    absl::string_view name = e->d_name;
    if (!absl::ConsumePrefix(&name, kPrefix)) continue;
    int pid = 0;
    if (!absl::SimpleAtoi(name.substr(0, name.find('-')), &pid) || pid <= 0) continue;
    if (kill(pid, 0) != 0 && errno == ESRCH) stale.emplace_back(e->d_name);
  }
  closedir(dir);
  for (const std::string& ns : stale) {
    LOG(INFO) << "removing stale test namespace " << ns;
    (void)RunCommand({IpBinary(), "netns", "del", ns});
  }
}

int64_t Now() { return MonotonicNanos(); }

}  // namespace

absl::StatusOr<std::string> RunCommand(const std::vector<std::string>& argv) {
  int out[2];
  if (pipe2(out, O_CLOEXEC) != 0) return absl::InternalError("pipe failed");
  std::vector<std::string> storage = argv;
  std::vector<char*> args;
  for (std::string& a : storage) args.push_back(a.data());
  args.push_back(nullptr);
  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError("fork failed");
  if (pid == 0) {
    dup2(out[1], 1);
    dup2(out[1], 2);
    execv(args[0], args.data());
    _exit(127);
  }
  close(out[1]);
  std::string output;
  char buf[4096];
  for (ssize_t n; (n = read(out[0], buf, sizeof(buf))) != 0;) {
    if (n > 0) output.append(buf, n);
    if (n < 0 && errno != EINTR) break;
  }
  close(out[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return absl::InternalError(absl::StrCat(absl::StrJoin(argv, " "), " failed: ", output));
  }
  return output;
}

absl::Status NetHostsSupported() {
  if (geteuid() != 0) return absl::FailedPreconditionError("needs root (network namespaces)");
  if (IpBinary().empty()) return absl::FailedPreconditionError("no `ip` (install iproute2)");
  if (UnshareBinary().empty()) return absl::FailedPreconditionError("no `unshare` (util-linux)");
  if (access("/dev/net/tun", R_OK | W_OK) != 0) {
    return absl::FailedPreconditionError("no /dev/net/tun");
  }
  const std::string probe = absl::StrCat(kPrefix, getpid(), "-probe");
  if (absl::StatusOr<std::string> r = RunCommand({IpBinary(), "netns", "add", probe}); !r.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create a network namespace: ", r.status().message()));
  }
  (void)RunCommand({IpBinary(), "netns", "del", probe});
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<NetHosts>> NetHosts::Create(int hosts) {
  if (hosts < 1 || hosts > 200) return absl::InvalidArgumentError("1 to 200 hosts");
  RemoveStaleNamespaces();
  std::unique_ptr<NetHosts> h(new NetHosts);
  if (absl::Status s = h->Build(hosts); !s.ok()) return s;  // the destructor removes the rest
  return h;
}

absl::Status NetHosts::Build(int hosts) {
  prefix_ = absl::StrCat(kPrefix, getpid());
  if (pipe2(wake_, O_CLOEXEC | O_NONBLOCK) != 0) return absl::InternalError("pipe failed");
  ports_.resize(hosts + 1);
  for (int i = 0; i < hosts; ++i) {
    ports_[i].ns = absl::StrCat(prefix_, "-", i);
    if (auto r = RunCommand({IpBinary(), "netns", "add", ports_[i].ns}); !r.ok()) {
      ports_[i].ns.clear();
      return r.status();
    }
  }
  // The subnet is claimed by the client port's address, under a lock.
  Port& client = ports_.back();
  const int lock = open(kLockFile, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (lock < 0 || flock(lock, LOCK_EX) != 0) {
    if (lock >= 0) close(lock);
    return absl::InternalError(absl::StrCat("cannot lock ", kLockFile));
  }
  const std::set<int> used = UsedSubnets();
  int subnet = 1;
  while (subnet < 255 && used.count(subnet)) ++subnet;
  const std::string base = absl::StrCat("10.213.", subnet, ".");
  const std::string client_dev = absl::StrCat(prefix_, "c");
  absl::Status status = absl::ResourceExhaustedError("no free 10.213.x.0/24 subnet");
  if (subnet < 255) {
    absl::StatusOr<int> fd = OpenTap("", client_dev);
    status = fd.status();
    if (fd.ok()) {
      client.fd = *fd;
      client.address = base + "254";
      client_device_ = client_dev;
      status = RunCommand({IpBinary(), "addr", "add", client.address + "/24", "dev", client_dev})
                   .status();
      if (status.ok()) status = RunCommand({IpBinary(), "link", "set", client_dev, "up"}).status();
    }
  }
  close(lock);  // releases the flock
  if (!status.ok()) return status;
  for (int i = 0; i < hosts; ++i) {
    ASSIGN_OR_RETURN(ports_[i].fd, OpenTap(ports_[i].ns, "eth0"));
    ports_[i].address = absl::StrCat(base, i + 1);
    const std::string& ns = ports_[i].ns;
    for (const std::vector<std::string>& cmd : std::vector<std::vector<std::string>>{
             {IpBinary(), "-n", ns, "addr", "add", ports_[i].address + "/24", "dev", "eth0"},
             {IpBinary(), "-n", ns, "link", "set", "eth0", "up"},
             {IpBinary(), "-n", ns, "link", "set", "lo", "up"}}) {
      RETURN_IF_ERROR(RunCommand(cmd).status());
    }
  }
  {
    absl::MutexLock l(&mu_);
    faults_.resize(ports_.size());
    macs_.resize(ports_.size());
    queues_.resize(ports_.size());
  }
  thread_ = std::thread([this] { Loop(); });
  return absl::OkStatus();
}

NetHosts::~NetHosts() {
  {
    absl::MutexLock l(&mu_);
    stop_ = true;
  }
  if (wake_[1] >= 0) (void)!write(wake_[1], "x", 1);
  if (thread_.joinable()) thread_.join();
  for (Port& p : ports_) {
    if (p.fd >= 0) close(p.fd);  // the TAP device goes with its fd
    if (!p.ns.empty()) {
      if (auto r = RunCommand({IpBinary(), "netns", "del", p.ns}); !r.ok()) {
        LOG(WARNING) << r.status();
      }
    }
  }
  for (int fd : wake_) {
    if (fd >= 0) close(fd);
  }
}

std::vector<std::string> NetHosts::Command(int host, const std::string& binary,
                                           const std::vector<std::string>& args) const {
  std::vector<std::string> argv = {
      IpBinary(), "netns", "exec",         ports_[host].ns,        UnshareBinary(),
      "--ipc",    "--",    "/usr/bin/env", "UCX_NET_DEVICES=eth0", binary};
  argv.insert(argv.end(), args.begin(), args.end());
  return argv;
}

void NetHosts::SetLink(int host, const LinkFault& fault) {
  absl::MutexLock l(&mu_);
  faults_[host] = fault;
}

void NetHosts::SetClientLink(const LinkFault& fault) {
  absl::MutexLock l(&mu_);
  faults_.back() = fault;
}

void NetHosts::Partition(int a, int b, bool on) {
  absl::MutexLock l(&mu_);
  const std::pair<int, int> pair(std::min(a, b), std::max(a, b));
  auto it = std::find(partitions_.begin(), partitions_.end(), pair);
  if (on && it == partitions_.end()) partitions_.push_back(pair);
  if (!on && it != partitions_.end()) partitions_.erase(it);
}

int64_t NetHosts::dropped() const {
  absl::MutexLock l(&mu_);
  return dropped_;
}

bool NetHosts::Drops(int from, int to) const {
  if (faults_[from].cut || faults_[to].cut) return true;
  return std::find(partitions_.begin(), partitions_.end(),
                   std::pair<int, int>(std::min(from, to), std::max(from, to))) !=
         partitions_.end();
}

int NetHosts::PortOf(const uint8_t* mac) const {
  for (size_t p = 0; p < macs_.size(); ++p) {
    if (macs_[p].size() == 6 && std::equal(macs_[p].begin(), macs_[p].end(), mac)) {
      return static_cast<int>(p);
    }
  }
  return -1;
}

void NetHosts::Enqueue(int from, int to, const std::string& frame, int64_t now_ns) {
  const LinkFault& f = faults_[from];
  rng_ = rng_ * 6364136223846793005ull + 1442695040888963407ull;
  const double u = static_cast<double>(rng_ >> 11) / static_cast<double>(1ull << 53);
  if (Drops(from, to) || u < f.loss) {
    ++dropped_;
    return;
  }
  int64_t delay = absl::ToInt64Nanoseconds(f.delay);
  if (f.jitter > absl::ZeroDuration()) {
    rng_ = rng_ * 6364136223846793005ull + 1442695040888963407ull;
    const double v = static_cast<double>(rng_ >> 11) / static_cast<double>(1ull << 53);
    delay += static_cast<int64_t>((2 * v - 1) * absl::ToDoubleNanoseconds(f.jitter));
  }
  std::deque<Pending>& q = queues_[to];
  int64_t release = now_ns + std::max<int64_t>(delay, 0);
  // FIFO per egress port: jitter delays, never reorders.
  if (!q.empty()) release = std::max(release, q.back().release_ns);
  q.push_back({release, from, frame});
}

void NetHosts::Forward(int from, const std::string& frame, int64_t now_ns) {
  if (frame.size() < 14) return;
  const auto* bytes = reinterpret_cast<const uint8_t*>(frame.data());
  macs_[from].assign(bytes + 6, bytes + 12);
  const int to = (bytes[0] & 1) ? -1 : PortOf(bytes);
  for (int p = 0; p < static_cast<int>(ports_.size()); ++p) {
    if (p != from && (to < 0 || to == p)) Enqueue(from, p, frame, now_ns);
  }
}

int64_t NetHosts::Flush(int64_t now_ns) {
  int64_t next = now_ns + absl::ToInt64Nanoseconds(absl::Milliseconds(100));
  for (size_t p = 0; p < queues_.size(); ++p) {
    std::deque<Pending>& q = queues_[p];
    while (!q.empty() && q.front().release_ns <= now_ns) {
      // A TAP takes a frame at once; a full one drops it like a wire would.
      // A link cut or partitioned since the frame left loses it.
      if (Drops(q.front().from, static_cast<int>(p)) ||
          write(ports_[p].fd, q.front().frame.data(), q.front().frame.size()) < 0) {
        ++dropped_;
      }
      q.pop_front();
    }
    if (!q.empty()) next = std::min(next, q.front().release_ns);
  }
  return next;
}

void NetHosts::Loop() {
  std::vector<struct pollfd> fds;
  for (const Port& p : ports_) fds.push_back({p.fd, POLLIN, 0});
  fds.push_back({wake_[0], POLLIN, 0});
  int64_t next = Now();
  std::string buf(65536, '\0');
  for (;;) {
    const int64_t wait_ns = std::max<int64_t>(next - Now(), 0);
    poll(fds.data(), fds.size(), static_cast<int>((wait_ns + 999999) / 1000000));
    absl::MutexLock l(&mu_);
    if (stop_) return;
    for (size_t p = 0; p < ports_.size(); ++p) {
      if (!(fds[p].revents & POLLIN)) continue;
      for (ssize_t n; (n = read(ports_[p].fd, buf.data(), buf.size())) > 0;) {
        Forward(static_cast<int>(p), buf.substr(0, n), Now());
      }
    }
    next = Flush(Now());
  }
}

}  // namespace mmserve::testing
