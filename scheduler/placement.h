// Placement policies the router uses (docs/serving.md):
//
//   // The same image always reaches the same encoder (cache affinity) while
//   // that encoder is healthy; removing one moves only its own images.
//   size_t e = RendezvousPick(image_hash, encoder_ids);
//   // The language instance with the least outstanding work.
//   size_t l = LeastLoaded(outstanding_tokens);
//
// Thread-safe (pure functions).
#ifndef MMSERVE_SCHEDULER_PLACEMENT_H_
#define MMSERVE_SCHEDULER_PLACEMENT_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/hash.h"

namespace mmserve::scheduler {

inline constexpr size_t kNoCandidate = static_cast<size_t>(-1);

// Highest-random-weight hashing: the candidate whose hash combined with
// `key` is largest. kNoCandidate when `candidates` is empty.
size_t RendezvousPick(const ContentHash& key, const std::vector<std::string>& candidates);

// Index of the smallest load (the first among equals); kNoCandidate when
// empty.
size_t LeastLoaded(const std::vector<uint64_t>& loads);

}  // namespace mmserve::scheduler

#endif  // MMSERVE_SCHEDULER_PLACEMENT_H_
