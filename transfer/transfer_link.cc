#include "transfer/transfer_link.h"

#include <algorithm>

#include "common/crc32c.h"

namespace mmserve::transfer {

const char* DataPathName(DataPath path) {
  switch (path) {
    case DataPath::kPut:
      return "put";
    case DataPath::kTag:
      return "tag";
    case DataPath::kGet:
      return "get";
  }
  return "?";
}

std::optional<DataPath> ParseDataPath(const std::string& name) {
  if (name == "put") return DataPath::kPut;
  if (name == "tag") return DataPath::kTag;
  if (name == "get") return DataPath::kGet;
  return std::nullopt;
}

uint32_t ChunkPieceTokens(size_t embedding_token_bytes, DataPath path) {
  const size_t bytes = path == DataPath::kTag ? kTagPieceBytes : kPutPieceBytes;
  return static_cast<uint32_t>(std::max<size_t>(1, bytes / embedding_token_bytes));
}

uint64_t ChunkTag(const std::string& request_id, uint32_t image_index, uint32_t offset_tokens,
                  int section) {
  const uint32_t id = Crc32c(request_id.data(), request_id.size()) ^ (image_index * 0x9E3779B1u);
  return (uint64_t{id} << 32) | (uint64_t{offset_tokens & 0x3FFFFFFFu} << 2) |
         static_cast<uint64_t>(section);
}

}  // namespace mmserve::transfer
