#include "transfer/embedding_layout.h"

#include <cstdint>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace mmserve::transfer {
namespace {

// The M-RoPE position of token k in `grid`.
void MropePosition(const MediaTokenGrid& grid, int64_t k, int32_t out[3]) {
  const int64_t per_t = int64_t{grid.rows} * grid.cols;
  out[0] = static_cast<int32_t>(k / per_t * grid.time_step);
  out[1] = static_cast<int32_t>((k % per_t) / grid.cols);
  out[2] = static_cast<int32_t>(k % grid.cols);
}

absl::Status CheckFits(const MediaRowsHeader& header, absl::Span<const float> embedding,
                       const BlockAllocation& blocks, const EmbeddingLayout& layout) {
  const MediaTokenGrid& g = header.grid;
  if (g.t <= 0 || g.rows <= 0 || g.cols <= 0 || g.num_tokens() > INT32_MAX || g.time_step < 0 ||
      int64_t{g.t - 1} * g.time_step > INT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat("image grid ", g.t, " x ", g.rows, " x ", g.cols,
                                                   " (time step ", g.time_step,
                                                   ") is empty or too big"));
  }
  const uint32_t n = static_cast<uint32_t>(g.num_tokens());
  if (layout.dtype_bytes != sizeof(float)) {
    return absl::InvalidArgumentError(
        absl::StrCat("the buffer holds ", layout.dtype_bytes, "-byte values, not floats"));
  }
  if (embedding.size() != size_t{n} * layout.hidden_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "embedding of ", embedding.size(), " floats for ", n, " tokens of ", layout.hidden_size));
  }
  if (header.sections == 0 || header.sections > kMaxSections ||
      layout.hidden_size % header.sections != 0 ||
      layout.hidden_size / header.sections > kMaxSectionWidth) {
    return absl::InvalidArgumentError(absl::StrCat(
        header.sections, " sections do not divide rows of ", layout.hidden_size, " values"));
  }
  if (!layout.FitsChunk(blocks, 0, n)) {
    return absl::InvalidArgumentError(
        absl::StrCat(n, " tokens do not fit the allocation of ", blocks.num_tokens));
  }
  return absl::OkStatus();
}

}  // namespace

int32_t SectionHeaderWord(const EmbeddingSections& s) {
  return static_cast<int32_t>((uint32_t{kSectionLayoutVersion} << 28) | (s.count << 20) | s.width);
}

absl::Status EncodeImage(const MediaRowsHeader& header, absl::Span<const float> embedding,
                         const BlockAllocation& blocks, EmbeddingBuffer& buffer) {
  if (absl::Status s = CheckFits(header, embedding, blocks, buffer.layout()); !s.ok()) return s;
  const uint32_t n = static_cast<uint32_t>(header.grid.num_tokens());
  const ChunkRanges r = buffer.layout().ChunkInfo(blocks, 0, n);
  uint8_t* base = buffer.data();
  std::memcpy(base + r[kEmbedding].offset, embedding.data(), r[kEmbedding].size);
  auto* fill_ids = reinterpret_cast<int32_t*>(base + r[kFillId].offset);
  auto* mrope = reinterpret_cast<int32_t*>(base + r[kMrope].offset);
  auto* aux = reinterpret_cast<AuxRecord*>(base + r[kAux].offset);
  const int32_t sections = SectionHeaderWord(
      {.count = header.sections, .width = buffer.layout().hidden_size / header.sections});
  for (uint32_t k = 0; k < n; ++k) {
    fill_ids[k] = header.fill_id;
    MropePosition(header.grid, k, mrope + 3 * size_t{k});
    aux[k] = {static_cast<int32_t>(n), static_cast<int32_t>(header.image_index), sections};
  }
  return absl::OkStatus();
}

