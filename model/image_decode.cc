#include "model/image_decode.h"

#include <stb/stb_image.h>

#include <cstdlib>
#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "model/jpeg_decode.h"

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

// Whether every PNG chunk's declared length fits the bytes that follow it.
// stb_image grows its IDAT buffer to the declared length before reading the
// data, so a 113-byte file declaring a huge IDAT made it allocate 2 GiB
// (found by //fuzz:image_decode_fuzzer). A complete file never declares more
// than it holds.
bool PngChunksFit(absl::string_view b) {
  auto be32 = [&](size_t at) {
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v = (v << 8) | static_cast<uint8_t>(b[at + i]);
    return v;
  };
  size_t pos = 8;  // after the signature
  while (pos + 8 <= b.size()) {
    const uint64_t length = be32(pos);
    // The data past the end (stb tolerates a missing CRC).
    if (length + 8 > b.size() - pos) return false;
    if (b.substr(pos + 4, 4) == "IEND") return true;
    pos += 12 + length;
  }
  return true;  // cut short between chunks: stb reports it
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

// A 16-bit grayscale PNG without alpha (IHDR bit depth 16, colour type 0),
// which Pillow opens as "I;16" and clips on convert("RGB").
bool IsGray16Png(absl::string_view b) {
  return b.size() >= 26 && b.substr(12, 4) == "IHDR" && static_cast<uint8_t>(b[24]) == 16 &&
         static_cast<uint8_t>(b[25]) == 0;
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
  if (h.format == ImageFormat::kJpeg) {
    ASSIGN_OR_RETURN(internal::JpegInfo info, internal::ReadJpegInfo(bytes));
    h.width = info.width;
    h.height = info.height;
    h.channels = info.components;
    if (h.width <= 0 || h.height <= 0) {
      return Bad(absl::StrCat("zero-sized image ", h.width, "x", h.height));
    }
    return h;
  }
  if (h.format == ImageFormat::kPng && !PngChunksFit(bytes)) {
    return Bad("corrupt or truncated PNG (a chunk runs past the end)");
  }
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
  return DecodeImage(bytes, limits, DecodeOptions());
}

absl::StatusOr<RgbImage> DecodeImage(absl::string_view bytes, const DecodeLimits& limits,
                                     const DecodeOptions& options) {
  if (static_cast<int64_t>(bytes.size()) > limits.max_bytes) {
    return Bad(absl::StrCat(bytes.size(), " bytes exceeds the limit of ", limits.max_bytes));
  }
  ASSIGN_OR_RETURN(ImageHeader h, ReadImageHeader(bytes));
  if (static_cast<int64_t>(h.width) * h.height > limits.max_pixels) {
    return Bad(absl::StrCat(h.width, "x", h.height, " exceeds the limit of ", limits.max_pixels,
                            " pixels"));
  }
  RgbImage img;
  if (h.format == ImageFormat::kJpeg) {
    if (!JpegHasEndMarker(bytes)) return Bad("truncated JPEG (no end-of-image marker)");
    internal::JpegInfo info;
    RETURN_IF_ERROR(internal::DecodeJpeg(bytes, &info, &img.pixels));
    if (info.width != h.width || info.height != h.height) {
      return Bad("decoded size differs from the header");
    }
    img.width = info.width;
    img.height = info.height;
    return img;
  }
  const auto* data = reinterpret_cast<const stbi_uc*>(bytes.data());
  const int size = static_cast<int>(bytes.size());
  int w = 0, hh = 0, got = 0;
  if (h.format == ImageFormat::kPng && IsGray16Png(bytes)) {
    // Pillow: "I;16" -> RGB clips each sample to 255 (I16_RGB); kHighByte
    // keeps the picture as stb's 16 -> 8 conversion does (sample >> 8).
    std::unique_ptr<stbi_us, void (*)(void*)> px(
        stbi_load_16_from_memory(data, size, &w, &hh, &got, 1), stbi_image_free);
    if (px == nullptr) {
      return Bad(absl::StrCat("corrupt or truncated PNG (", stbi_failure_reason(), ")"));
    }
    if (w != h.width || hh != h.height) return Bad("decoded size differs from the header");
    img.width = w;
    img.height = hh;
    img.pixels.resize(static_cast<size_t>(w) * hh * 3);
    const size_t n = static_cast<size_t>(w) * hh;
    const bool clip = options.gray16 == DecodeOptions::Gray16::kClipLikePillow;
    for (size_t i = 0; i < n; ++i) {
      const int v = px.get()[i];
      const uint8_t g =
          clip ? static_cast<uint8_t>(v > 255 ? 255 : v) : static_cast<uint8_t>(v >> 8);
      img.pixels[i * 3] = img.pixels[i * 3 + 1] = img.pixels[i * 3 + 2] = g;
    }
    return img;
  }
  std::unique_ptr<stbi_uc, void (*)(void*)> px(stbi_load_from_memory(data, size, &w, &hh, &got, 3),
                                               stbi_image_free);
  if (px == nullptr) {
    return Bad(absl::StrCat("corrupt or truncated ", ImageFormatName(h.format), " (",
                            stbi_failure_reason(), ")"));
  }
  if (w != h.width || hh != h.height) return Bad("decoded size differs from the header");
  img.width = w;
  img.height = hh;
  img.pixels.assign(px.get(), px.get() + static_cast<size_t>(w) * hh * 3);
  return img;
}

}  // namespace mmserve::model
