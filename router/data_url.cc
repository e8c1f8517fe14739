#include "router/data_url.h"

#include <array>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace mmserve::router {
namespace {

constexpr int8_t kInvalid = -1;

// Value of each base64 character; kInvalid for everything else ('=' too).
constexpr std::array<int8_t, 256> MakeDecodeTable() {
  std::array<int8_t, 256> table{};
  for (int i = 0; i < 256; ++i) table[i] = kInvalid;
  for (int i = 0; i < 26; ++i) {
    table['A' + i] = static_cast<int8_t>(i);
    table['a' + i] = static_cast<int8_t>(26 + i);
  }
  for (int i = 0; i < 10; ++i) table['0' + i] = static_cast<int8_t>(52 + i);
  table['+'] = 62;
  table['/'] = 63;
  return table;
}

constexpr std::array<int8_t, 256> kDecode = MakeDecodeTable();

}  // namespace

absl::StatusOr<std::string> DecodeBase64(absl::string_view text) {
  if (text.size() % 4 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("base64 length ", text.size(), " is not a multiple of 4"));
  }
  size_t padding = 0;
  if (!text.empty() && text.back() == '=') padding = text[text.size() - 2] == '=' ? 2 : 1;
  std::string out;
  out.reserve(text.size() / 4 * 3);
  for (size_t i = 0; i < text.size(); i += 4) {
    bool last = i + 4 == text.size();
    size_t pad_here = last ? padding : 0;
    uint32_t group = 0;
    for (size_t j = 0; j < 4; ++j) {
      unsigned char c = static_cast<unsigned char>(text[i + j]);
      int8_t v = 0;
      if (j >= 4 - pad_here) {
        // Inside the trailing padding; '=' checked by the padding count.
      } else if ((v = kDecode[c]) == kInvalid) {
        return absl::InvalidArgumentError(
            c == '=' ? absl::StrCat("misplaced base64 padding at offset ", i + j)
                     : absl::StrCat("invalid base64 character at offset ", i + j));
      }
      group = (group << 6) | static_cast<uint32_t>(v);
    }
    out.push_back(static_cast<char>(group >> 16));
    if (pad_here < 2) out.push_back(static_cast<char>((group >> 8) & 0xff));
    if (pad_here < 1) out.push_back(static_cast<char>(group & 0xff));
    // Bits that padding drops must be zero, or two texts would decode alike.
    if ((pad_here == 1 && (group & 0xff) != 0) || (pad_here == 2 && (group & 0xffff) != 0)) {
      return absl::InvalidArgumentError("base64 has non-zero bits after its last byte");
    }
  }
  return out;
}

absl::StatusOr<DataUrl> ParseDataUrl(absl::string_view url, size_t max_bytes) {
  constexpr absl::string_view kScheme = "data:";
  if (url.size() < kScheme.size() || !absl::EqualsIgnoreCase(url.substr(0, 5), kScheme)) {
    return absl::InvalidArgumentError("not a data: URL");
  }
  absl::string_view rest = url.substr(kScheme.size());
  size_t comma = rest.find(',');
  if (comma == absl::string_view::npos) {
    return absl::InvalidArgumentError("data: URL has no ',' before its payload");
  }
  absl::string_view header = rest.substr(0, comma);
  absl::string_view payload = rest.substr(comma + 1);
  constexpr absl::string_view kBase64 = ";base64";
  if (header.size() < kBase64.size() ||
      !absl::EqualsIgnoreCase(header.substr(header.size() - kBase64.size()), kBase64)) {
    return absl::InvalidArgumentError("data: URL must be base64 (data:image/...;base64,...)");
  }
  header.remove_suffix(kBase64.size());
  DataUrl result;
  result.mime_type = absl::AsciiStrToLower(header.substr(0, header.find(';')));
  if (payload.size() / 4 * 3 > max_bytes + 2) {
    return absl::InvalidArgumentError(absl::StrCat("image of about ", payload.size() / 4 * 3,
                                                   " bytes exceeds the limit of ", max_bytes));
  }
  absl::StatusOr<std::string> data = DecodeBase64(payload);
  if (!data.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("data: URL payload: ", data.status().message()));
  }
  if (data->size() > max_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("image of ", data->size(), " bytes exceeds the limit of ", max_bytes));
  }
  result.data = *std::move(data);
  return result;
}

}  // namespace mmserve::router
