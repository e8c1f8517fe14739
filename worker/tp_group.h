// Rank 0's side of a tensor-parallel instance: starts ranks 1..n-1 as
// processes of the shard binary (worker/tp_shard_main.cc), joins them
// through the shared-memory communicator and step ring, and takes them down.
//
//   TpGroupOptions o{.size = 2, .instance_id = "lang0-1234",
//                    .shard_binary = "bazel-bin/worker/tp_shard",
//                    .model_dir = dir};
//   ASSIGN_OR_RETURN(std::unique_ptr<TpGroup> group, TpGroup::Start(o));
//   Qwen2Model model(cfg, weights, pool, {kDot, group->comm()});
//   ModelRunner runner(model, kv, group->ring());
//
// A supervisor thread reaps the shard ranks: one that exits while the group
// runs is noticed within about 50 ms, and the communicator and ring are
// aborted, so rank 0's step in progress (or next step) fails with
// UNAVAILABLE instead of waiting; lost_rank() turns true.
// Destruction sends kStop, gives each rank `stop_grace` to exit, then
// SIGKILLs and reaps it: no rank outlives its group, and the segments'
// names are gone once every rank joined (ShmSegment).
// Thread-safety: lost_rank() is thread-safe; the rest is the owner's
// thread's.
#ifndef MMSERVE_WORKER_TP_GROUP_H_
#define MMSERVE_WORKER_TP_GROUP_H_

#include <sys/types.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "worker/shm_communicator.h"
#include "worker/step_ring.h"

namespace mmserve::worker {

struct TpGroupOptions {
  int size = 2;             // ranks, this process included
  std::string instance_id;  // unique per launch (ValidateInstanceId)
  std::string shard_binary;
  std::string model_dir;
  int threads_per_rank = 1;
  // The step ring's slot: at least the largest encoded step (StepRing).
  int64_t ring_slot_bytes = int64_t{1} << 20;
  // How long a collective waits for a live but silent peer (a shard still
  // loading its weights at the first step), and the join's deadline.
  absl::Duration timeout = absl::Seconds(120);
  absl::Duration stop_grace = absl::Seconds(5);
  // More flags for every shard (e.g. --kv_handoff_profile=shm).
  std::vector<std::string> extra_args;
  // Seed 000: a ShmFile every rank maps (the embedding receive buffer), or
  // -1. Each shard gets the descriptor (dup2'd) and maps its first
  // shared_input_bytes read-only; steps name rows in it by offset.
  int shared_input_fd = -1;
  size_t shared_input_bytes = 0;
  // Role prefill: one descriptor per shard rank (rank 1 first), each the
  // file its KV cache lies in (worker/tp_kv_files.h), or empty.
  std::vector<int> kv_fds;
};

class TpGroup {
 public:
  // InvalidArgument for bad options (size < 2, missing binary); the join's
  // errors (UNAVAILABLE if a shard did not start or join in time).
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<TpGroup>> Start(const TpGroupOptions& o);
  ~TpGroup();
  TpGroup(const TpGroup&) = delete;
  TpGroup& operator=(const TpGroup&) = delete;

  Communicator* comm() const { return comm_.get(); }
  StepRing* ring() const { return ring_.get(); }
  const std::vector<pid_t>& shard_pids() const { return shards_; }
  bool lost_rank() const { return lost_rank_.load(); }

 private:
  TpGroup() = default;
  void Supervise();
  void StopShards();

  TpGroupOptions options_;
  std::vector<pid_t> shards_;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> lost_rank_{false};
  std::vector<std::atomic<bool>> reaped_;  // by the supervisor, per shard
  std::thread supervisor_;
  std::unique_ptr<ShmCommunicator> comm_;
  std::unique_ptr<StepRing> ring_;
};

}  // namespace mmserve::worker

#endif  // MMSERVE_WORKER_TP_GROUP_H_
