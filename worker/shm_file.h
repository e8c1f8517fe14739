// Memory shared by the rank processes of one tensor-parallel instance that
// never has a name in /dev/shm: an anonymous shared-memory file (memfd) that
// rank 0 creates and the shard ranks it spawns inherit by descriptor
// (the receive buffer UCX writes image embeddings into, which
// every rank reads in place).
//
//   ASSIGN_OR_RETURN(std::unique_ptr<ShmFile> f, ShmFile::Create("recv", bytes));
//   // rank 0: lend f->data() to the transfer engine, pass f->fd() to the
//   // shards (TpGroupOptions::shared_input_fd); a shard:
//   ASSIGN_OR_RETURN(std::unique_ptr<ShmFile> f, ShmFile::MapInherited(fd, bytes));
//
// Nothing is left behind on any exit path, SIGKILL included: the file lives
// while some process maps it or holds its descriptor, and has no name to
// unlink. The memory is page-aligned and zeroed at creation. The descriptor
// is close-on-exec; a spawner dup2s it into the child. Thread-safe (const).
#ifndef MMSERVE_WORKER_SHM_FILE_H_
#define MMSERVE_WORKER_SHM_FILE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace mmserve::worker {

class ShmFile {
 public:
  // A new file of `bytes` (> 0) bytes, mapped read-write. `name` only
  // labels it (/proc/<pid>/fd). Internal for a failed system call.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<ShmFile>> Create(const std::string& name,
                                                                       size_t bytes);
  // Maps an inherited descriptor read-only and takes ownership of it.
  // InvalidArgument when `fd` is not open or its file is smaller than
  // `bytes`.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<ShmFile>> MapInherited(int fd, size_t bytes);
  ~ShmFile();
  ShmFile(const ShmFile&) = delete;
  ShmFile& operator=(const ShmFile&) = delete;

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  int fd() const { return fd_; }

 private:
  ShmFile(int fd, uint8_t* data, size_t size) : fd_(fd), data_(data), size_(size) {}
  int fd_;
  uint8_t* data_;
  size_t size_;
};

}  // namespace mmserve::worker

#endif  // MMSERVE_WORKER_SHM_FILE_H_
