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

// stb_image decodes a JPEG cut short without complaint, filling in the rest.
// A complete file has an end-of-image marker (FF D9) after its first scan:
// entropy-coded data cannot contain one (an FF there is stuffed as FF 00).
bool JpegHasEndMarker(absl::string_view b) {
  size_t sos = b.find("\xff\xda");
  return sos != absl::string_view::npos && b.find("\xff\xd9", sos + 2) != absl::string_view::npos;
}

// stb_image 2.27 (Debian's libstb) trusts a JPEG's Huffman tables more than
// it should, and hostile files turn that into memory errors in the encoder:
//  - symbol counts summing past 256 write past its tables, with bytes from
//    the file (fixed upstream in 2.28 with the same check);
//  - a scan may use a table no DHT segment defined: stb's tables live in
//    uninitialized heap memory, so it decodes with garbage and indexes its
//    symbol arrays far out of bounds (reads; its assert aborts the process).
// Both are refused before stb sees the file. The walk visits each segment
// the way stb does (fill bytes and stray bytes between segments skipped,
// lengths followed) and, after a scan, resumes at the first marker in the
// entropy-coded data, where stb's decoder stops too. O(size).
absl::Status CheckJpegHuffmanTables(absl::string_view b) {
  auto byte = [&](size_t at) -> uint32_t {
    return at < b.size() ? static_cast<uint8_t>(b[at]) : 0;  // stb reads 0 past the end
  };
  bool defined[2][4] = {};  // [DC, AC][table id]
  bool progressive = false;
  size_t pos = 2;  // after SOI
  while (pos + 1 < b.size()) {
    if (byte(pos) != 0xFF || byte(pos + 1) == 0xFF) {
      ++pos;  // stray or fill byte
      continue;
    }
    const uint32_t marker = byte(pos + 1);
    if (marker == 0xD9) break;  // end of image
    if (marker == 0x00 || marker == 0x01 || marker == 0xD8 || (marker >= 0xD0 && marker <= 0xD7)) {
      pos += 2;  // no length field
      continue;
    }
    const size_t length = byte(pos + 2) << 8 | byte(pos + 3);
    if (marker == 0xC2) progressive = true;
    if (marker == 0xC4) {
      // As stb's DHT loop: tables of (class/id, 16 counts, symbols) while
      // bytes of the declared length remain.
      int left = static_cast<int>(length) - 2;
      size_t at = pos + 4;
      while (left > 0 && at < b.size()) {
        uint32_t symbols = 0;
        for (int i = 0; i < 16; ++i) symbols += byte(at + 1 + i);
        if (symbols > 256) return Bad("corrupt JPEG (a Huffman table with more than 256 symbols)");
        const uint32_t table_class = byte(at) >> 4, id = byte(at) & 15;
        if (table_class <= 1 && id <= 3) defined[table_class][id] = true;
        at += 17 + symbols;
        left -= 17 + static_cast<int>(symbols);
      }
    }
    if (marker == 0xDA) {
      // Which tables the scan decodes with, as stb picks them: baseline
      // scans both of each component's; progressive DC first scans the DC
      // table, AC scans the AC table, DC refinements none.
      const uint32_t components = byte(pos + 4);
      const uint32_t spectral_start = byte(pos + 5 + 2 * components);
      const uint32_t approx_high = byte(pos + 7 + 2 * components) >> 4;
      const bool uses_dc = !progressive || (spectral_start == 0 && approx_high == 0);
      const bool uses_ac = !progressive || spectral_start > 0;
      for (uint32_t c = 0; c < components; ++c) {
        const uint32_t tables = byte(pos + 6 + 2 * c);
        if ((uses_dc && (tables >> 4) <= 3 && !defined[0][tables >> 4]) ||
            (uses_ac && (tables & 15) <= 3 && !defined[1][tables & 15])) {
          return Bad(
              "corrupt JPEG (a scan uses a Huffman table no DHT segment "
              "defined)");
        }
      }
    }
    pos += 2 + length;
    if (marker == 0xDA) {
      // Entropy-coded data: an FF there is followed by 00 (stuffing) or a
      // restart marker; the first other FF xx is the next segment.
      while (pos + 1 < b.size() && !(byte(pos) == 0xFF && byte(pos + 1) != 0x00 &&
                                     !(byte(pos + 1) >= 0xD0 && byte(pos + 1) <= 0xD7))) {
        ++pos;
      }
    }
  }
  return absl::OkStatus();
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
    RETURN_IF_ERROR(CheckJpegHuffmanTables(bytes));
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
