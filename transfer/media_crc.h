// CRC32C of a published image, kept per unit of tokens, so that the send path
// gets any chunk's checksum by combining unit CRCs instead of re-reading the
// chunk (measured: ~2.5 ms per 28 MiB chunk, a third of a shm transfer).
//
//   MediaCrc crc = MediaCrc::Compute(buffer, image_blocks);  // off the progress thread
//   uint32_t c = crc.Chunk(buffer, /*offset_tokens=*/1024, /*num_tokens=*/976);
//   // == CRC32C over the chunk's four section ranges in order (the notice's crc32c)
//
// Chunk() re-reads only the tokens of unaligned chunk edges (< kUnitTokens on
// each side). The image's bytes must not change after Compute. A value type;
// its methods only read, so distinct threads may use distinct objects.
#ifndef MMSERVE_TRANSFER_MEDIA_CRC_H_
#define MMSERVE_TRANSFER_MEDIA_CRC_H_

#include <array>
#include <cstdint>
#include <vector>

#include "transfer/block_allocator.h"
#include "transfer/embedding_buffer.h"

namespace mmserve::transfer {

class MediaCrc {
 public:
  static constexpr uint32_t kUnitTokens = 64;

  // Reads the image's tokens [0, image.num_tokens) once.
  static MediaCrc Compute(const EmbeddingBuffer& buffer, const BlockAllocation& image);
  // CRC32C over the chunk [offset_tokens, offset_tokens + num_tokens), sections
  // in order; must lie inside the image.
  uint32_t Chunk(const EmbeddingBuffer& buffer, uint32_t offset_tokens, uint32_t num_tokens) const;
  const BlockAllocation& image() const { return image_; }

 private:
  BlockAllocation image_;
  // units_[s][u]: CRC32C of section s over tokens [u * kUnitTokens, ...).
  std::array<std::vector<uint32_t>, kNumSections> units_;
};

// CRC32C over `ranges` of `buffer`, in order (the direct computation).
uint32_t ChunkRangesCrc(const EmbeddingBuffer& buffer, const ChunkRanges& ranges);

}  // namespace mmserve::transfer

#endif  // MMSERVE_TRANSFER_MEDIA_CRC_H_
