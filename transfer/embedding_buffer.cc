#include "transfer/embedding_buffer.h"

#include <sys/mman.h>

#include "common/logging.h"

namespace mmserve::transfer {

size_t EmbeddingLayout::TokenBytes(int section) const {
  switch (section) {
    case kEmbedding:
      return size_t{hidden_size} * dtype_bytes;
    case kFillId:
      return sizeof(int32_t);
    case kMrope:
      return 3 * sizeof(int32_t);
    case kAux:
      return sizeof(AuxRecord);
  }
  LOG(FATAL) << "bad section " << section;
}

size_t EmbeddingLayout::BytesPerToken() const {
  size_t n = 0;
  for (int s = 0; s < kNumSections; ++s) n += TokenBytes(s);
  return n;
}

size_t EmbeddingLayout::SectionOffset(int section) const {
  size_t offset = 0;
  for (int s = 0; s < section; ++s) offset += TokenBytes(s) * total_tokens();
  return offset;
}

size_t EmbeddingLayout::total_bytes() const { return SectionOffset(kNumSections); }

bool EmbeddingLayout::FitsChunk(const BlockAllocation& allocation, uint32_t offset_tokens,
                                uint32_t num_tokens) const {
  return size_t{allocation.start_block} + allocation.num_blocks <= num_blocks &&
         allocation.num_tokens <= size_t{allocation.num_blocks} * block_size &&
         size_t{offset_tokens} + num_tokens <= allocation.num_tokens;
}

ChunkRanges EmbeddingLayout::ChunkInfo(const BlockAllocation& allocation, uint32_t offset_tokens,
                                       uint32_t num_tokens) const {
  CHECK_LE(size_t{allocation.start_block} + allocation.num_blocks, size_t{num_blocks});
  CHECK_LE(size_t{offset_tokens} + num_tokens, size_t{allocation.num_blocks} * block_size);
  size_t first_token = size_t{allocation.start_block} * block_size + offset_tokens;
  ChunkRanges ranges;
  for (int s = 0; s < kNumSections; ++s) {
    ranges[s].offset = SectionOffset(s) + first_token * TokenBytes(s);
    ranges[s].size = size_t{num_tokens} * TokenBytes(s);
  }
  return ranges;
}

EmbeddingBuffer::EmbeddingBuffer(const EmbeddingLayout& layout)
    : layout_(layout), size_(layout.total_bytes()), owned_(true) {
  CHECK_GT(layout.hidden_size, 0u);
  CHECK_GT(size_, 0u);
  // Anonymous pages: page-aligned, zeroed, and registrable with UCX.
  void* p = mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  CHECK(p != MAP_FAILED) << "mmap of " << size_ << " bytes failed";
  data_ = static_cast<uint8_t*>(p);
}

EmbeddingBuffer::EmbeddingBuffer(const EmbeddingLayout& layout, uint8_t* memory)
    : layout_(layout), size_(layout.total_bytes()), data_(memory), owned_(false) {
  CHECK_GT(layout.hidden_size, 0u);
  CHECK_GT(size_, 0u);
  CHECK_EQ(reinterpret_cast<uintptr_t>(memory) % 64, 0u) << "embedding buffer misaligned";
}

EmbeddingBuffer::~EmbeddingBuffer() {
  if (owned_) munmap(data_, size_);
}

}  // namespace mmserve::transfer
