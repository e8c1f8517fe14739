#include "transfer/media_crc.h"

#include <catch2/catch.hpp>
#include <random>

namespace mmserve::transfer {
namespace {

TEST_CASE("a chunk's combined CRC equals the CRC over its four section ranges") {
  EmbeddingBuffer buffer({.block_size = 16, .num_blocks = 24, .hidden_size = 40});
  std::mt19937 rng(5);
  for (size_t i = 0; i < buffer.size(); ++i) buffer.data()[i] = static_cast<uint8_t>(rng());
  const BlockAllocation image{.start_block = 3, .num_blocks = 20, .num_tokens = 310};
  const MediaCrc crc = MediaCrc::Compute(buffer, image);
  const uint32_t cases[][2] = {{0, 310},  {0, 64},    {0, 16},   {16, 48},  {1, 1},  {63, 2},
                               {64, 128}, {100, 210}, {256, 54}, {300, 10}, {5, 300}};
  for (const auto& c : cases) {
    INFO("offset " << c[0] << " tokens " << c[1]);
    CHECK(crc.Chunk(buffer, c[0], c[1]) ==
          ChunkRangesCrc(buffer, buffer.layout().ChunkInfo(image, c[0], c[1])));
  }
}

}  // namespace
}  // namespace mmserve::transfer
