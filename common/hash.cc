#include "common/hash.h"

#include <xxhash.h>

#include <cstdio>

namespace mmserve {

std::string ContentHash::ToHex() const {
  char buf[33];
  std::snprintf(buf, sizeof(buf), "%016llx%016llx", static_cast<unsigned long long>(high),
                static_cast<unsigned long long>(low));
  return std::string(buf, 32);
}

ContentHash HashBytes(absl::string_view data) {
  XXH128_hash_t h = XXH3_128bits(data.data(), data.size());
  return ContentHash{h.high64, h.low64};
}

uint64_t Hash64(const void* data, size_t size, uint64_t seed) {
  return XXH3_64bits_withSeed(data, size, seed);
}

uint64_t HashCombine(uint64_t seed, uint64_t value) {
  uint64_t pair[2] = {seed, value};
  return XXH3_64bits(pair, sizeof(pair));
}

}  // namespace mmserve
