#include "worker/step_ring.h"

#include <sched.h>

#include <atomic>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "worker/shm_wait.h"

namespace mmserve::worker {
namespace {

constexpr size_t kHeaderBytes = 4096;
constexpr size_t kSlotHeaderBytes = 64;  // the encoded length, padded
constexpr int kSpins = 2000;
constexpr int kYields = 32;
constexpr absl::Duration kFutexSlice = absl::Milliseconds(10);
constexpr absl::Duration kPeerCheckEvery = absl::Milliseconds(50);

}  // namespace

// The ring's part of the segment; zeroed at creation.
struct StepRing::Header {
  alignas(64) std::atomic<uint32_t> published;  // steps published, mod 2^32
  std::atomic<int32_t> sleepers;                // ranks in (or entering) a futex wait
  alignas(64) std::atomic<uint64_t> taken[kMaxShmRanks];
};

std::string StepRingName(const std::string& instance_id) {
  return absl::StrCat("/mmserve-ring-", instance_id);
}

absl::StatusOr<std::unique_ptr<StepRing>> StepRing::Join(const StepRingOptions& o) {
  static_assert(sizeof(Header) <= kHeaderBytes);
  if (absl::Status s = ValidateInstanceId(o.instance_id); !s.ok()) return s;
  if (o.num_slots < 1 || o.num_slots > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("ring slots ", o.num_slots, " is outside [1, 1024]"));
  }
  if (o.slot_bytes < 256 || o.slot_bytes > (int64_t{1} << 30) || o.slot_bytes % 64 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ring slot of ", o.slot_bytes, " bytes: must be a multiple of 64 in [256, 2^30]"));
  }
  ShmSegmentOptions so;
  so.name = StepRingName(o.instance_id);
  so.rank = o.rank;
  so.world_size = o.world_size;
  so.user_bytes = kHeaderBytes + static_cast<size_t>(o.num_slots) *
                                     (kSlotHeaderBytes + static_cast<size_t>(o.slot_bytes));
  so.params = (static_cast<uint64_t>(o.num_slots) << 32) ^ static_cast<uint64_t>(o.slot_bytes);
  so.timeout = o.timeout;
  auto segment = ShmSegment::Join(so);
  if (!segment.ok()) return segment.status();
  return std::unique_ptr<StepRing>(new StepRing(o, *std::move(segment)));
}

StepRing::StepRing(const StepRingOptions& options, std::unique_ptr<ShmSegment> segment)
    : options_(options),
      segment_(std::move(segment)),
      header_(static_cast<Header*>(segment_->data())) {
  segment_->WakeOnBreak(&header_->published);
}

uint8_t* StepRing::Slot(uint64_t step) const {
  return static_cast<uint8_t*>(segment_->data()) + kHeaderBytes +
         (step % options_.num_slots) * (kSlotHeaderBytes + options_.slot_bytes);
}

absl::Status StepRing::Publish(const StepMessage& m) {
  if (options_.rank != 0) {
    return absl::FailedPreconditionError("only rank 0 publishes steps");
  }
  if (segment_->broken()) return segment_->CheckPeers(absl::InfiniteFuture(), "");
  // A free slot: every rank has taken step steps_ - num_slots.
  const absl::Time deadline = absl::Now() + options_.timeout;
  const std::string what = absl::StrCat("waiting for a free step slot (step ", steps_, ")");
  absl::Time next_check = absl::InfinitePast();
  for (int r = 1; r < options_.world_size; ++r) {
    int polls = 0;
    while (steps_ - header_->taken[r].load(std::memory_order_acquire) >=
           static_cast<uint64_t>(options_.num_slots)) {
      if (++polls < kSpins) {
        CpuRelax();
        continue;
      }
      const absl::Time now = absl::Now();
      if (now >= next_check || now > deadline) {
        absl::Status s = segment_->CheckPeers(deadline, what);
        if (!s.ok()) return s;
        next_check = now + kPeerCheckEvery;
      }
      absl::SleepFor(absl::Microseconds(50));
    }
  }
  uint8_t* slot = Slot(steps_);
  auto written = EncodeStep(m, absl::MakeSpan(slot + kSlotHeaderBytes, options_.slot_bytes));
  if (!written.ok()) return written.status();
  const uint64_t bytes = *written;
  std::memcpy(slot, &bytes, sizeof(bytes));
  ++steps_;
  header_->published.store(static_cast<uint32_t>(steps_), std::memory_order_seq_cst);
  if (header_->sleepers.load(std::memory_order_seq_cst) > 0) FutexWakeAll(&header_->published);
  return absl::OkStatus();
}

absl::Status StepRing::Next(StepMessage* m) {
  if (options_.rank == 0) {
    return absl::FailedPreconditionError("rank 0 publishes steps; it does not take them");
  }
  const uint32_t have = static_cast<uint32_t>(steps_);
  auto ready = [this, have] { return header_->published.load(std::memory_order_acquire) != have; };
  const std::string what = "waiting for the next step";
  // A step published before the ring broke (e.g. rank 0's kStop before it
  // exits) is still taken.
  bool got = ready();
  if (!got && segment_->broken()) return segment_->CheckPeers(absl::InfiniteFuture(), what);
  for (int i = 0; i < kSpins && !got; ++i) {
    got = ready();
    if (!got) CpuRelax();
  }
  for (int i = 0; i < kYields && !got; ++i) {
    got = ready();
    if (!got) sched_yield();
  }
  absl::Time next_check = absl::Now();
  while (!got) {
    if (absl::Now() >= next_check) {
      absl::Status s = segment_->CheckPeers(absl::InfiniteFuture(), what);
      if (!s.ok()) return s;
      next_check = absl::Now() + kPeerCheckEvery;
    }
    header_->sleepers.fetch_add(1, std::memory_order_seq_cst);
    FutexWait(&header_->published, have, kFutexSlice);
    header_->sleepers.fetch_sub(1, std::memory_order_seq_cst);
    got = ready();
    if (!got && segment_->broken()) return segment_->CheckPeers(absl::InfiniteFuture(), what);
  }
  const uint8_t* slot = Slot(steps_);
  uint64_t bytes = 0;
  std::memcpy(&bytes, slot, sizeof(bytes));
  if (bytes > static_cast<uint64_t>(options_.slot_bytes)) {
    return segment_->Break(absl::DataLossError(absl::StrCat(
        "step ", steps_, " claims ", bytes, " bytes in a slot of ", options_.slot_bytes)));
  }
  absl::Status s = DecodeStep(absl::MakeConstSpan(slot + kSlotHeaderBytes, bytes), m);
  if (!s.ok()) return segment_->Break(s);
  ++steps_;
  header_->taken[options_.rank].store(steps_, std::memory_order_release);
  return absl::OkStatus();
}

}  // namespace mmserve::worker
