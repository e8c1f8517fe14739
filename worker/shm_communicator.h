// The shared-memory Communicator backend: the ranks of one instance are
// separate processes on one host and share one POSIX shared-memory segment,
// named after the instance ("/mmserve-tp-<instance_id>", so /dev/shm on
// Linux).
//
//   ShmCommunicatorOptions o;
//   o.instance_id = "lang0-12345";  // unique per launch of the instance
//   o.rank = rank;
//   o.world_size = 2;
//   ASSIGN_OR_RETURN(std::unique_ptr<ShmCommunicator> comm, ShmCommunicator::Join(o));
//
// Segment: a header (barrier counters, each rank's pid, per-call sizes) and
// two sets of world_size slots of capacity_floats each. A call alternates
// sets, so a slot written by call n + 2 was last read in call n, and every
// rank has left call n once it passes call n + 1's barrier: one barrier per
// call suffices (two for AllReduceSum).
// AllReduceSum: each rank copies its data into its slot; barrier; rank r sums
// the r-th 64-byte aligned slice of every slot into slot 0 in place, in rank
// order; barrier; each rank copies slot 0 back. Larger calls go in chunks of
// capacity_floats.
//
// Waiting: a short spin, then sched_yield, then futex waits on the barrier's
// generation word in 10 ms slices. Between slices a waiter checks the broken
// flag, its deadline (options.timeout) and every 50 ms that each peer's pid is
// still alive (not gone and not a zombie). Any of these fails the call with
// UNAVAILABLE and marks the segment broken, which wakes and fails the other
// ranks too.
//
// Lifetime: as ShmSegment (shm_segment.h): Join returns once every rank has
// mapped the segment and its name is unlinked, so nothing is left in
// /dev/shm; destruction marks it broken (a rank that leaves takes its
// instance out of service).
// Thread-safety: as Communicator (one calling thread per rank).
#ifndef MMSERVE_WORKER_SHM_COMMUNICATOR_H_
#define MMSERVE_WORKER_SHM_COMMUNICATOR_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/communicator.h"
#include "worker/shm_segment.h"

namespace mmserve::worker {

struct ShmCommunicatorOptions {
  // [A-Za-z0-9_.-], 1 to 200 characters; every rank passes the same.
  std::string instance_id;
  int rank = 0;
  int world_size = 1;  // 1..kMaxShmRanks
  // Floats per rank slot (every rank passes the same); larger calls are
  // chunked. The default holds 64 tokens of a 4096-wide hidden state.
  int64_t capacity_floats = int64_t{1} << 18;
  // How long Join waits for the others and any call waits for a peer.
  absl::Duration timeout = absl::Seconds(10);
};

// The shared-memory name for an instance id ("/mmserve-tp-<id>").
std::string ShmSegmentName(const std::string& instance_id);

class ShmCommunicator final : public Communicator {
 public:
  // InvalidArgument for a bad id, rank, world size or capacity, or if the
  // segment found was created with another world size or capacity, or this
  // rank is already taken; UNAVAILABLE if not every rank mapped the segment
  // within options.timeout; Internal for a failed system call.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<ShmCommunicator>> Join(
      const ShmCommunicatorOptions& options);

  ~ShmCommunicator() override;
  ShmCommunicator(const ShmCommunicator&) = delete;
  ShmCommunicator& operator=(const ShmCommunicator&) = delete;

  int rank() const override { return options_.rank; }
  int world_size() const override { return options_.world_size; }

  absl::Status AllReduceSum(absl::Span<float> data) override;
  absl::Status Gather(absl::Span<const float> in, absl::Span<float> out) override;
  absl::Status AllGather(absl::Span<const float> in, absl::Span<float> out) override;
  absl::Status Broadcast(absl::Span<float> data) override;
  absl::Status Barrier() override;

  // Takes the instance out of service from any thread (e.g. a supervisor
  // that saw a rank exit): every rank's current and later calls fail with
  // UNAVAILABLE.
  void Abort(const std::string& why) { (void)segment_->Break(absl::UnavailableError(why)); }

 private:
  struct Header;

  ShmCommunicator(const ShmCommunicatorOptions& options, std::unique_ptr<ShmSegment> segment);

  // Waits for every rank; UNAVAILABLE (and the segment broken) on a timeout,
  // a dead peer or a broken segment.
  absl::Status Wait();
  // After the barrier of a call on slot set `set`: InvalidArgument (and the
  // segment broken) unless every rank published the same call size n.
  absl::Status CheckSizes(int set, int64_t n);
  float* Slot(int set, int rank) const;
  absl::Status GatherImpl(absl::Span<const float> in, absl::Span<float> out, bool to_all);

  ShmCommunicatorOptions options_;
  std::unique_ptr<ShmSegment> segment_;
  Header* header_;      // in segment_
  uint64_t calls_ = 0;  // data calls so far: picks the slot set
};

}  // namespace mmserve::worker

#endif  // MMSERVE_WORKER_SHM_COMMUNICATOR_H_
