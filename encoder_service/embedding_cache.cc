#include "encoder_service/embedding_cache.h"

#include <utility>

namespace mmserve::encoder {

std::shared_ptr<const EncodedMedia> EmbeddingCache::Lookup(const ContentHash& key) {
  absl::MutexLock lock(&mu_);
  auto it = index_.find(key);
  if (it == index_.end()) {
    ++stats_.misses;
    return nullptr;
  }
  ++stats_.hits;
  lru_.splice(lru_.begin(), lru_, it->second);
  return it->second->value;
}

void EmbeddingCache::Insert(const ContentHash& key, std::shared_ptr<const EncodedMedia> value) {
  const size_t bytes = value->bytes();
  absl::MutexLock lock(&mu_);
  if (auto it = index_.find(key); it != index_.end()) {
    stats_.bytes -= it->second->value->bytes();
    lru_.erase(it->second);
    index_.erase(it);
    --stats_.entries;
  }
  if (bytes > capacity_) return;
  EvictTo(capacity_ - bytes);
  lru_.push_front(Entry{key, std::move(value)});
  index_[key] = lru_.begin();
  stats_.bytes += bytes;
  ++stats_.entries;
}

void EmbeddingCache::EvictTo(size_t limit) {
  while (stats_.bytes > limit && !lru_.empty()) {
    const Entry& last = lru_.back();
    stats_.bytes -= last.value->bytes();
    index_.erase(last.key);
    lru_.pop_back();
    --stats_.entries;
    ++stats_.evictions;
  }
}

EmbeddingCache::Stats EmbeddingCache::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

}  // namespace mmserve::encoder
