// One POSIX shared-memory segment shared by the rank processes of one
// tensor-parallel instance, with the lifecycle every such segment needs
// (the communicator's, the step ring's):
//
//   ShmSegmentOptions o{"/mmserve-tp-lang0-123", rank, world, user_bytes};
//   ASSIGN_OR_RETURN(std::unique_ptr<ShmSegment> seg, ShmSegment::Join(o));
//   auto* mine = static_cast<MyHeader*>(seg->data());  // zeroed at creation
//
// Rank 0 creates the segment (replacing a stale one of the same name left by
// a crashed launch: names must be unique per launch), the others open it.
// Join returns once every rank has mapped it and the last to map it has
// unlinked the name, so nothing is left in /dev/shm even if the processes
// are killed afterwards. If a rank never arrives, Join fails with
// UNAVAILABLE at the deadline and unlinks the name.
// The segment records each rank's pid and a `broken` flag: CheckPeers fails
// with UNAVAILABLE (and sets the flag, which fails every other rank too) when
// a peer is gone or a zombie, or a deadline has passed. Destruction sets the
// flag (a rank that leaves takes the instance out of service) and unmaps.
// Thread-safety: CheckPeers, Break and broken() are thread-safe; the
// user area's protocol is the owner's.
#ifndef MMSERVE_WORKER_SHM_SEGMENT_H_
#define MMSERVE_WORKER_SHM_SEGMENT_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace mmserve::worker {

inline constexpr int kMaxShmRanks = 16;

// OK for 1 to 200 characters of [A-Za-z0-9_.-] (segment names are built
// from instance ids); InvalidArgument otherwise.
[[nodiscard]] absl::Status ValidateInstanceId(const std::string& id);

struct ShmSegmentOptions {
  std::string name;  // "/..." (shm_open), unique per launch
  int rank = 0;
  int world_size = 1;  // 1..kMaxShmRanks
  size_t user_bytes = 0;
  // Any value the ranks must agree on (a layout parameter); a rank that
  // passes another one is refused.
  uint64_t params = 0;
  absl::Duration timeout = absl::Seconds(10);  // Join's wait for the others
};

class ShmSegment {
 public:
  // InvalidArgument if the segment found has another size, world size or
  // params, or this rank is taken; UNAVAILABLE if not every rank mapped it
  // within the timeout; Internal for a failed system call.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<ShmSegment>> Join(
      const ShmSegmentOptions& options);

  ~ShmSegment();
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;

  // user_bytes, 64-byte aligned, zeroed when rank 0 created it.
  void* data() const;
  int rank() const { return options_.rank; }
  int world_size() const { return options_.world_size; }
  const std::string& name() const { return options_.name; }

  // Also woken (FUTEX_WAKE) when the segment breaks: the word the ranks
  // sleep on. Call before use; not thread-safe.
  void WakeOnBreak(std::atomic<uint32_t>* word) { wake_word_ = word; }

  bool broken() const;
  // OK, or UNAVAILABLE if the segment is broken, a peer process is dead, or
  // now > deadline (`what` names the wait in the message); then broken.
  absl::Status CheckPeers(absl::Time deadline, const std::string& what);
  // Sets the broken flag, wakes the sleepers, returns why.
  absl::Status Break(absl::Status why);

 private:
  struct Header;
  ShmSegment(const ShmSegmentOptions& options, void* base, size_t bytes);
  // Polls pred every millisecond with CheckPeers' failure rules.
  template <typename Pred>
  absl::Status PollUntil(Pred pred, absl::Time deadline, const std::string& what);

  ShmSegmentOptions options_;
  Header* header_;
  size_t bytes_;
  std::atomic<uint32_t>* wake_word_ = nullptr;
};

}  // namespace mmserve::worker

#endif  // MMSERVE_WORKER_SHM_SEGMENT_H_
