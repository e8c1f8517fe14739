#include "worker/tp_group.h"

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "worker/tp_step_loop.h"

extern char** environ;

namespace mmserve::worker {
namespace {

// Where a shard finds the shared input file's descriptor.
constexpr int kSharedInputChildFd = 100;
// Where a shard finds its KV cache file's descriptor.
constexpr int kKvChildFd = 102;

}  // namespace

absl::StatusOr<std::unique_ptr<TpGroup>> TpGroup::Start(const TpGroupOptions& o) {
  if (o.size < 2 || o.size > kMaxShmRanks) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor-parallel size ", o.size, " is outside [2, ", kMaxShmRanks, "]"));
  }
  if (absl::Status s = ValidateInstanceId(o.instance_id); !s.ok()) return s;
  if (o.shard_binary.empty() || access(o.shard_binary.c_str(), X_OK) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor-parallel shard binary '", o.shard_binary, "' is not executable"));
  }
  if (!o.kv_fds.empty() && o.kv_fds.size() != static_cast<size_t>(o.size - 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat(o.kv_fds.size(), " KV cache files for ", o.size - 1, " shard ranks"));
  }
  std::unique_ptr<TpGroup> g(new TpGroup());
  g->options_ = o;
  for (int rank = 1; rank < o.size; ++rank) {
    std::vector<std::string> args = {o.shard_binary,
                                     absl::StrCat("--model_dir=", o.model_dir),
                                     absl::StrCat("--instance_id=", o.instance_id),
                                     absl::StrCat("--rank=", rank),
                                     absl::StrCat("--tp=", o.size),
                                     absl::StrCat("--threads=", o.threads_per_rank),
                                     absl::StrCat("--ring_slot_bytes=", o.ring_slot_bytes),
                                     absl::StrCat("--timeout_s=", absl::ToInt64Seconds(o.timeout))};
    args.insert(args.end(), o.extra_args.begin(), o.extra_args.end());
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    if (o.shared_input_fd >= 0) {
      // The child's copy has no close-on-exec (dup2 onto another number).
      const int child_fd =
          o.shared_input_fd == kSharedInputChildFd ? kSharedInputChildFd + 1 : kSharedInputChildFd;
      posix_spawn_file_actions_adddup2(&actions, o.shared_input_fd, child_fd);
      args.push_back(absl::StrCat("--shared_input_fd=", child_fd));
      args.push_back(absl::StrCat("--shared_input_bytes=", o.shared_input_bytes));
    }
    if (!o.kv_fds.empty()) {
      const int fd = o.kv_fds[rank - 1];
      const int child_fd = fd == kKvChildFd ? kKvChildFd + 1 : kKvChildFd;
      posix_spawn_file_actions_adddup2(&actions, fd, child_fd);
      args.push_back(absl::StrCat("--kv_fd=", child_fd));
    }
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t pid = 0;
    const int err =
        posix_spawn(&pid, o.shard_binary.c_str(), &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    if (err != 0) {
      return absl::InternalError(
          absl::StrCat("posix_spawn(", o.shard_binary, "): ", std::strerror(err)));
    }
    g->shards_.push_back(pid);  // from here on, ~TpGroup reaps it
  }
  ShmCommunicatorOptions co;
  co.instance_id = o.instance_id;
  co.rank = 0;
  co.world_size = o.size;
  co.timeout = o.timeout;
  auto comm = ShmCommunicator::Join(co);
  if (!comm.ok()) return comm.status();
  g->comm_ = *std::move(comm);
  StepRingOptions ro;
  ro.instance_id = o.instance_id;
  ro.rank = 0;
  ro.world_size = o.size;
  ro.timeout = o.timeout;
  ro.slot_bytes = o.ring_slot_bytes;
  auto ring = StepRing::Join(ro);
  if (!ring.ok()) return ring.status();
  g->ring_ = *std::move(ring);
  g->reaped_ = std::vector<std::atomic<bool>>(g->shards_.size());
  g->supervisor_ = std::thread([raw = g.get()] { raw->Supervise(); });
  LOG(INFO) << "tensor-parallel instance " << o.instance_id << ": " << o.size << " ranks joined";
  return g;
}

TpGroup::~TpGroup() {
  stopping_ = true;
  if (supervisor_.joinable()) supervisor_.join();
  StopShards();
}

void TpGroup::Supervise() {
  while (!stopping_.load()) {
    for (size_t i = 0; i < shards_.size(); ++i) {
      if (reaped_[i].load()) continue;
      int status = 0;
      if (waitpid(shards_[i], &status, WNOHANG) != shards_[i]) continue;
      reaped_[i] = true;
      const std::string why = absl::StrCat(
          "tensor-parallel rank ", i + 1, " (pid ", shards_[i], ") of ", options_.instance_id,
          WIFSIGNALED(status) ? absl::StrCat(" was killed by signal ", WTERMSIG(status))
                              : absl::StrCat(" exited with status ", WEXITSTATUS(status)));
      LOG(ERROR) << why << ": the instance is out of service";
      lost_rank_ = true;
      comm_->Abort(why);
      ring_->Abort(why);
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
}

void TpGroup::StopShards() {
  if (ring_ != nullptr) {
    absl::Status s = StopShardSteps(*ring_);
    if (!s.ok()) LOG(WARNING) << "stopping the shard ranks: " << s;
  }
  const absl::Time deadline = absl::Now() + options_.stop_grace;
  for (size_t i = 0; i < shards_.size(); ++i) {
    if (!reaped_.empty() && reaped_[i].load()) continue;
    const pid_t pid = shards_[i];
    int status = 0;
    while (true) {
      const pid_t r = waitpid(pid, &status, WNOHANG);
      if (r == pid || (r < 0 && errno != EINTR)) break;
      if (absl::Now() > deadline) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        LOG(WARNING) << "shard rank pid " << pid << " killed after the stop grace";
        break;
      }
      absl::SleepFor(absl::Milliseconds(5));
    }
  }
  shards_.clear();
}

}  // namespace mmserve::worker
