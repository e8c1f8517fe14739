// Embedding buffer memory and its section layout (after SGLang's MultimodalDataBuffers).
//
// The buffer holds num_blocks * block_size token slots in four sections,
// stored section-major as proto EmbeddingBufferLayout describes:
//   [embedding: hidden_size x dtype][fill id: int32][M-RoPE: 3 x int32]
//   [aux: 3 x int32 = total length, image index, section header]
// so any run of contiguous blocks is one contiguous byte range per section and
// a chunk of tokens is exactly four byte ranges.
//
//   EmbeddingBuffer buf(EmbeddingLayout{.block_size = 128, .num_blocks = 64,
//                                       .hidden_size = 3584, .dtype_bytes = 2});
//   ChunkRanges r = buf.layout().ChunkInfo(allocation, /*offset_tokens=*/0, 1024);
//   std::memcpy(buf.data() + r[kEmbedding].offset, src, r[kEmbedding].size);
//
// The memory is page-aligned and zeroed, or memory the caller lends (the
// transfer engine lends UCX-allocated shared memory). EmbeddingBuffer is not
// thread-safe by itself: callers write a token range only while they hold its
// blocks.
#ifndef MMSERVE_TRANSFER_EMBEDDING_BUFFER_H_
#define MMSERVE_TRANSFER_EMBEDDING_BUFFER_H_

#include <array>
#include <cstddef>
#include <cstdint>

#include "transfer/block_allocator.h"

namespace mmserve::transfer {

enum EmbeddingSection : int { kEmbedding = 0, kFillId = 1, kMrope = 2, kAux = 3 };
inline constexpr int kNumSections = 4;

// Fields of the aux record every token carries.
struct AuxRecord {
  int32_t total_tokens;
  int32_t image_index;
  int32_t flags;  // the section header (embedding_layout.h)
};

struct ByteRange {
  size_t offset = 0;  // from the start of the buffer
  size_t size = 0;
};
using ChunkRanges = std::array<ByteRange, kNumSections>;

struct EmbeddingLayout {
  uint32_t block_size = 128;
  uint32_t num_blocks = 64;
  uint32_t hidden_size = 0;
  // Bytes per embedding element (2 for bf16/fp16, 4 for fp32).
  uint32_t dtype_bytes = 2;

  size_t total_tokens() const { return size_t{block_size} * num_blocks; }
  // Bytes one token occupies in `section`.
  size_t TokenBytes(int section) const;
  // Bytes of one token across all four sections.
  size_t BytesPerToken() const;
  // Offset of `section`'s first byte in the buffer.
  size_t SectionOffset(int section) const;
  size_t total_bytes() const;
  // Whether `allocation` (from the wire: a peer's) lies inside a buffer of
  // this layout, its num_tokens inside its blocks, and tokens
  // [offset_tokens, offset_tokens + num_tokens) inside its num_tokens: what
  // ChunkInfo needs, checked without failing.
  bool FitsChunk(const BlockAllocation& allocation, uint32_t offset_tokens,
                 uint32_t num_tokens) const;
  // Byte ranges, per section, of tokens [offset_tokens, offset_tokens + num_tokens)
  // of `allocation` (CHECKs that they lie inside its blocks).
  ChunkRanges ChunkInfo(const BlockAllocation& allocation, uint32_t offset_tokens,
                        uint32_t num_tokens) const;
};

// The memory of one buffer: owned (anonymous pages) or lent by the caller.
class EmbeddingBuffer {
 public:
  explicit EmbeddingBuffer(const EmbeddingLayout& layout);
  // Uses `memory` (at least layout.total_bytes(), 64-byte aligned), which
  // must outlive the buffer.
  EmbeddingBuffer(const EmbeddingLayout& layout, uint8_t* memory);
  ~EmbeddingBuffer();
  EmbeddingBuffer(const EmbeddingBuffer&) = delete;
  EmbeddingBuffer& operator=(const EmbeddingBuffer&) = delete;

  const EmbeddingLayout& layout() const { return layout_; }
  uint8_t* data() { return data_; }
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  EmbeddingLayout layout_;
  size_t size_;
  uint8_t* data_;
  bool owned_;
};

}  // namespace mmserve::transfer

#endif  // MMSERVE_TRANSFER_EMBEDDING_BUFFER_H_
