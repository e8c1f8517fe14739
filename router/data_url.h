// Strict base64 and data: URLs, for images sent inline over HTTP.
//
//   ASSIGN_OR_RETURN(DataUrl image, ParseDataUrl("data:image/png;base64,iVBORw0KGgo...",
//                                                /*max_bytes=*/20 << 20));
//   image.mime_type;  // "image/png"
//   image.data;       // the decoded PNG bytes
//
// Pure functions, thread-safe.
#ifndef MMSERVE_ROUTER_DATA_URL_H_
#define MMSERVE_ROUTER_DATA_URL_H_

#include <cstddef>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace mmserve::router {

// Decodes standard base64 (RFC 4648 section 4: A-Z a-z 0-9 + /, '=' padding
// required). Strict: whitespace, other characters, missing or misplaced
// padding, and set bits after the last byte are INVALID_ARGUMENT.
[[nodiscard]] absl::StatusOr<std::string> DecodeBase64(absl::string_view text);

struct DataUrl {
  std::string mime_type;  // lowercase, e.g. "image/png"; parameters dropped
  std::string data;       // decoded bytes
};

// Parses "data:<mime type>[;param=value...];base64,<base64>". Only base64
// payloads are accepted. A payload whose decoded size would exceed max_bytes
// is INVALID_ARGUMENT before it is decoded; every other malformation is
// INVALID_ARGUMENT too, with the reason.
[[nodiscard]] absl::StatusOr<DataUrl> ParseDataUrl(absl::string_view url, size_t max_bytes);

}  // namespace mmserve::router

#endif  // MMSERVE_ROUTER_DATA_URL_H_
