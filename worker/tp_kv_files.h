// The KV caches of a tensor-parallel prefill instance's ranks, in memory
// rank 0 reads: each shard rank's cache lies in an anonymous shared-memory
// file (memfd) that rank 0 creates and the rank inherits, so rank 0 hands
// every rank's KV heads off to the decode instance straight from where that
// rank's forward wrote them (no gather, no copy through rank 0's cache).
//
//   // rank 0, before the group starts:
//   ASSIGN_OR_RETURN(std::unique_ptr<TpKvFiles> files, TpKvFiles::Create(tp));
//   engine_options.tp_shard_kv_fds = files->fds();  // TpGroupOptions::kv_fds
//   // once the engine sized its cache (every rank's has rank 0's shape):
//   ASSIGN_OR_RETURN(std::unique_ptr<TpKvView> rank1, files->Map(1, shape));
//   // a shard rank (worker/tp_shard_main.cc, --kv_fd):
//   ShardKvFile hooks(fd);
//   RETURN_IF_ERROR(RunShardSteps(ring, model, input, &hooks));
//
// The file grows to the cache's size on whichever side maps it first and
// never shrinks; a rank's forward writes its cache before the collective
// that ends each layer, so rank 0 reads a layer once its own forward is past
// it. Nothing is left behind on any exit path: a file lives while some
// process maps it or holds its descriptor, and has no name.
// Thread-safety: a TpKvView is read from any thread; the rest is its
// owner's.
#ifndef MMSERVE_WORKER_TP_KV_FILES_H_
#define MMSERVE_WORKER_TP_KV_FILES_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "model/kv_cache.h"
#include "worker/tp_step_loop.h"

namespace mmserve::worker {

// One rank's cache mapped here (read-write, shared with the rank).
class TpKvView {
 public:
  ~TpKvView();
  TpKvView(const TpKvView&) = delete;
  TpKvView& operator=(const TpKvView&) = delete;
  model::KvCache& cache() { return *cache_; }

 private:
  friend absl::StatusOr<std::unique_ptr<TpKvView>> MapKvFile(int fd,
                                                             const model::KvCacheShape& shape);
  TpKvView(void* data, size_t bytes) : data_(data), bytes_(bytes) {}
  void* data_;
  size_t bytes_;
  std::unique_ptr<model::KvCache> cache_;
};

// Maps a cache of `shape` on `fd`, growing the file to fit. Internal for a
// failed system call.
[[nodiscard]] absl::StatusOr<std::unique_ptr<TpKvView>> MapKvFile(int fd,
                                                                  const model::KvCacheShape& shape);

// Rank 0's side: one file per shard rank.
class TpKvFiles {
 public:
  // Files for ranks 1..tp_size-1. Internal for a failed memfd_create.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<TpKvFiles>> Create(int tp_size);
  ~TpKvFiles();
  TpKvFiles(const TpKvFiles&) = delete;
  TpKvFiles& operator=(const TpKvFiles&) = delete;

  // Close-on-exec descriptors, rank 1 first (TpGroupOptions::kv_fds).
  const std::vector<int>& fds() const { return fds_; }
  // Rank `rank`'s cache (1..tp_size-1), shaped as rank 0's.
  [[nodiscard]] absl::StatusOr<std::unique_ptr<TpKvView>> Map(int rank,
                                                              const model::KvCacheShape& shape);

 private:
  TpKvFiles() = default;
  std::vector<int> fds_;
};

// A shard rank's RunShardSteps hooks: its cache in the inherited file.
// kKvRegister and kKvCheck are FailedPrecondition (a prefill rank receives
// nothing).
class ShardKvFile final : public ShardKvHooks {
 public:
  explicit ShardKvFile(int fd) : fd_(fd) {}
  ~ShardKvFile() override;
  void Release() override { view_.reset(); }
  [[nodiscard]] absl::StatusOr<model::KvCache*> Allocate(const model::KvCacheShape& shape) override;
  [[nodiscard]] absl::Status Register(model::KvCache& kv) override;
  [[nodiscard]] absl::Status Check(model::KvCache& kv, const std::vector<int32_t>& blocks) override;

 private:
  const int fd_;
  std::unique_ptr<TpKvView> view_;
};

}  // namespace mmserve::worker

#endif  // MMSERVE_WORKER_TP_KV_FILES_H_
