// The per-token sections of one image in the embedding buffer, as the
// encoder writes them and the language side reads them back: one format,
// written and parsed here only (the section layout is embedding_buffer.h's).
//
//   // Encoder, into blocks allocated for grid.num_tokens() tokens:
//   RETURN_IF_ERROR(EncodeImage({.image_index = 0, .fill_id = ImageFillId(hash.low),
//                                .grid = {.t = 1, .rows = 16, .cols = 16}},
//                               embedding, blocks, buffer));
//   // Language, from a received image:
//   ASSIGN_OR_RETURN(MediaTokenGrid g,
//                    DecodeImageGrid(image.Section(kMrope), image.total_tokens()));
//
// Per token k of n = t * rows * cols (row-major over the merged grid):
//   embedding  hidden_size values: the image's sections side by side, each
//              a run of section_width values (the tower's main output row
//              k, then Qwen3-VL's DeepStack features of token k in
//              deepstack_visual_indexes order)
//   fill id    the image's fill id (from its content hash, so that prefix
//              caching sees the image's content)
//   M-RoPE     {(k / (rows * cols)) * time_step, (k % (rows * cols)) / cols,
//              k % cols}: time_step is 1 but for Qwen2.5-VL's videos, whose
//              time axis is scaled to seconds (model::MediaGrid::time_step)
//   aux        {n, image_index, section header}
// The section header is versioned: version 2 packs (2 << 28) | (count << 20)
// | section_width (count in [1, 255], width in [1, 2^20)); 0 is version 1,
// written before sections existed: one section filling the row. Every
// token of an image carries the same header.
// Stateless functions; thread-safe as far as the caller owns the blocks.
#ifndef MMSERVE_TRANSFER_EMBEDDING_LAYOUT_H_
#define MMSERVE_TRANSFER_EMBEDDING_LAYOUT_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "transfer/block_allocator.h"
#include "transfer/embedding_buffer.h"

namespace mmserve::transfer {

// An image's tokens after the spatial merge: t frames of rows x cols, the
// M-RoPE time position advancing time_step per frame (>= 0).
struct MediaTokenGrid {
  int32_t t = 0;
  int32_t rows = 0;
  int32_t cols = 0;
  int32_t time_step = 1;

  int64_t num_tokens() const { return int64_t{t} * rows * cols; }
  bool operator==(const MediaTokenGrid& o) const {
    return t == o.t && rows == o.rows && cols == o.cols && time_step == o.time_step;
  }
};

// How an image's embedding rows divide into sections.
struct EmbeddingSections {
  int version = 2;
  uint32_t count = 1;  // the main embedding, then one per DeepStack feature
  uint32_t width = 0;  // values per section; count * width = the row's
  bool operator==(const EmbeddingSections& o) const {
    return version == o.version && count == o.count && width == o.width;
  }
};

struct MediaRowsHeader {
  uint32_t image_index = 0;
  int32_t fill_id = 0;
  MediaTokenGrid grid;
  uint32_t sections = 1;  // equal sections per row (the buffer's hidden_size)
};

inline constexpr int kSectionLayoutVersion = 2;
inline constexpr uint32_t kMaxSections = 255;
inline constexpr uint32_t kMaxSectionWidth = (1u << 20) - 1;

// The aux flags word of `s` (version 2; s must be in range).
int32_t SectionHeaderWord(const EmbeddingSections& s);

// The fill id of an image whose content hash has this low word.
inline int32_t ImageFillId(uint64_t content_hash_low) {
  return static_cast<int32_t>(content_hash_low & 0x7fffffff);
}

// Writes the image's grid.num_tokens() tokens into the first tokens of
// `blocks` in `buffer`, with a version 2 header of header.sections sections.
// InvalidArgument when the grid is empty, when `embedding` is not num_tokens
// x hidden_size floats, when the sections do not divide hidden_size, when
// the buffer does not hold floats, or when the tokens do not fit `blocks`.
[[nodiscard]] absl::Status EncodeImage(const MediaRowsHeader& header,
                                       absl::Span<const float> embedding,
                                       const BlockAllocation& blocks, EmbeddingBuffer& buffer);

// The grid from an image's M-RoPE section (`num_tokens` x 3 int32, in token
// order). DataLoss when the section is short or long, or when its positions
// are not exactly those EncodeImage writes for some grid of num_tokens.
[[nodiscard]] absl::StatusOr<MediaTokenGrid> DecodeImageGrid(absl::string_view mrope,
                                                             uint32_t num_tokens);

// The section layout from an image's aux section (`num_tokens` x 3 int32)
// for rows of `row_width` values: version 1 (header 0) is one section of
// row_width. DataLoss when the section is short or long, when the tokens'
// headers differ, or when a header's version is unknown or its sections do
// not fill the row.
[[nodiscard]] absl::StatusOr<EmbeddingSections> DecodeImageSections(absl::string_view aux,
                                                                    uint32_t num_tokens,
                                                                    uint32_t row_width);

// DecodeImageSections, and DataLoss unless the image has `count` sections
// (the receiver's model takes a main embedding and count - 1 DeepStack
// features).
[[nodiscard]] absl::Status ExpectImageSections(absl::string_view aux, uint32_t num_tokens,
                                               uint32_t row_width, uint32_t count);

}  // namespace mmserve::transfer

#endif  // MMSERVE_TRANSFER_EMBEDDING_LAYOUT_H_
