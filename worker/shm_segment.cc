#include "worker/shm_segment.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cstring>
#include <new>

#include "absl/strings/str_cat.h"
#include "worker/shm_wait.h"

namespace mmserve::worker {
namespace {

constexpr uint32_t kMagic = 0x4d4d5348;  // "MMSH"
constexpr size_t kHeaderBytes = 4096;

absl::Status Errno(const std::string& call) {
  return absl::InternalError(absl::StrCat(call, ": ", std::strerror(errno)));
}

absl::Status CheckOptions(const ShmSegmentOptions& o) {
  if (o.world_size < 1 || o.world_size > kMaxShmRanks) {
    return absl::InvalidArgumentError(
        absl::StrCat("world size ", o.world_size, " is outside [1, ", kMaxShmRanks, "]"));
  }
  if (o.rank < 0 || o.rank >= o.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", o.rank, " is outside [0, ", o.world_size, ")"));
  }
  if (o.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("timeout must be positive");
  }
  return absl::OkStatus();
}

// Rank 0: creates the segment's file (replacing one a crashed launch left)
// and sizes it; returns its descriptor.
absl::StatusOr<int> CreateFile(const std::string& name, size_t bytes) {
  int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0 && errno == EEXIST) {
    shm_unlink(name.c_str());  // left by a crashed launch
    fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  }
  if (fd < 0) return Errno(absl::StrCat("shm_open(", name, ", O_CREAT)"));
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    absl::Status s = Errno(absl::StrCat("ftruncate(", name, ", ", bytes, ")"));
    close(fd);
    shm_unlink(name.c_str());
    return s;
  }
  return fd;
}

// The other ranks: opens the file once rank 0 has created and sized it.
absl::StatusOr<int> OpenFile(const ShmSegmentOptions& o, size_t bytes, absl::Time deadline) {
  const std::string& name = o.name;
  while (true) {
    const int fd = shm_open(name.c_str(), O_RDWR, 0600);
    if (fd >= 0) {
      struct stat st;
      if (fstat(fd, &st) == 0 && static_cast<size_t>(st.st_size) >= kHeaderBytes) {
        if (static_cast<size_t>(st.st_size) != bytes) {
          close(fd);
          return absl::InvalidArgumentError(
              absl::StrCat("segment ", name, " has ", st.st_size, " bytes; rank ", o.rank,
                           " expects ", bytes, " (the ranks' options must agree)"));
        }
        return fd;
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

}  // namespace

absl::Status ValidateInstanceId(const std::string& id) {
  bool ok = !id.empty() && id.size() <= 200;
  for (char c : id) {
    ok &= std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '-';
  }
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("instance id '", id, "' must be 1 to 200 characters of [A-Za-z0-9_.-]"));
}

struct ShmSegment::Header {
  std::atomic<uint32_t> magic;  // kMagic once the rest is initialised
  int32_t world_size;
  uint64_t params;
  std::atomic<int32_t> mapped;    // ranks that mapped the segment
  std::atomic<int32_t> unlinked;  // 1 once the last of them unlinked the name
  std::atomic<int32_t> broken;    // 1: the instance is out of service
  std::atomic<int32_t> pids[kMaxShmRanks];
};

ShmSegment::ShmSegment(const ShmSegmentOptions& options, void* base, size_t bytes)
    : options_(options), header_(static_cast<Header*>(base)), bytes_(bytes) {}

ShmSegment::~ShmSegment() {
  if (header_ == nullptr) return;
  header_->broken.store(1);
  if (wake_word_ != nullptr) FutexWakeAll(wake_word_);
  munmap(header_, bytes_);
}

void* ShmSegment::data() const { return reinterpret_cast<char*>(header_) + kHeaderBytes; }

bool ShmSegment::broken() const { return header_->broken.load() != 0; }

absl::Status ShmSegment::Break(absl::Status why) {
  header_->broken.store(1);
  if (wake_word_ != nullptr) FutexWakeAll(wake_word_);
  return why;
}

absl::Status ShmSegment::CheckPeers(absl::Time deadline, const std::string& what) {
  if (broken()) {
    return absl::UnavailableError(absl::StrCat("tensor-parallel instance (", options_.name,
                                               ") is out of service: a rank failed or left"));
  }
  for (int r = 0; r < options_.world_size; ++r) {
    if (r == options_.rank) continue;
    const int32_t pid = header_->pids[r].load();
    if (!ProcessAlive(pid)) {
      return Break(absl::UnavailableError(
          absl::StrCat("rank ", r, " (pid ", pid, ") of ", options_.name, " died")));
    }
  }
  if (absl::Now() > deadline) {
    return Break(absl::UnavailableError(
        absl::StrCat("rank ", options_.rank, " of ", options_.name, " timed out ", what)));
  }
  return absl::OkStatus();
}

template <typename Pred>
absl::Status ShmSegment::PollUntil(Pred pred, absl::Time deadline, const std::string& what) {
  while (!pred()) {
    absl::Status s = CheckPeers(deadline, what);
    if (!s.ok()) return s;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ShmSegment>> ShmSegment::Join(const ShmSegmentOptions& o) {
  static_assert(sizeof(Header) <= kHeaderBytes);
  if (absl::Status s = CheckOptions(o); !s.ok()) return s;
  const std::string& name = o.name;
  const size_t bytes = kHeaderBytes + (o.user_bytes + 63) / 64 * 64;
  const absl::Time deadline = absl::Now() + o.timeout;
  absl::StatusOr<int> opened = o.rank == 0 ? CreateFile(name, bytes) : OpenFile(o, bytes, deadline);
  if (!opened.ok()) return opened.status();
  const int fd = *opened;
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (base == MAP_FAILED) {
    absl::Status s = Errno(absl::StrCat("mmap(", name, ")"));
    if (o.rank == 0) shm_unlink(name.c_str());
    return s;
  }
  std::unique_ptr<ShmSegment> seg(new ShmSegment(o, base, bytes));
  Header* h = seg->header_;
  const std::string joining = absl::StrCat("joining (world size ", o.world_size, ")");
  if (o.rank == 0) {
    new (h) Header();
    h->world_size = o.world_size;
    h->params = o.params;
    h->magic.store(kMagic, std::memory_order_release);
  } else {
    absl::Status s = seg->PollUntil(
        [h] { return h->magic.load(std::memory_order_acquire) == kMagic; }, deadline, joining);
    if (!s.ok()) return s;
    if (h->world_size != o.world_size || h->params != o.params) {
      return absl::InvalidArgumentError(absl::StrCat(
          "segment ", name, " was created for world size ", h->world_size, " and params ",
          h->params, "; rank ", o.rank, " asked for ", o.world_size, " and ", o.params));
    }
  }
  int32_t expected = 0;
  if (!h->pids[o.rank].compare_exchange_strong(expected, static_cast<int32_t>(getpid()))) {
    seg->header_ = nullptr;  // do not break the instance that owns the rank
    munmap(base, bytes);
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", o.rank, " of ", name, " is already taken by pid ", expected));
  }
  if (h->mapped.fetch_add(1) + 1 == o.world_size) {
    shm_unlink(name.c_str());
    h->unlinked.store(1, std::memory_order_release);
  }
  absl::Status s = seg->PollUntil([h] { return h->unlinked.load(std::memory_order_acquire) == 1; },
                                  deadline, joining);
  if (!s.ok()) {
    shm_unlink(name.c_str());  // no rank will map it any more
    return s;
  }
  return seg;
}

}  // namespace mmserve::worker
