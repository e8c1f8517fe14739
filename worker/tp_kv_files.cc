#include "worker/tp_kv_files.h"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace mmserve::worker {
namespace {

absl::Status Errno(const std::string& what) {
  return absl::InternalError(absl::StrCat(what, ": ", std::strerror(errno)));
}

}  // namespace

TpKvView::~TpKvView() {
  cache_.reset();
  munmap(data_, bytes_);
}

absl::StatusOr<std::unique_ptr<TpKvView>> MapKvFile(int fd, const model::KvCacheShape& shape) {
  const size_t bytes = shape.TotalBytes();
  if (bytes == 0) return absl::InvalidArgumentError("a KV cache file needs bytes");
  struct stat st;
  if (fstat(fd, &st) != 0) return Errno("fstat of the KV cache file");
  // Grow only: the other side may have grown it already, and a rank's
  // mapping must never lose pages under it.
  if (static_cast<size_t>(st.st_size) < bytes && ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    return Errno("ftruncate of the KV cache file");
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return Errno("mmap of the KV cache file");
  std::unique_ptr<TpKvView> view(new TpKvView(p, bytes));
  ASSIGN_OR_RETURN(view->cache_, model::KvCache::CreateOn(shape, p, bytes));
  return view;
}

absl::StatusOr<std::unique_ptr<TpKvFiles>> TpKvFiles::Create(int tp_size) {
  std::unique_ptr<TpKvFiles> files(new TpKvFiles());
  for (int rank = 1; rank < tp_size; ++rank) {
    const int fd = memfd_create(absl::StrCat("mmserve-kv-rank", rank).c_str(), MFD_CLOEXEC);
    if (fd < 0) return Errno("memfd_create");
    files->fds_.push_back(fd);
  }
  return files;
}

TpKvFiles::~TpKvFiles() {
  for (int fd : fds_) close(fd);
}

absl::StatusOr<std::unique_ptr<TpKvView>> TpKvFiles::Map(int rank,
                                                         const model::KvCacheShape& shape) {
  if (rank < 1 || rank > static_cast<int>(fds_.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " has no KV cache file (", fds_.size() + 1, " ranks)"));
  }
  return MapKvFile(fds_[rank - 1], shape);
}

ShardKvFile::~ShardKvFile() {
  view_.reset();
  close(fd_);
}

absl::StatusOr<model::KvCache*> ShardKvFile::Allocate(const model::KvCacheShape& shape) {
  view_.reset();
  ASSIGN_OR_RETURN(view_, MapKvFile(fd_, shape));
  return &view_->cache();
}

absl::Status ShardKvFile::Register(model::KvCache& /*kv*/) {
  return absl::FailedPreconditionError("a prefill rank receives no KV (kKvRegister)");
}

absl::Status ShardKvFile::Check(model::KvCache& /*kv*/, const std::vector<int32_t>& /*blocks*/) {
  return absl::FailedPreconditionError("a prefill rank receives no KV (kKvCheck)");
}

}  // namespace mmserve::worker
