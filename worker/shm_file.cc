#include "worker/shm_file.h"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace mmserve::worker {
namespace {

absl::Status Errno(const std::string& what) {
  return absl::InternalError(absl::StrCat(what, ": ", std::strerror(errno)));
}

}  // namespace

absl::StatusOr<std::unique_ptr<ShmFile>> ShmFile::Create(const std::string& name, size_t bytes) {
  if (bytes == 0) return absl::InvalidArgumentError("a shared-memory file needs bytes");
  const int fd = memfd_create(absl::StrCat("mmserve-", name).c_str(), MFD_CLOEXEC);
  if (fd < 0) return Errno("memfd_create");
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    absl::Status s = Errno("ftruncate of the shared-memory file");
    close(fd);
    return s;
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    absl::Status s = Errno("mmap of the shared-memory file");
    close(fd);
    return s;
  }
  return std::unique_ptr<ShmFile>(new ShmFile(fd, static_cast<uint8_t*>(p), bytes));
}

absl::StatusOr<std::unique_ptr<ShmFile>> ShmFile::MapInherited(int fd, size_t bytes) {
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("descriptor ", fd, " is not open"));
  }
  if (bytes == 0 || static_cast<size_t>(st.st_size) < bytes) {
    close(fd);
    return absl::InvalidArgumentError(
        absl::StrCat("shared-memory file of ", st.st_size, " bytes is smaller than ", bytes));
  }
  void* p = mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    absl::Status s = Errno("mmap of the inherited shared-memory file");
    close(fd);
    return s;
  }
  return std::unique_ptr<ShmFile>(new ShmFile(fd, static_cast<uint8_t*>(p), bytes));
}

ShmFile::~ShmFile() {
  munmap(data_, size_);
  close(fd_);
}

}  // namespace mmserve::worker
