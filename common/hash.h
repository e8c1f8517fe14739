// Content hashes (XXH3 from libxxhash). Used for image content hashes (cache
// keys, router affinity, prefix-cache extra keys) and KV block chain hashes.
//
//   ContentHash h = HashBytes(image_bytes);       // 128-bit, for identity
//   uint64_t k = Hash64(tokens.data(), n * 4, seed);  // 64-bit, for tables
//
// Not cryptographic: identity by content hash assumes no adversarial
// collisions, as vLLM's and SGLang's caches do. Thread-safe (pure functions).
#ifndef MMSERVE_COMMON_HASH_H_
#define MMSERVE_COMMON_HASH_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

namespace mmserve {

// A 128-bit content hash. Comparable, hashable, printable as 32 hex digits.
struct ContentHash {
  uint64_t high = 0;
  uint64_t low = 0;

  bool operator==(const ContentHash& o) const { return high == o.high && low == o.low; }
  bool operator!=(const ContentHash& o) const { return !(*this == o); }
  bool operator<(const ContentHash& o) const {
    return high != o.high ? high < o.high : low < o.low;
  }

  std::string ToHex() const;

  template <typename H>
  friend H AbslHashValue(H h, const ContentHash& c) {
    return H::combine(std::move(h), c.high, c.low);
  }
};

// XXH3-128 of `data`.
ContentHash HashBytes(absl::string_view data);

// XXH3-64 of `size` bytes at `data`, with `seed`.
uint64_t Hash64(const void* data, size_t size, uint64_t seed = 0);

// Mixes `value` into `seed` (order-dependent), for chaining hashes.
uint64_t HashCombine(uint64_t seed, uint64_t value);

}  // namespace mmserve

#endif  // MMSERVE_COMMON_HASH_H_
