// An LRU cache of image embeddings keyed by the content hash of the encoded
// image bytes, bounded in bytes (the encoder's --cache_mb). A hit skips
// decode, preprocessing and the vision tower.
//
//   EmbeddingCache cache(256 << 20);
//   if (std::shared_ptr<const EncodedMedia> e = cache.Lookup(hash)) { ... hit ... }
//   cache.Insert(hash, std::make_shared<EncodedMedia>(...));
//
// Entries are shared: an evicted entry stays alive while a transfer still
// copies from it. Thread-safe.
#ifndef MMSERVE_ENCODER_SERVICE_EMBEDDING_CACHE_H_
#define MMSERVE_ENCODER_SERVICE_EMBEDDING_CACHE_H_

#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "common/hash.h"
#include "model/image_tokens.h"

namespace mmserve::encoder {

// One encoded image: its patch grid and grid.num_tokens() rows of merged
// embeddings (the language model's hidden size each).
struct EncodedMedia {
  model::MediaGrid grid;
  std::vector<float> embedding;

  size_t bytes() const { return embedding.size() * sizeof(float) + sizeof(*this); }
};

class EmbeddingCache {
 public:
  // capacity_bytes 0 disables the cache (every lookup misses).
  explicit EmbeddingCache(size_t capacity_bytes) : capacity_(capacity_bytes) {}
  EmbeddingCache(const EmbeddingCache&) = delete;
  EmbeddingCache& operator=(const EmbeddingCache&) = delete;

  // The entry, now most recently used; null on a miss.
  std::shared_ptr<const EncodedMedia> Lookup(const ContentHash& key);
  // Adds or replaces an entry, evicting least recently used ones to fit. An
  // entry larger than the whole capacity is not kept.
  void Insert(const ContentHash& key, std::shared_ptr<const EncodedMedia> value);

  struct Stats {
    size_t entries = 0;
    size_t bytes = 0;
    uint64_t hits = 0;
    uint64_t misses = 0;
    uint64_t evictions = 0;
  };
  Stats stats() const;

 private:
  struct Entry {
    ContentHash key;
    std::shared_ptr<const EncodedMedia> value;
  };
  void EvictTo(size_t limit) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const size_t capacity_;
  mutable absl::Mutex mu_;
  std::list<Entry> lru_ ABSL_GUARDED_BY(mu_);  // most recent first
  absl::flat_hash_map<ContentHash, std::list<Entry>::iterator> index_ ABSL_GUARDED_BY(mu_);
  Stats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace mmserve::encoder

#endif  // MMSERVE_ENCODER_SERVICE_EMBEDDING_CACHE_H_
