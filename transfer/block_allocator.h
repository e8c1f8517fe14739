// Block allocator for embedding buffers (after SGLang's ReqToMetadataBlockAllocator).
//
// A buffer holds `num_blocks` blocks of `block_size` tokens. Every allocation
// is one contiguous run {start_block, num_blocks, num_tokens}; free runs are
// coalesced with their neighbours, and an allocation takes the smallest free
// run that fits (best fit), so long-lived small runs fragment the pool as
// little as possible.
//
//   BlockAllocator alloc({.block_size = 128, .num_blocks = 64, .default_num_blocks = 8});
//   ASSIGN_OR_RETURN(BlockAllocation a, alloc.AllocDefault("req-1"));  // 8 blocks
//   ASSIGN_OR_RETURN(BlockAllocation b, alloc.Alloc(2000, "req-2"));   // 16 blocks
//   RETURN_IF_ERROR(alloc.Free(a, "req-1"));
//
// A full (or too fragmented) pool returns RESOURCE_EXHAUSTED: the caller waits
// (AllocWait, or retries when FreeGeneration() moves) - backpressure, never a
// crash. A request larger than the whole pool is INVALID_ARGUMENT, since
// waiting cannot help. Thread-safe.
#ifndef MMSERVE_TRANSFER_BLOCK_ALLOCATOR_H_
#define MMSERVE_TRANSFER_BLOCK_ALLOCATOR_H_

#include <cstdint>
#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"

namespace mmserve::transfer {

// A contiguous run of blocks (after SGLang's MetadataAllocation).
struct BlockAllocation {
  uint32_t start_block = 0;
  uint32_t num_blocks = 0;
  // Tokens the run is meant for, <= num_blocks * block_size.
  uint32_t num_tokens = 0;

  bool operator==(const BlockAllocation& o) const {
    return start_block == o.start_block && num_blocks == o.num_blocks && num_tokens == o.num_tokens;
  }
};

struct BlockAllocatorOptions {
  // Tokens per block (SGLANG_MULTIMODAL_BLOCK_SIZE).
  uint32_t block_size = 128;
  // Blocks in the pool.
  uint32_t num_blocks = 64;
  // Blocks AllocDefault takes (SGLANG_DEFAULT_MULTIMODAL_BLOCKS).
  uint32_t default_num_blocks = 8;
};

class BlockAllocator {
 public:
  // CHECK-fails on a zero block size or pool, or a default larger than the pool.
  explicit BlockAllocator(const BlockAllocatorOptions& options);
  BlockAllocator(const BlockAllocator&) = delete;
  BlockAllocator& operator=(const BlockAllocator&) = delete;

  // default_num_blocks blocks, num_tokens = their capacity (the receiver does
  // not know the length yet).
  [[nodiscard]] absl::StatusOr<BlockAllocation> AllocDefault(absl::string_view req);
  // ceil(num_tokens / block_size) blocks for exactly num_tokens tokens.
  [[nodiscard]] absl::StatusOr<BlockAllocation> Alloc(uint32_t num_tokens, absl::string_view req);
  // Like Alloc, but waits for blocks to be freed until `deadline`
  // (DEADLINE_EXCEEDED then). Do not call from a thread that must free blocks.
  [[nodiscard]] absl::StatusOr<BlockAllocation> AllocWait(uint32_t num_tokens,
                                                          absl::string_view req, Deadline deadline);
  // Returns the run to the pool. The run must be exactly one live allocation
  // made for `req` (else FAILED_PRECONDITION and nothing changes).
  [[nodiscard]] absl::Status Free(const BlockAllocation& allocation, absl::string_view req);

  uint32_t block_size() const { return options_.block_size; }
  uint32_t num_blocks() const { return options_.num_blocks; }
  uint32_t default_num_blocks() const { return options_.default_num_blocks; }
  uint32_t BlocksFor(uint32_t num_tokens) const {
    return (num_tokens + options_.block_size - 1) / options_.block_size;
  }

  uint32_t used_blocks() const;
  uint32_t free_blocks() const;
  // Blocks in the longest free run (the largest allocation possible now).
  uint32_t largest_free_run() const;
  // Number of free runs (1 when the pool is empty and fully coalesced).
  uint32_t num_free_runs() const;
  // Live allocations.
  uint32_t num_allocations() const;
  // Moves on every successful Free: a waiter retries when it changed.
  uint64_t FreeGeneration() const;

 private:
  struct Owner {
    uint32_t num_blocks;
    std::string req;
  };
  absl::StatusOr<BlockAllocation> AllocBlocksLocked(uint32_t num_blocks, uint32_t num_tokens,
                                                    absl::string_view req)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CheckRequest(uint32_t num_tokens) const;

  const BlockAllocatorOptions options_;
  mutable absl::Mutex mu_;
  // Free runs: start block -> length. Adjacent runs never both appear.
  std::map<uint32_t, uint32_t> free_runs_ ABSL_GUARDED_BY(mu_);
  // Live allocations: start block -> owner.
  std::map<uint32_t, Owner> live_ ABSL_GUARDED_BY(mu_);
  uint32_t used_blocks_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t free_generation_ ABSL_GUARDED_BY(mu_) = 0;
};

// Holds one allocation and frees it on destruction (any thread).
class BlockLease {
 public:
  BlockLease(BlockAllocator& allocator, const BlockAllocation& allocation, std::string req)
      : allocator_(allocator), allocation_(allocation), req_(std::move(req)) {}
  ~BlockLease();
  BlockLease(const BlockLease&) = delete;
  BlockLease& operator=(const BlockLease&) = delete;

  const BlockAllocation& allocation() const { return allocation_; }

 private:
  BlockAllocator& allocator_;
  BlockAllocation allocation_;
  std::string req_;
};

}  // namespace mmserve::transfer

#endif  // MMSERVE_TRANSFER_BLOCK_ALLOCATOR_H_
