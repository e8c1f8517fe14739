#include "worker/shm_communicator.h"

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "worker/shm_wait.h"

namespace mmserve::worker {
namespace {

constexpr size_t kHeaderBytes = 4096;
constexpr int64_t kSliceAlignFloats = 16;  // 64 bytes
constexpr int kSpins = 4000;
constexpr int kYields = 64;
constexpr absl::Duration kFutexSlice = absl::Milliseconds(10);
constexpr absl::Duration kPeerCheckEvery = absl::Milliseconds(50);

static_assert(std::atomic<uint32_t>::is_always_lock_free);
static_assert(std::atomic<int64_t>::is_always_lock_free);

}  // namespace

// The communicator's part of the segment; zeroed at creation.
struct ShmCommunicator::Header {
  alignas(64) std::atomic<uint32_t> arrived;  // ranks in the current barrier
  alignas(64) std::atomic<uint32_t> generation;
  std::atomic<int32_t> sleepers;  // ranks in (or entering) a futex wait
  alignas(64) std::atomic<int64_t> sizes[2][kMaxShmRanks];
};

std::string ShmSegmentName(const std::string& instance_id) {
  return absl::StrCat("/mmserve-tp-", instance_id);
}

absl::StatusOr<std::unique_ptr<ShmCommunicator>> ShmCommunicator::Join(
    const ShmCommunicatorOptions& o) {
  static_assert(sizeof(Header) <= kHeaderBytes);
  if (absl::Status s = ValidateInstanceId(o.instance_id); !s.ok()) return s;
  if (o.capacity_floats < kSliceAlignFloats || o.capacity_floats > (int64_t{1} << 30)) {
    return absl::InvalidArgumentError(
        absl::StrCat("capacity ", o.capacity_floats, " floats is outside [16, 2^30]"));
  }
  ShmSegmentOptions so;
  so.name = ShmSegmentName(o.instance_id);
  so.rank = o.rank;
  so.world_size = o.world_size;
  so.user_bytes = kHeaderBytes + 2 * static_cast<size_t>(std::max(o.world_size, 0)) *
                                     o.capacity_floats * sizeof(float);
  so.params = static_cast<uint64_t>(o.capacity_floats);
  so.timeout = o.timeout;
  auto segment = ShmSegment::Join(so);
  if (!segment.ok()) return segment.status();
  return std::unique_ptr<ShmCommunicator>(new ShmCommunicator(o, *std::move(segment)));
}

ShmCommunicator::ShmCommunicator(const ShmCommunicatorOptions& options,
                                 std::unique_ptr<ShmSegment> segment)
    : options_(options),
      segment_(std::move(segment)),
      header_(static_cast<Header*>(segment_->data())) {
  segment_->WakeOnBreak(&header_->generation);
}

ShmCommunicator::~ShmCommunicator() = default;

float* ShmCommunicator::Slot(int set, int rank) const {
  char* data = static_cast<char*>(segment_->data()) + kHeaderBytes;
  return reinterpret_cast<float*>(data) +
         (static_cast<int64_t>(set) * options_.world_size + rank) * options_.capacity_floats;
}

absl::Status ShmCommunicator::Wait() {
  Header* h = header_;
  const std::string what =
      absl::StrCat("waiting more than ", absl::FormatDuration(options_.timeout), " for its peers");
  if (segment_->broken()) return segment_->CheckPeers(absl::InfiniteFuture(), what);
  const uint32_t gen = h->generation.load(std::memory_order_acquire);
  if (h->arrived.fetch_add(1, std::memory_order_acq_rel) + 1 ==
      static_cast<uint32_t>(options_.world_size)) {
    h->arrived.store(0, std::memory_order_relaxed);
    h->generation.store(gen + 1, std::memory_order_seq_cst);
    if (h->sleepers.load(std::memory_order_seq_cst) > 0) FutexWakeAll(&h->generation);
    return absl::OkStatus();
  }
  auto passed = [h, gen] { return h->generation.load(std::memory_order_acquire) != gen; };
  for (int i = 0; i < kSpins; ++i) {
    if (passed()) return absl::OkStatus();
    CpuRelax();
  }
  for (int i = 0; i < kYields; ++i) {
    if (passed()) return absl::OkStatus();
    sched_yield();
  }
  const absl::Time deadline = absl::Now() + options_.timeout;
  absl::Time next_check = absl::Now() + kPeerCheckEvery;
  while (!passed()) {
    if (segment_->broken()) return segment_->CheckPeers(deadline, what);
    h->sleepers.fetch_add(1, std::memory_order_seq_cst);
    FutexWait(&h->generation, gen, kFutexSlice);
    h->sleepers.fetch_sub(1, std::memory_order_seq_cst);
    if (passed()) break;
    const absl::Time now = absl::Now();
    if (now >= next_check || now > deadline) {
      absl::Status s = segment_->CheckPeers(deadline, what);
      if (!s.ok()) return s;
      next_check = now + kPeerCheckEvery;
    }
  }
  return absl::OkStatus();
}

absl::Status ShmCommunicator::CheckSizes(int set, int64_t n) {
  for (int r = 0; r < options_.world_size; ++r) {
    const int64_t other = header_->sizes[set][r].load(std::memory_order_relaxed);
    if (other != n) {
      return segment_->Break(absl::InvalidArgumentError(
          absl::StrCat("collective size mismatch: rank ", options_.rank, " passed ", n,
                       " floats, rank ", r, " passed ", other)));
    }
  }
  return absl::OkStatus();
}

absl::Status ShmCommunicator::AllReduceSum(absl::Span<float> data) {
  const int world = options_.world_size;
  if (world == 1) return absl::OkStatus();
  const int64_t n = static_cast<int64_t>(data.size());
  int64_t off = 0;
  do {
    const int64_t c = std::min(options_.capacity_floats, n - off);
    const int set = static_cast<int>(calls_++ & 1);
    header_->sizes[set][options_.rank].store(n, std::memory_order_relaxed);
    if (c > 0) std::memcpy(Slot(set, options_.rank), data.data() + off, c * sizeof(float));
    absl::Status s = Wait();
    if (!s.ok()) return s;
    s = CheckSizes(set, n);
    if (!s.ok()) return s;
    // This rank's slice, in whole cache lines.
    const int64_t per =
        ((c + world - 1) / world + kSliceAlignFloats - 1) / kSliceAlignFloats * kSliceAlignFloats;
    const int64_t begin = std::min(c, options_.rank * per);
    const int64_t end = std::min(c, begin + per);
    float* __restrict dst = Slot(set, 0);
    for (int r = 1; r < world; ++r) {
      const float* __restrict src = Slot(set, r);
      for (int64_t i = begin; i < end; ++i) dst[i] += src[i];
    }
    s = Wait();
    if (!s.ok()) return s;
    if (c > 0) std::memcpy(data.data() + off, Slot(set, 0), c * sizeof(float));
    off += c;
  } while (off < n);
  return absl::OkStatus();
}

absl::Status ShmCommunicator::GatherImpl(absl::Span<const float> in, absl::Span<float> out,
                                         bool to_all) {
  const int world = options_.world_size;
  const int64_t n = static_cast<int64_t>(in.size());
  const bool receives = to_all || options_.rank == 0;
  if (receives && static_cast<int64_t>(out.size()) < world * n) {
    // The peers are already waiting for this call: take them down too.
    return segment_->Break(
        absl::InvalidArgumentError(absl::StrCat("gather output has ", out.size(), " floats; ",
                                                world, " ranks x ", n, " need ", world * n)));
  }
  if (world == 1) {
    std::copy(in.begin(), in.end(), out.begin());
    return absl::OkStatus();
  }
  int64_t off = 0;
  do {
    const int64_t c = std::min(options_.capacity_floats, n - off);
    const int set = static_cast<int>(calls_++ & 1);
    header_->sizes[set][options_.rank].store(n, std::memory_order_relaxed);
    if (c > 0) std::memcpy(Slot(set, options_.rank), in.data() + off, c * sizeof(float));
    absl::Status s = Wait();
    if (!s.ok()) return s;
    s = CheckSizes(set, n);
    if (!s.ok()) return s;
    if (receives && c > 0) {
      for (int r = 0; r < world; ++r) {
        std::memcpy(out.data() + r * n + off, Slot(set, r), c * sizeof(float));
      }
    }
    off += c;
  } while (off < n);
  return absl::OkStatus();
}

absl::Status ShmCommunicator::Gather(absl::Span<const float> in, absl::Span<float> out) {
  return GatherImpl(in, out, /*to_all=*/false);
}

absl::Status ShmCommunicator::AllGather(absl::Span<const float> in, absl::Span<float> out) {
  return GatherImpl(in, out, /*to_all=*/true);
}

absl::Status ShmCommunicator::Broadcast(absl::Span<float> data) {
  if (options_.world_size == 1) return absl::OkStatus();
  const int64_t n = static_cast<int64_t>(data.size());
  int64_t off = 0;
  do {
    const int64_t c = std::min(options_.capacity_floats, n - off);
    const int set = static_cast<int>(calls_++ & 1);
    header_->sizes[set][options_.rank].store(n, std::memory_order_relaxed);
    if (options_.rank == 0 && c > 0) {
      std::memcpy(Slot(set, 0), data.data() + off, c * sizeof(float));
    }
    absl::Status s = Wait();
    if (!s.ok()) return s;
    s = CheckSizes(set, n);
    if (!s.ok()) return s;
    if (options_.rank != 0 && c > 0) {
      std::memcpy(data.data() + off, Slot(set, 0), c * sizeof(float));
    }
    off += c;
  } while (off < n);
  return absl::OkStatus();
}

absl::Status ShmCommunicator::Barrier() {
  if (options_.world_size == 1) return absl::OkStatus();
  return Wait();
}

}  // namespace mmserve::worker
