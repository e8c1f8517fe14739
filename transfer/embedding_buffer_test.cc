#include "transfer/embedding_buffer.h"

#include <catch2/catch.hpp>

namespace mmserve::transfer {
namespace {

TEST_CASE("sections are section-major: a run of blocks is one byte range per section") {
  EmbeddingLayout layout{.block_size = 4, .num_blocks = 8, .hidden_size = 6, .dtype_bytes = 2};
  CHECK(layout.TokenBytes(kEmbedding) == 12);
  CHECK(layout.TokenBytes(kFillId) == 4);
  CHECK(layout.TokenBytes(kMrope) == 12);
  CHECK(layout.TokenBytes(kAux) == 12);
  CHECK(layout.SectionOffset(kFillId) == 32 * 12);
  CHECK(layout.SectionOffset(kMrope) == 32 * 16);
  CHECK(layout.SectionOffset(kAux) == 32 * 28);
  CHECK(layout.total_bytes() == 32 * 40);

  BlockAllocation a{2, 3, 10};
  ChunkRanges all = layout.ChunkInfo(a, 0, 10);
  for (int s = 0; s < kNumSections; ++s) {
    CHECK(all[s].offset == layout.SectionOffset(s) + 8 * layout.TokenBytes(s));
    CHECK(all[s].size == 10 * layout.TokenBytes(s));
  }
  ChunkRanges tail = layout.ChunkInfo(a, 7, 5);
  CHECK(tail[kMrope].offset == layout.SectionOffset(kMrope) + 15 * 12);
  CHECK(tail[kMrope].size == 5 * 12);
}

TEST_CASE("FitsChunk refuses allocations from the wire that ChunkInfo would CHECK-fail on") {
  EmbeddingLayout layout{.block_size = 4, .num_blocks = 8, .hidden_size = 6, .dtype_bytes = 2};
  CHECK(layout.FitsChunk({2, 3, 10}, 0, 10));
  CHECK(layout.FitsChunk({2, 3, 10}, 4, 6));
  CHECK(layout.FitsChunk({0, 8, 32}, 0, 32));
  CHECK(layout.FitsChunk({0, 0, 0}, 0, 0));
  CHECK_FALSE(layout.FitsChunk({6, 3, 10}, 0, 1));           // blocks past the buffer
  CHECK_FALSE(layout.FitsChunk({0, 1, 1000}, 0, 10));        // tokens past its blocks
  CHECK_FALSE(layout.FitsChunk({2, 3, 10}, 4, 7));           // chunk past its tokens
  CHECK_FALSE(layout.FitsChunk({0xffffffffu, 2, 1}, 0, 1));  // no 32-bit wrap-around
  CHECK_FALSE(layout.FitsChunk({0, 2, 8}, 0xfffffffcu, 8));
}

TEST_CASE("the buffer is page-aligned, zeroed and sized by the layout") {
  EmbeddingBuffer buf(
      EmbeddingLayout{.block_size = 128, .num_blocks = 2, .hidden_size = 64, .dtype_bytes = 4});
  CHECK(reinterpret_cast<uintptr_t>(buf.data()) % 4096 == 0);
  CHECK(buf.size() == 256 * (256 + 4 + 12 + 12));
  CHECK(buf.data()[buf.size() - 1] == 0);
}

}  // namespace
}  // namespace mmserve::transfer
