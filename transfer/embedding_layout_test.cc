#include "transfer/embedding_layout.h"

#include <catch2/catch.hpp>
#include <cstring>
#include <string>
#include <vector>

#include "transfer/block_allocator.h"
#include "transfer/embedding_buffer.h"

namespace mmserve::transfer {
namespace {

constexpr EmbeddingLayout kLayout{
    .block_size = 4, .num_blocks = 16, .hidden_size = 3, .dtype_bytes = sizeof(float)};

std::string Bytes(const EmbeddingBuffer& buffer, const BlockAllocation& blocks, uint32_t n,
                  int section) {
  const ByteRange r = buffer.layout().ChunkInfo(blocks, 0, n)[section];
  return std::string(reinterpret_cast<const char*>(buffer.data() + r.offset), r.size);
}

std::vector<int32_t> Ints(const std::string& bytes) {
  std::vector<int32_t> out(bytes.size() / sizeof(int32_t));
  std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}

std::string Mrope(const std::vector<int32_t>& positions) {
  return std::string(reinterpret_cast<const char*>(positions.data()),
                     positions.size() * sizeof(int32_t));
}

TEST_CASE("an encoded image's sections decode back to its grid") {
  EmbeddingBuffer buffer(kLayout);
  const BlockAllocation blocks{.start_block = 2, .num_blocks = 4, .num_tokens = 12};
  const MediaRowsHeader header{.image_index = 5,
                               .fill_id = ImageFillId(0x80000000deadbeefull),
                               .grid = {.t = 2, .rows = 2, .cols = 3}};
  std::vector<float> embedding(12 * 3);
  for (size_t i = 0; i < embedding.size(); ++i) embedding[i] = 0.5f * static_cast<float>(i);
  REQUIRE(EncodeImage(header, embedding, blocks, buffer).ok());

  const std::string emb = Bytes(buffer, blocks, 12, kEmbedding);
  CHECK(std::memcmp(emb.data(), embedding.data(), emb.size()) == 0);
  CHECK(header.fill_id == 0x5eadbeef);
  for (int32_t f : Ints(Bytes(buffer, blocks, 12, kFillId))) CHECK(f == 0x5eadbeef);
  const std::vector<int32_t> m = Ints(Bytes(buffer, blocks, 12, kMrope));
  // Token 7: second frame (k / 6 = 1), k % 6 = 1 -> row 0, column 1.
  CHECK(std::vector<int32_t>(m.begin() + 21, m.begin() + 24) == std::vector<int32_t>{1, 0, 1});
  const std::vector<int32_t> aux = Ints(Bytes(buffer, blocks, 12, kAux));
  for (size_t k = 0; k < 12; ++k) {
    CHECK(aux[3 * k] == 12);
    CHECK(aux[3 * k + 1] == 5);
    CHECK(aux[3 * k + 2] == (2 << 28 | 1 << 20 | 3));  // version 2, one section of 3
  }
  absl::StatusOr<MediaTokenGrid> grid = DecodeImageGrid(Bytes(buffer, blocks, 12, kMrope), 12);
  REQUIRE(grid.ok());
  CHECK(*grid == header.grid);
  absl::StatusOr<EmbeddingSections> sections =
      DecodeImageSections(Bytes(buffer, blocks, 12, kAux), 12, 3);
  REQUIRE(sections.ok());
  CHECK(*sections == EmbeddingSections{.version = 2, .count = 1, .width = 3});
}

TEST_CASE("an image's DeepStack sections travel beside its main embedding in each row") {
  // Rows of 6 values: the main embedding (2) and two DeepStack features (2 each).
  constexpr EmbeddingLayout kWide{
      .block_size = 4, .num_blocks = 4, .hidden_size = 6, .dtype_bytes = sizeof(float)};
  EmbeddingBuffer buffer(kWide);
  const BlockAllocation blocks{.start_block = 1, .num_blocks = 1, .num_tokens = 4};
  std::vector<float> rows(4 * 6);
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<float>(i);
  REQUIRE(
      EncodeImage({.image_index = 1, .grid = {1, 2, 2}, .sections = 3}, rows, blocks, buffer).ok());
  const std::string emb = Bytes(buffer, blocks, 4, kEmbedding);
  CHECK(std::memcmp(emb.data(), rows.data(), emb.size()) == 0);
  absl::StatusOr<EmbeddingSections> s = DecodeImageSections(Bytes(buffer, blocks, 4, kAux), 4, 6);
  REQUIRE(s.ok());
  CHECK(*s == EmbeddingSections{.version = 2, .count = 3, .width = 2});
  // Sections that do not divide the row are refused when writing.
  CHECK(absl::IsInvalidArgument(
      EncodeImage({.grid = {1, 2, 2}, .sections = 4}, rows, blocks, buffer)));
  CHECK(absl::IsInvalidArgument(
      EncodeImage({.grid = {1, 2, 2}, .sections = 0}, rows, blocks, buffer)));
  // Read as rows of another width, the header does not fill them.
  CHECK(absl::IsDataLoss(DecodeImageSections(Bytes(buffer, blocks, 4, kAux), 4, 8).status()));
}

std::string AuxOf(const std::vector<int32_t>& flags) {
  std::vector<AuxRecord> aux;
  for (int32_t f : flags) aux.push_back({static_cast<int32_t>(flags.size()), 0, f});
  return std::string(reinterpret_cast<const char*>(aux.data()), aux.size() * sizeof(AuxRecord));
}

TEST_CASE("the version 1 layout (no section header) reads as one section") {
  absl::StatusOr<EmbeddingSections> s = DecodeImageSections(AuxOf({0, 0, 0}), 3, 1536);
  REQUIRE(s.ok());
  CHECK(*s == EmbeddingSections{.version = 1, .count = 1, .width = 1536});
  CHECK(ExpectImageSections(AuxOf({0, 0, 0}), 3, 1536, 1).ok());
}

TEST_CASE("a receiver refuses an image with other sections than its model takes") {
  // Three sections of 4 (an embedding and two DeepStack features).
  const int32_t three = SectionHeaderWord({.count = 3, .width = 4});
  CHECK(ExpectImageSections(AuxOf({three, three}), 2, 12, 3).ok());
  const absl::Status fewer = ExpectImageSections(AuxOf({three, three}), 2, 12, 4);
  CHECK(absl::IsDataLoss(fewer));
  CHECK(fewer.message() == "embedding of 3 sections; the model takes 4");
  // A version 1 image (no features) for a model that needs them.
  CHECK(absl::IsDataLoss(ExpectImageSections(AuxOf({0, 0}), 2, 12, 3)));
  // Malformed headers are refused as by DecodeImageSections.
  CHECK(absl::IsDataLoss(ExpectImageSections(AuxOf({three, 0}), 2, 12, 3)));
}

TEST_CASE("section headers that disagree, are unknown or are cut short are data loss") {
  const int32_t two = SectionHeaderWord({.count = 2, .width = 4});
  CHECK(DecodeImageSections(AuxOf({two, two}), 2, 8).ok());
  CHECK(absl::IsDataLoss(DecodeImageSections(AuxOf({two, 0}), 2, 8).status()));
  CHECK(absl::IsDataLoss(DecodeImageSections(AuxOf({two, two}), 3, 8).status()));
  CHECK(absl::IsDataLoss(DecodeImageSections(AuxOf({two, two}).substr(1), 2, 8).status()));
  CHECK(absl::IsDataLoss(DecodeImageSections("", 0, 8).status()));
  const int32_t v3 = static_cast<int32_t>((3u << 28) | (2u << 20) | 4u);
  const absl::Status unknown = DecodeImageSections(AuxOf({v3}), 1, 8).status();
  CHECK(absl::IsDataLoss(unknown));
  CHECK(unknown.message() == "unknown section layout version 3");
  const int32_t empty = static_cast<int32_t>((2u << 28) | 4u);
  CHECK(absl::IsDataLoss(DecodeImageSections(AuxOf({empty}), 1, 8).status()));
}

TEST_CASE("a one-token image round-trips") {
  EmbeddingBuffer buffer(kLayout);
  const BlockAllocation blocks{.start_block = 0, .num_blocks = 1, .num_tokens = 1};
  REQUIRE(EncodeImage({.grid = {1, 1, 1}}, std::vector<float>(3, 1.0f), blocks, buffer).ok());
  absl::StatusOr<MediaTokenGrid> grid = DecodeImageGrid(Bytes(buffer, blocks, 1, kMrope), 1);
  REQUIRE(grid.ok());
  CHECK(*grid == MediaTokenGrid{1, 1, 1});
}

TEST_CASE("encoding refuses what does not fit") {
  EmbeddingBuffer buffer(kLayout);
  const BlockAllocation blocks{.start_block = 0, .num_blocks = 2, .num_tokens = 8};
  const std::vector<float> four_tokens(4 * 3);
  // An empty grid.
  CHECK(absl::IsInvalidArgument(EncodeImage({.grid = {1, 0, 4}}, {}, blocks, buffer)));
  // An embedding of the wrong size.
  CHECK(absl::IsInvalidArgument(
      EncodeImage({.grid = {1, 2, 2}}, std::vector<float>(11), blocks, buffer)));
  // More tokens than the allocation.
  CHECK(absl::IsInvalidArgument(
      EncodeImage({.grid = {1, 3, 3}}, std::vector<float>(27), blocks, buffer)));
  // A buffer of bf16 values.
  EmbeddingLayout bf16 = kLayout;
  bf16.dtype_bytes = 2;
  EmbeddingBuffer half(bf16);
  CHECK(absl::IsInvalidArgument(EncodeImage({.grid = {1, 2, 2}}, four_tokens, blocks, half)));
  CHECK(EncodeImage({.grid = {1, 2, 2}}, four_tokens, blocks, buffer).ok());
}

TEST_CASE("decoding rejects short, long and malformed M-RoPE sections") {
  // A valid 1 x 2 x 2 grid to corrupt.
  const std::vector<int32_t> good = {0, 0, 0, 0, 0, 1, 0, 1, 0, 0, 1, 1};
  REQUIRE(DecodeImageGrid(Mrope(good), 4).ok());
  CHECK(absl::IsDataLoss(DecodeImageGrid(Mrope(good), 0).status()));
  CHECK(absl::IsDataLoss(DecodeImageGrid(Mrope(good), 3).status()));  // long
  CHECK(absl::IsDataLoss(DecodeImageGrid(Mrope(good), 5).status()));  // short
  CHECK(absl::IsDataLoss(DecodeImageGrid(Mrope(good).substr(0, 47), 4).status()));
  CHECK(absl::IsDataLoss(DecodeImageGrid("", 1).status()));
  // Positions out of order.
  std::vector<int32_t> swapped = good;
  std::swap(swapped[4], swapped[7]);
  std::swap(swapped[5], swapped[8]);
  CHECK(absl::IsDataLoss(DecodeImageGrid(Mrope(swapped), 4).status()));
  // A corner that does not multiply out to the token count.
  std::vector<int32_t> corner = good;
  corner[11] = 2;
  CHECK(absl::IsDataLoss(DecodeImageGrid(Mrope(corner), 4).status()));
  // Negative and huge sides.
  std::vector<int32_t> negative = good;
  negative[9] = -1;
  CHECK(absl::IsDataLoss(DecodeImageGrid(Mrope(negative), 4).status()));
  std::vector<int32_t> huge = good;
  huge[9] = INT32_MAX;
  huge[10] = INT32_MAX;
  huge[11] = INT32_MAX;
  CHECK(absl::IsDataLoss(DecodeImageGrid(Mrope(huge), 4).status()));
  // Right shape, wrong interior position.
  std::vector<int32_t> interior = good;
  interior[5] = 7;
  CHECK(absl::IsDataLoss(DecodeImageGrid(Mrope(interior), 4).status()));
  // A frame's time position that is not a multiple of the first step.
  const std::vector<int32_t> uneven = {0, 0, 0, 2, 0, 0, 5, 0, 0};
  CHECK(absl::IsDataLoss(DecodeImageGrid(Mrope(uneven), 3).status()));
  // A negative time step.
  const std::vector<int32_t> backwards = {0, 0, 0, -2, 0, 0};
  CHECK(absl::IsDataLoss(DecodeImageGrid(Mrope(backwards), 2).status()));
}

TEST_CASE("a video's time step round-trips in its M-RoPE section, 0 included") {
  for (int32_t step : {1, 4, 0}) {
    INFO("time step " << step);
    EmbeddingBuffer buffer(kLayout);
    const BlockAllocation blocks{.start_block = 0, .num_blocks = 3, .num_tokens = 12};
    const MediaRowsHeader header{.grid = {.t = 3, .rows = 2, .cols = 2, .time_step = step}};
    REQUIRE(EncodeImage(header, std::vector<float>(12 * 3), blocks, buffer).ok());
    const std::vector<int32_t> m = Ints(Bytes(buffer, blocks, 12, kMrope));
    // Token 9: third frame, row 0, column 1.
    CHECK(std::vector<int32_t>(m.begin() + 27, m.begin() + 30) ==
          std::vector<int32_t>{2 * step, 0, 1});
    absl::StatusOr<MediaTokenGrid> grid = DecodeImageGrid(Bytes(buffer, blocks, 12, kMrope), 12);
    REQUIRE(grid.ok());
    CHECK(*grid == header.grid);
  }
  EmbeddingBuffer buffer(kLayout);
  const BlockAllocation blocks{.start_block = 0, .num_blocks = 1, .num_tokens = 4};
  CHECK(
      absl::IsInvalidArgument(EncodeImage({.grid = {.t = 2, .rows = 1, .cols = 1, .time_step = -1}},
                                          std::vector<float>(2 * 3), blocks, buffer)));
}

}  // namespace
}  // namespace mmserve::transfer
