#include "worker/shm_communicator.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstring>
#include <fstream>
#include <new>
#include <string>

#include "absl/strings/str_cat.h"

namespace mmserve::worker {
namespace {

constexpr uint32_t kMagic = 0x4d4d5450;  // "MMTP"
constexpr size_t kHeaderBytes = 4096;
constexpr int64_t kSliceAlignFloats = 16;  // 64 bytes
constexpr int kSpins = 4000;
constexpr int kYields = 64;
constexpr absl::Duration kFutexSlice = absl::Milliseconds(10);
constexpr absl::Duration kPeerCheckEvery = absl::Milliseconds(50);

static_assert(std::atomic<uint32_t>::is_always_lock_free);
static_assert(std::atomic<int64_t>::is_always_lock_free);

absl::Status Errno(const std::string& call) {
  return absl::InternalError(absl::StrCat(call, ": ", std::strerror(errno)));
}

void CpuRelax() {
#if defined(__x86_64__)
  __builtin_ia32_pause();
#endif
}

// The futex word is in shared memory: no FUTEX_PRIVATE_FLAG.
void FutexWait(std::atomic<uint32_t>* word, uint32_t expected, absl::Duration timeout) {
  const timespec ts = absl::ToTimespec(timeout);
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void FutexWakeAll(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0);
}

// False once the process is gone or a zombie (killed but not yet reaped).
bool ProcessAlive(int32_t pid) {
  if (pid <= 0) return true;  // not arrived yet: Join's deadline covers it
  if (kill(pid, 0) != 0 && errno == ESRCH) return false;
  std::ifstream stat(absl::StrCat("/proc/", pid, "/stat"));
  if (!stat.good()) return false;
  std::string line;
  std::getline(stat, line);
  const size_t paren = line.rfind(')');
  if (paren == std::string::npos || paren + 2 >= line.size()) return true;
  const char state = line[paren + 2];
  return state != 'Z' && state != 'X';
}

bool ValidId(const std::string& id) {
  if (id.empty() || id.size() > 200) return false;
  for (char c : id) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '-')) {
      return false;
    }
  }
  return true;
}

}  // namespace

// Lives at the start of the segment; rank 0 constructs it in place.
struct ShmCommunicator::Header {
  std::atomic<uint32_t> magic;  // kMagic once the rest is initialised
  int32_t world_size;
  int64_t capacity_floats;
  std::atomic<int32_t> mapped;    // ranks that mapped the segment
  std::atomic<int32_t> unlinked;  // 1 once the last of them unlinked the name
  std::atomic<int32_t> broken;    // 1: every call fails with UNAVAILABLE
  std::atomic<int32_t> pids[kMaxShmRanks];
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
  if (!ValidId(o.instance_id)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "instance id '", o.instance_id, "' must be 1 to 200 characters of [A-Za-z0-9_.-]"));
  }
  if (o.world_size < 1 || o.world_size > kMaxShmRanks) {
    return absl::InvalidArgumentError(
        absl::StrCat("world size ", o.world_size, " is outside [1, ", kMaxShmRanks, "]"));
  }
  if (o.rank < 0 || o.rank >= o.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", o.rank, " is outside [0, ", o.world_size, ")"));
  }
  if (o.capacity_floats < kSliceAlignFloats || o.capacity_floats > (int64_t{1} << 30)) {
    return absl::InvalidArgumentError(
        absl::StrCat("capacity ", o.capacity_floats, " floats is outside [16, 2^30]"));
  }
  if (o.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("timeout must be positive");
  }
  const std::string name = ShmSegmentName(o.instance_id);
  const size_t bytes =
      kHeaderBytes + 2 * static_cast<size_t>(o.world_size) * o.capacity_floats * sizeof(float);
  const absl::Time deadline = absl::Now() + o.timeout;
  int fd = -1;
  if (o.rank == 0) {
    fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0 && errno == EEXIST) {
      // Left by a crashed launch with the same id: ids are unique per launch.
      shm_unlink(name.c_str());
      fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    }
    if (fd < 0) return Errno(absl::StrCat("shm_open(", name, ", O_CREAT)"));
    if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
      absl::Status s = Errno(absl::StrCat("ftruncate(", name, ", ", bytes, ")"));
      close(fd);
      shm_unlink(name.c_str());
      return s;
    }
  } else {
    // Wait for rank 0 to create and size it.
    while (true) {
      fd = shm_open(name.c_str(), O_RDWR, 0600);
      if (fd >= 0) {
        struct stat st;
        if (fstat(fd, &st) == 0 && static_cast<size_t>(st.st_size) >= kHeaderBytes) {
          if (static_cast<size_t>(st.st_size) != bytes) {
            close(fd);
            return absl::InvalidArgumentError(absl::StrCat(
                "segment ", name, " has ", st.st_size, " bytes; rank ", o.rank, " expects ", bytes,
                " (world size and capacity must agree on every rank)"));
          }
          break;
        }
        close(fd);
      } else if (errno != ENOENT) {
        return Errno(absl::StrCat("shm_open(", name, ")"));
      }
      if (absl::Now() > deadline) {
        return absl::UnavailableError(absl::StrCat("rank ", o.rank, " found no segment ", name,
                                                   " within ", absl::FormatDuration(o.timeout)));
      }
      absl::SleepFor(absl::Milliseconds(1));
    }
  }
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (base == MAP_FAILED) {
    absl::Status s = Errno(absl::StrCat("mmap(", name, ")"));
    if (o.rank == 0) shm_unlink(name.c_str());
    return s;
  }
  std::unique_ptr<ShmCommunicator> comm(new ShmCommunicator(o, base, bytes));
  Header* h = comm->header_;
  if (o.rank == 0) {
    new (h) Header();
    h->world_size = o.world_size;
    h->capacity_floats = o.capacity_floats;
    h->magic.store(kMagic, std::memory_order_release);
  } else {
    absl::Status s = comm->PollUntil(
        [h] { return h->magic.load(std::memory_order_acquire) == kMagic; }, deadline);
    if (!s.ok()) return s;
    if (h->world_size != o.world_size || h->capacity_floats != o.capacity_floats) {
      return absl::InvalidArgumentError(
          absl::StrCat("segment ", name, " was created for world size ", h->world_size,
                       " and capacity ", h->capacity_floats, "; rank ", o.rank, " asked for ",
                       o.world_size, " and ", o.capacity_floats));
    }
  }
  int32_t expected = 0;
  if (!h->pids[o.rank].compare_exchange_strong(expected, static_cast<int32_t>(getpid()))) {
    comm->header_ = nullptr;  // do not break the instance that owns the rank
    munmap(base, bytes);
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", o.rank, " of ", name, " is already taken by pid ", expected));
  }
  if (h->mapped.fetch_add(1) + 1 == o.world_size) {
    shm_unlink(name.c_str());
    h->unlinked.store(1, std::memory_order_release);
  }
  absl::Status s =
      comm->PollUntil([h] { return h->unlinked.load(std::memory_order_acquire) == 1; }, deadline);
  if (!s.ok()) {
    shm_unlink(name.c_str());  // no rank will map it any more
    return s;
  }
  return comm;
}

