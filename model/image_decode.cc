#include "model/image_decode.h"

#include <stb/stb_image.h>

#include <cstdlib>
#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace mmserve::model {
namespace {

absl::Status Bad(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("image: ", what));
}

bool StartsWith(absl::string_view bytes, absl::string_view magic) {
  return bytes.size() >= magic.size() && bytes.substr(0, magic.size()) == magic;
}

absl::StatusOr<ImageFormat> DetectFormat(absl::string_view b) {
  if (StartsWith(b, "\x89PNG\r\n\x1a\n")) return ImageFormat::kPng;
  if (StartsWith(b, "\xff\xd8\xff")) return ImageFormat::kJpeg;
  if (StartsWith(b, "GIF87a") || StartsWith(b, "GIF89a")) return ImageFormat::kGif;
  if (StartsWith(b, "BM")) return ImageFormat::kBmp;
  if (StartsWith(b, "RIFF") && b.size() >= 12 && b.substr(8, 4) == "WEBP") {
    return Bad("WebP is not supported (JPEG, PNG, BMP, GIF)");
  }
  return Bad("unknown format (JPEG, PNG, BMP and GIF are supported)");
}

// Width and height from a PNG's IHDR chunk (big-endian at bytes 16..23), for
// a clear message when stb refuses a header as too large to decode.
bool PngDimensions(absl::string_view b, uint32_t* w, uint32_t* h) {
  if (b.size() < 24 || b.substr(12, 4) != "IHDR") return false;
  auto be32 = [&](size_t at) {
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v = (v << 8) | static_cast<uint8_t>(b[at + i]);
    return v;
  };
  *w = be32(16);
  *h = be32(20);
  return true;
}

// stb_image decodes a JPEG cut short without complaint, filling in the rest.
// A complete file has an end-of-image marker (FF D9) after its first scan:
// entropy-coded data cannot contain one (an FF there is stuffed as FF 00).
bool JpegHasEndMarker(absl::string_view b) {
  size_t sos = b.find("\xff\xda");
  return sos != absl::string_view::npos && b.find("\xff\xd9", sos + 2) != absl::string_view::npos;
}

}  // namespace

absl::string_view ImageFormatName(ImageFormat format) {
  switch (format) {
    case ImageFormat::kJpeg:
      return "JPEG";
    case ImageFormat::kPng:
      return "PNG";
    case ImageFormat::kBmp:
      return "BMP";
    case ImageFormat::kGif:
      return "GIF";
  }
  return "?";
}

absl::StatusOr<ImageHeader> ReadImageHeader(absl::string_view bytes) {
  if (bytes.empty()) return Bad("empty input");
  if (bytes.size() > INT32_MAX) return Bad("input larger than 2 GiB");
  ImageHeader h;
  ASSIGN_OR_RETURN(h.format, DetectFormat(bytes));
  const auto* data = reinterpret_cast<const stbi_uc*>(bytes.data());
  if (!stbi_info_from_memory(data, static_cast<int>(bytes.size()), &h.width, &h.height,
                             &h.channels)) {
    uint32_t w, hh;
    if (h.format == ImageFormat::kPng && PngDimensions(bytes, &w, &hh) && w > 0 && hh > 0 &&
        static_cast<uint64_t>(w) * hh > (1u << 28)) {
      return Bad(absl::StrCat(w, "x", hh, " exceeds the limit of decodable pixels"));
    }
    return Bad(absl::StrCat("unreadable ", ImageFormatName(h.format), " header (",
                            stbi_failure_reason(), ")"));
  }
  if (h.width <= 0 || h.height <= 0) {
    return Bad(absl::StrCat("zero-sized image ", h.width, "x", h.height));
  }
  return h;
}

absl::StatusOr<RgbImage> DecodeImage(absl::string_view bytes, const DecodeLimits& limits) {
  if (static_cast<int64_t>(bytes.size()) > limits.max_bytes) {
    return Bad(absl::StrCat(bytes.size(), " bytes exceeds the limit of ", limits.max_bytes));
  }
  ASSIGN_OR_RETURN(ImageHeader h, ReadImageHeader(bytes));
  if (static_cast<int64_t>(h.width) * h.height > limits.max_pixels) {
    return Bad(absl::StrCat(h.width, "x", h.height, " exceeds the limit of ", limits.max_pixels,
                            " pixels"));
  }
  if (h.format == ImageFormat::kJpeg && !JpegHasEndMarker(bytes)) {
    return Bad("truncated JPEG (no end-of-image marker)");
  }
  int w = 0, hh = 0, got = 0;
  std::unique_ptr<stbi_uc, void (*)(void*)> px(
      stbi_load_from_memory(reinterpret_cast<const stbi_uc*>(bytes.data()),
                            static_cast<int>(bytes.size()), &w, &hh, &got, 3),
      stbi_image_free);
  if (px == nullptr) {
    return Bad(absl::StrCat("corrupt or truncated ", ImageFormatName(h.format), " (",
                            stbi_failure_reason(), ")"));
  }
  if (w != h.width || hh != h.height) return Bad("decoded size differs from the header");
  RgbImage img;
  img.width = w;
  img.height = hh;
  img.pixels.assign(px.get(), px.get() + static_cast<size_t>(w) * hh * 3);
  return img;
}

}  // namespace mmserve::model
