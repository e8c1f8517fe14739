#include "transfer/block_allocator.h"

#include <algorithm>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace mmserve::transfer {

BlockAllocator::BlockAllocator(const BlockAllocatorOptions& options) : options_(options) {
  CHECK_GT(options.block_size, 0u);
  CHECK_GT(options.num_blocks, 0u);
  CHECK_GT(options.default_num_blocks, 0u);
  CHECK_LE(options.default_num_blocks, options.num_blocks);
  free_runs_[0] = options.num_blocks;
}

absl::Status BlockAllocator::CheckRequest(uint32_t num_tokens) const {
  if (num_tokens == 0) return absl::InvalidArgumentError("allocation of 0 tokens");
  if (BlocksFor(num_tokens) > options_.num_blocks) {
    return absl::InvalidArgumentError(absl::StrCat("allocation of ", num_tokens,
                                                   " tokens exceeds the pool of ",
                                                   options_.num_blocks, " blocks"));
  }
  return absl::OkStatus();
}

absl::StatusOr<BlockAllocation> BlockAllocator::AllocBlocksLocked(uint32_t num_blocks,
                                                                  uint32_t num_tokens,
                                                                  absl::string_view req) {
  auto best = free_runs_.end();
  for (auto it = free_runs_.begin(); it != free_runs_.end(); ++it) {
    if (it->second >= num_blocks && (best == free_runs_.end() || it->second < best->second)) {
      best = it;
      if (it->second == num_blocks) break;
    }
  }
  if (best == free_runs_.end()) {
    return absl::ResourceExhaustedError(absl::StrCat("embedding buffer full: need ", num_blocks,
                                                     " contiguous blocks, ",
                                                     options_.num_blocks - used_blocks_, " free"));
  }
  BlockAllocation a{best->first, num_blocks, num_tokens};
  uint32_t left = best->second - num_blocks;
  free_runs_.erase(best);
  if (left > 0) free_runs_[a.start_block + num_blocks] = left;
  live_[a.start_block] = Owner{num_blocks, std::string(req)};
  used_blocks_ += num_blocks;
  return a;
}

absl::StatusOr<BlockAllocation> BlockAllocator::AllocDefault(absl::string_view req) {
  absl::MutexLock lock(&mu_);
  return AllocBlocksLocked(options_.default_num_blocks,
                           options_.default_num_blocks * options_.block_size, req);
}

absl::StatusOr<BlockAllocation> BlockAllocator::Alloc(uint32_t num_tokens, absl::string_view req) {
  if (absl::Status s = CheckRequest(num_tokens); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  return AllocBlocksLocked(BlocksFor(num_tokens), num_tokens, req);
}

absl::StatusOr<BlockAllocation> BlockAllocator::AllocWait(uint32_t num_tokens,
                                                          absl::string_view req,
                                                          Deadline deadline) {
  if (absl::Status s = CheckRequest(num_tokens); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  while (true) {
    absl::StatusOr<BlockAllocation> a = AllocBlocksLocked(BlocksFor(num_tokens), num_tokens, req);
    if (a.ok() || !absl::IsResourceExhausted(a.status())) return a;
    uint64_t seen = free_generation_;
    auto freed = [this, seen]()
                     ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return free_generation_ != seen; };
    if (!mu_.AwaitWithTimeout(absl::Condition(&freed), deadline.Remaining())) {
      return absl::DeadlineExceededError(
          absl::StrCat("waited for ", BlocksFor(num_tokens), " blocks: ", a.status().message()));
    }
  }
}

absl::Status BlockAllocator::Free(const BlockAllocation& allocation, absl::string_view req) {
  absl::MutexLock lock(&mu_);
  auto it = live_.find(allocation.start_block);
  if (it == live_.end() || it->second.num_blocks != allocation.num_blocks ||
      it->second.req != req) {
    return absl::FailedPreconditionError(absl::StrCat("free of blocks [", allocation.start_block,
                                                      ", +", allocation.num_blocks, ") by '", req,
                                                      "' that it does not hold"));
  }
  live_.erase(it);
  used_blocks_ -= allocation.num_blocks;
  ++free_generation_;
  uint32_t start = allocation.start_block;
  uint32_t len = allocation.num_blocks;
  auto next = free_runs_.lower_bound(start);
  if (next != free_runs_.end() && next->first == start + len) {
    len += next->second;
    next = free_runs_.erase(next);
  }
  if (next != free_runs_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == start) {
      prev->second += len;
      return absl::OkStatus();
    }
  }
  free_runs_[start] = len;
  return absl::OkStatus();
}

uint32_t BlockAllocator::used_blocks() const {
  absl::MutexLock lock(&mu_);
  return used_blocks_;
}

uint32_t BlockAllocator::free_blocks() const {
  absl::MutexLock lock(&mu_);
  return options_.num_blocks - used_blocks_;
}

uint32_t BlockAllocator::largest_free_run() const {
  absl::MutexLock lock(&mu_);
  uint32_t best = 0;
  for (const auto& [start, len] : free_runs_) best = std::max(best, len);
  return best;
}

uint32_t BlockAllocator::num_free_runs() const {
  absl::MutexLock lock(&mu_);
  return static_cast<uint32_t>(free_runs_.size());
}

uint32_t BlockAllocator::num_allocations() const {
  absl::MutexLock lock(&mu_);
  return static_cast<uint32_t>(live_.size());
}

uint64_t BlockAllocator::FreeGeneration() const {
  absl::MutexLock lock(&mu_);
  return free_generation_;
}

BlockLease::~BlockLease() {
  absl::Status s = allocator_.Free(allocation_, req_);
  if (!s.ok()) LOG(ERROR) << s;
}

}  // namespace mmserve::transfer
