#include "transfer/media_crc.h"

#include <algorithm>

#include "common/crc32c.h"

namespace mmserve::transfer {

uint32_t ChunkRangesCrc(const EmbeddingBuffer& buffer, const ChunkRanges& ranges) {
  uint32_t crc = 0;
  for (const ByteRange& r : ranges) crc = Crc32cExtend(crc, buffer.data() + r.offset, r.size);
  return crc;
}

MediaCrc MediaCrc::Compute(const EmbeddingBuffer& buffer, const BlockAllocation& image) {
  MediaCrc out;
  out.image_ = image;
  const EmbeddingLayout& layout = buffer.layout();
  const ChunkRanges whole = layout.ChunkInfo(image, 0, image.num_tokens);
  for (int s = 0; s < kNumSections; ++s) {
    const size_t unit_bytes = layout.TokenBytes(s) * kUnitTokens;
    const uint8_t* p = buffer.data() + whole[s].offset;
    for (size_t done = 0; done < whole[s].size; done += unit_bytes) {
      out.units_[s].push_back(Crc32c(p + done, std::min(unit_bytes, whole[s].size - done)));
    }
  }
  return out;
}

uint32_t MediaCrc::Chunk(const EmbeddingBuffer& buffer, uint32_t offset_tokens,
                         uint32_t num_tokens) const {
  const EmbeddingLayout& layout = buffer.layout();
  const ChunkRanges ranges = layout.ChunkInfo(image_, offset_tokens, num_tokens);
  const uint32_t end = offset_tokens + num_tokens;
  // Whole units inside the chunk: [first_unit, last_unit).
  const uint32_t first_unit = (offset_tokens + kUnitTokens - 1) / kUnitTokens;
  const uint32_t last_unit = std::max(first_unit, end / kUnitTokens);
  const uint32_t head_end = std::min(end, first_unit * kUnitTokens);
  uint32_t crc = 0;
  for (int s = 0; s < kNumSections; ++s) {
    const size_t token_bytes = layout.TokenBytes(s);
    const uint8_t* base = buffer.data() + ranges[s].offset;  // token offset_tokens
    crc = Crc32cExtend(crc, base, (head_end - offset_tokens) * token_bytes);
    const size_t unit_bytes = token_bytes * kUnitTokens;
    for (uint32_t u = first_unit; u < last_unit; ++u) {
      crc = Crc32cCombine(crc, units_[s][u], unit_bytes);
    }
    const uint32_t tail_start = std::min(end, std::max(head_end, last_unit * kUnitTokens));
    crc = Crc32cExtend(crc, base + size_t{tail_start - offset_tokens} * token_bytes,
                       size_t{end - tail_start} * token_bytes);
  }
  return crc;
}

}  // namespace mmserve::transfer
