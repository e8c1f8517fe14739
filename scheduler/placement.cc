#include "scheduler/placement.h"

namespace mmserve::scheduler {

size_t RendezvousPick(const ContentHash& key, const std::vector<std::string>& candidates) {
  size_t best = kNoCandidate;
  uint64_t best_weight = 0;
  for (size_t i = 0; i < candidates.size(); ++i) {
    const uint64_t id = Hash64(candidates[i].data(), candidates[i].size());
    const uint64_t w = HashCombine(HashCombine(key.high, key.low), id);
    if (best == kNoCandidate || w > best_weight) {
      best = i;
      best_weight = w;
    }
  }
  return best;
}

size_t LeastLoaded(const std::vector<uint64_t>& loads) {
  size_t best = kNoCandidate;
  for (size_t i = 0; i < loads.size(); ++i) {
    if (best == kNoCandidate || loads[i] < loads[best]) best = i;
  }
  return best;
}

}  // namespace mmserve::scheduler
