// Seed 004's control plane for a tensor-parallel instance: rank 0 writes
// each step (a StepMessage: token ids, positions, block tables, slot mapping,
// logits rows, embedding descriptors) into a ring of slots in shared memory
// and wakes the other ranks; they take the steps in order and run them. No
// serialization beyond flat arrays, no RPC per step.
//
//   // rank 0 (the engine thread)
//   RETURN_IF_ERROR(ring->Publish(message));
//   // rank r > 0 (its step loop)
//   StepMessage m;
//   while (ring->Next(&m).ok() && m.kind != StepKind::kStop) Run(m);
//
// Segment "/mmserve-ring-<instance_id>" (lifecycle as ShmSegment): a header
// with the published-step count (the futex word the ranks sleep on) and each
// rank's taken-step count, then num_slots slots of slot_bytes. Rank 0 reuses
// a slot only once every rank has taken the step it held, so it runs at most
// num_slots steps ahead of the slowest rank (the collectives in the forward
// keep it closer than that).
// Failures: a rank (or rank 0) that dies is noticed within about 50 ms by
// the ones waiting on it: UNAVAILABLE, and the segment is marked broken so
// every rank's next call fails too. Rank 0 waits for a free slot at most
// `timeout`; the other ranks wait for the next step without a deadline (an
// idle instance has no steps), watching rank 0's liveness.
// Thread-safety: one thread per rank calls Publish (rank 0) or Next (others).
#ifndef MMSERVE_WORKER_STEP_RING_H_
#define MMSERVE_WORKER_STEP_RING_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "worker/shm_segment.h"
#include "worker/step_message.h"

namespace mmserve::worker {

struct StepRingOptions {
  std::string instance_id;  // as ShmCommunicatorOptions
  int rank = 0;
  int world_size = 1;
  int num_slots = 4;                      // 1..1024
  int64_t slot_bytes = int64_t{1} << 20;  // largest encoded step
  absl::Duration timeout = absl::Seconds(10);
};

std::string StepRingName(const std::string& instance_id);

class StepRing {
 public:
  // As ShmSegment::Join; InvalidArgument for bad slot options.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<StepRing>> Join(
      const StepRingOptions& options);

  StepRing(const StepRing&) = delete;
  StepRing& operator=(const StepRing&) = delete;

  // Rank 0 only (FailedPrecondition elsewhere). ResourceExhausted if m does
  // not fit a slot (nothing is sent; the ring stays usable); UNAVAILABLE if
  // a rank died or no slot came free within the timeout.
  [[nodiscard]] absl::Status Publish(const StepMessage& m);

  // Ranks > 0 only. The next step in publication order; UNAVAILABLE once
  // rank 0 died or the instance is out of service; DataLoss for a corrupt
  // slot (the ring is then broken).
  [[nodiscard]] absl::Status Next(StepMessage* m);

  // As ShmCommunicator::Abort, for the ring (thread-safe).
  void Abort(const std::string& why) { (void)segment_->Break(absl::UnavailableError(why)); }

  // Steps published (rank 0) or taken (other ranks) so far.
  uint64_t steps() const { return steps_; }

 private:
  struct Header;
  StepRing(const StepRingOptions& options, std::unique_ptr<ShmSegment> segment);
  uint8_t* Slot(uint64_t step) const;

  StepRingOptions options_;
  std::unique_ptr<ShmSegment> segment_;
  Header* header_;  // in segment_
  uint64_t steps_ = 0;
};

}  // namespace mmserve::worker

#endif  // MMSERVE_WORKER_STEP_RING_H_
