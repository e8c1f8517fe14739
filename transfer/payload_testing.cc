#include "transfer/payload_testing.h"

#include <cstring>

namespace mmserve::transfer {
namespace {

uint64_t SplitMix(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace

std::string ExpectedSection(const EmbeddingLayout& layout, const PayloadSpec& spec, int section) {
  std::string out(layout.TokenBytes(section) * spec.total_tokens, '\0');
  if (section == kAux) {
    AuxRecord aux{static_cast<int32_t>(spec.total_tokens), static_cast<int32_t>(spec.image_index),
                  0};
    for (uint32_t t = 0; t < spec.total_tokens; ++t) {
      std::memcpy(&out[t * sizeof(aux)], &aux, sizeof(aux));
    }
    return out;
  }
  uint64_t state = spec.seed * 1000003u + spec.image_index * 131u + section;
  size_t i = 0;
  for (; i + 8 <= out.size(); i += 8) {
    uint64_t v = SplitMix(state);
    std::memcpy(&out[i], &v, 8);
  }
  for (; i < out.size(); ++i) out[i] = static_cast<char>(SplitMix(state));
  return out;
}

void WriteImage(EmbeddingBuffer& buffer, const BlockAllocation& blocks, const PayloadSpec& spec) {
  const ChunkRanges ranges = buffer.layout().ChunkInfo(blocks, 0, spec.total_tokens);
  for (int s = 0; s < kNumSections; ++s) {
    std::string bytes = ExpectedSection(buffer.layout(), spec, s);
    std::memcpy(buffer.data() + ranges[s].offset, bytes.data(), bytes.size());
  }
}

}  // namespace mmserve::transfer