ShmCommunicator::ShmCommunicator(const ShmCommunicatorOptions& options, void* base, size_t bytes)
    : options_(options), header_(static_cast<Header*>(base)), bytes_(bytes) {}

ShmCommunicator::~ShmCommunicator() {
  if (header_ == nullptr) return;
  header_->broken.store(1);
  FutexWakeAll(&header_->generation);
  munmap(header_, bytes_);
}

float* ShmCommunicator::Slot(int set, int rank) const {
  char* data = reinterpret_cast<char*>(header_) + kHeaderBytes;
  return reinterpret_cast<float*>(data) +
         (static_cast<int64_t>(set) * options_.world_size + rank) * options_.capacity_floats;
}

absl::Status ShmCommunicator::Break(absl::Status why) {
  broken_ = true;
  header_->broken.store(1);
  FutexWakeAll(&header_->generation);
  return why;
}

absl::Status ShmCommunicator::CheckPeers(absl::Time deadline) {
  if (header_->broken.load() != 0) {
    broken_ = true;
    return absl::UnavailableError(absl::StrCat("tensor-parallel instance ", options_.instance_id,
                                               " is out of service (a rank failed or left)"));
  }
  for (int r = 0; r < options_.world_size; ++r) {
    if (r == options_.rank) continue;
    const int32_t pid = header_->pids[r].load();
    if (!ProcessAlive(pid)) {
      return Break(absl::UnavailableError(absl::StrCat("rank ", r, " (pid ", pid, ") of instance ",
                                                       options_.instance_id, " died")));
    }
  }
  if (absl::Now() > deadline) {
    return Break(absl::UnavailableError(absl::StrCat(
        "rank ", options_.rank, " of instance ", options_.instance_id, " waited more than ",
        absl::FormatDuration(options_.timeout), " for its peers")));
  }
  return absl::OkStatus();
}

template <typename Pred>
absl::Status ShmCommunicator::PollUntil(Pred pred, absl::Time deadline) {
  while (!pred()) {
    absl::Status s = CheckPeers(deadline);
    if (!s.ok()) return s;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return absl::OkStatus();
}

absl::Status ShmCommunicator::Wait() {
  Header* h = header_;
  if (broken_ || h->broken.load(std::memory_order_relaxed) != 0) {
    return CheckPeers(absl::InfiniteFuture());
  }
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
    if (h->broken.load() != 0) return CheckPeers(deadline);
    h->sleepers.fetch_add(1, std::memory_order_seq_cst);
    FutexWait(&h->generation, gen, kFutexSlice);
    h->sleepers.fetch_sub(1, std::memory_order_seq_cst);
    if (passed()) break;
    const absl::Time now = absl::Now();
    if (now >= next_check || now > deadline) {
      absl::Status s = CheckPeers(deadline);
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
      return Break(absl::InvalidArgumentError(
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
    return Break(
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