absl::StatusOr<MediaTokenGrid> DecodeImageGrid(absl::string_view mrope, uint32_t num_tokens) {
  const auto bad = [&] {
    return absl::DataLossError(
        absl::StrCat("M-RoPE section of ", num_tokens, " tokens does not describe a grid"));
  };
  constexpr size_t kTokenBytes = 3 * sizeof(int32_t);
  if (num_tokens == 0 || num_tokens > INT32_MAX ||
      mrope.size() != size_t{num_tokens} * kTokenBytes) {
    return bad();
  }
  // The last token holds the grid's far row and column; each is at most n
  // (so the products below stay far from overflow). The frames are what is
  // left, and the time step is the second frame's time position.
  int32_t last[3];
  std::memcpy(last, mrope.data() + (size_t{num_tokens} - 1) * kTokenBytes, kTokenBytes);
  if (last[1] < 0 || last[2] < 0 || int64_t{last[1]} >= int64_t{num_tokens} ||
      int64_t{last[2]} >= int64_t{num_tokens}) {
    return bad();
  }
  MediaTokenGrid grid{.t = 0, .rows = last[1] + 1, .cols = last[2] + 1};
  const int64_t per_t = int64_t{grid.rows} * grid.cols;
  if (per_t > int64_t{num_tokens} || num_tokens % per_t != 0) return bad();
  grid.t = static_cast<int32_t>(num_tokens / per_t);
  if (grid.t > 1) {
    std::memcpy(&grid.time_step, mrope.data() + size_t(per_t) * kTokenBytes, sizeof(int32_t));
    if (grid.time_step < 0 || int64_t{grid.t - 1} * grid.time_step > INT32_MAX) return bad();
  }
  for (uint32_t k = 0; k < num_tokens; ++k) {
    int32_t got[3];
    int32_t want[3];
    std::memcpy(got, mrope.data() + size_t{k} * kTokenBytes, kTokenBytes);
    MropePosition(grid, k, want);
    if (std::memcmp(got, want, kTokenBytes) != 0) return bad();
  }
  return grid;
}

absl::StatusOr<EmbeddingSections> DecodeImageSections(absl::string_view aux, uint32_t num_tokens,
                                                      uint32_t row_width) {
  if (num_tokens == 0 || aux.size() / sizeof(AuxRecord) != num_tokens ||
      aux.size() % sizeof(AuxRecord) != 0) {
    return absl::DataLossError(
        absl::StrCat("aux section of ", aux.size(), " bytes for ", num_tokens, " tokens"));
  }
  AuxRecord first;
  std::memcpy(&first, aux.data(), sizeof(first));
  for (uint32_t k = 1; k < num_tokens; ++k) {
    AuxRecord a;
    std::memcpy(&a, aux.data() + size_t{k} * sizeof(a), sizeof(a));
    if (a.flags != first.flags) {
      return absl::DataLossError(absl::StrCat("token ", k, " has another section header"));
    }
  }
  if (first.flags == 0) return EmbeddingSections{.version = 1, .count = 1, .width = row_width};
  const uint32_t word = static_cast<uint32_t>(first.flags);
  const EmbeddingSections s{.version = static_cast<int>(word >> 28),
                            .count = (word >> 20) & 0xff,
                            .width = word & kMaxSectionWidth};
  if (s.version != kSectionLayoutVersion) {
    return absl::DataLossError(absl::StrCat("unknown section layout version ", s.version));
  }
  if (s.count == 0 || uint64_t{s.count} * s.width != row_width) {
    return absl::DataLossError(
        absl::StrCat(s.count, " sections of ", s.width, " values do not fill rows of ", row_width));
  }
  return s;
}

absl::Status ExpectImageSections(absl::string_view aux, uint32_t num_tokens, uint32_t row_width,
                                 uint32_t count) {
  absl::StatusOr<EmbeddingSections> s = DecodeImageSections(aux, num_tokens, row_width);
  if (!s.ok()) return s.status();
  if (s->count != count) {
    return absl::DataLossError(
        absl::StrCat("embedding of ", s->count, " sections; the model takes ", count));
  }
  return absl::OkStatus();
}

}  // namespace mmserve::transfer
