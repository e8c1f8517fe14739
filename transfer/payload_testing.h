// Deterministic image payloads for transfer tests and benchmarks: both ends of
// a multi-process test derive the same bytes from (seed, image length, image
// index), so the receiver checks byte for byte without shipping the data.
//
//   WriteImage(buffer, blocks, {.seed = 7, .total_tokens = 600, .image_index = 0});
//   CHECK(received.Section(kEmbedding) == ExpectedSection(layout, spec, kEmbedding));
//
// Thread-compatible (pure functions over the caller's memory).
#ifndef MMSERVE_TRANSFER_PAYLOAD_TESTING_H_
#define MMSERVE_TRANSFER_PAYLOAD_TESTING_H_

#include <cstdint>
#include <string>

#include "transfer/block_allocator.h"
#include "transfer/embedding_buffer.h"

namespace mmserve::transfer {

struct PayloadSpec {
  uint64_t seed = 1;
  uint32_t total_tokens = 0;
  uint32_t image_index = 0;
};

// All tokens' bytes of `section` (aux = {total_tokens, image_index, 0}).
std::string ExpectedSection(const EmbeddingLayout& layout, const PayloadSpec& spec, int section);
// Writes the image into tokens [0, total_tokens) of `blocks`.
void WriteImage(EmbeddingBuffer& buffer, const BlockAllocation& blocks, const PayloadSpec& spec);

}  // namespace mmserve::transfer

#endif  // MMSERVE_TRANSFER_PAYLOAD_TESTING_H_
