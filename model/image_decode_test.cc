#include "model/image_decode.h"

#include <catch2/catch.hpp>
#include <cstdlib>
#include <string>

#include "common/file.h"

namespace mmserve::model {
namespace {

std::string Read(const std::string& name) {
  auto bytes = ReadFileToString("model/testdata/images/" + name);
  REQUIRE(bytes.ok());
  return *bytes;
}

int MaxAbsDiff(const RgbImage& img, const std::string& want) {
  REQUIRE(img.pixels.size() == want.size());
  int worst = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    worst = std::max(worst, std::abs(int(img.pixels[i]) - int(uint8_t(want[i]))));
  }
  return worst;
}

TEST_CASE("lossless formats decode to exactly the reference pixels", "[image]") {
  // Reference: PIL + transformers convert_to_rgb (tools/gen_image_goldens.py).
  for (const char* name :
       {"rgb.png", "rgb.bmp", "palette.png", "gray.png", "anim.gif", "rgba.png"}) {
    INFO(name);
    auto img = DecodeImage(Read(name), DecodeLimits());
    REQUIRE(img.ok());
    CHECK(MaxAbsDiff(*img, Read(std::string(name) + ".rgb")) == 0);
  }
}

TEST_CASE("GIF decodes its first frame only", "[image]") {
  auto img = DecodeImage(Read("anim.gif"), DecodeLimits());
  REQUIRE(img.ok());
  CHECK(img->width == 32);
  CHECK(img->height == 24);
  // The second frame is solid yellow; the first has the scene's dark blue.
  CHECK(img->pixels[0] == 30);
  CHECK(img->pixels[2] == 90);
}

TEST_CASE("baseline and progressive JPEG decode to exactly Pillow's pixels", "[image]") {
  // libjpeg-turbo with Pillow's settings (jpeg_decode.h); the JPEG set in
  // image_golden_test covers subsampling, gray, CMYK and restart markers.
  for (const char* name : {"baseline.jpg", "progressive.jpg"}) {
    INFO(name);
    auto img = DecodeImage(Read(name), DecodeLimits());
    REQUIRE(img.ok());
    CHECK(img->width == 64);
    CHECK(img->height == 48);
    CHECK(MaxAbsDiff(*img, Read(std::string(name) + ".rgb")) == 0);
  }
}

TEST_CASE("16-bit gray PNG clips to 255 as Pillow does, or keeps the high byte", "[image]") {
  auto pillow = DecodeImage(Read("gray16.png"), DecodeLimits());
  REQUIRE(pillow.ok());
  REQUIRE(pillow->width == 16);
  for (int i = 0; i < 128; ++i) {
    const int v = (i * 4099) % 65536;
    REQUIRE(int(pillow->pixels[i * 3]) == std::min(v, 255));
    REQUIRE(int(pillow->pixels[i * 3 + 1]) == std::min(v, 255));
  }
  DecodeOptions keep;
  keep.gray16 = DecodeOptions::Gray16::kHighByte;
  auto img = DecodeImage(Read("gray16.png"), DecodeLimits(), keep);
  REQUIRE(img.ok());
  REQUIRE(img->width == 16);
  for (int i = 0; i < 128; ++i) {
    const int want = ((i * 4099) % 65536) >> 8;
    REQUIRE(int(img->pixels[i * 3]) == want);
    REQUIRE(int(img->pixels[i * 3 + 2]) == want);
  }
}

TEST_CASE("the header is read without decoding", "[image]") {
  auto h = ReadImageHeader(Read("rgba.png"));
  REQUIRE(h.ok());
  CHECK(h->format == ImageFormat::kPng);
  CHECK(h->width == 40);
  CHECK(h->height == 30);
  CHECK(h->channels == 4);
  auto j = ReadImageHeader(Read("progressive.jpg"));
  REQUIRE(j.ok());
  CHECK(j->format == ImageFormat::kJpeg);
}

// A PNG signature plus an IHDR chunk claiming the given size, and no data.
std::string PngHeaderOnly(uint32_t w, uint32_t h) {
  std::string s("\x89PNG\r\n\x1a\n", 8);
  auto be32 = [&](uint32_t v) {
    for (int sh = 24; sh >= 0; sh -= 8) s.push_back(static_cast<char>((v >> sh) & 0xff));
  };
  be32(13);
  s += "IHDR";
  be32(w);
  be32(h);
  s += std::string("\x08\x02\x00\x00\x00", 5);
  be32(0);  // CRC (stb does not check it)
  return s;
}

TEST_CASE("broken, empty, unknown, zero-sized and oversized images are rejected", "[image]") {
  struct Case {
    const char* what;
    std::string bytes;
    const char* expect;
  };
  const std::string png = Read("rgb.png"), jpg = Read("baseline.jpg"),
                    prog = Read("progressive.jpg"), gif = Read("anim.gif"), bmp = Read("rgb.bmp");
  std::string flipped = png;
  for (size_t i = 60; i < flipped.size() - 20; ++i) flipped[i] ^= 0x5a;  // scramble IDAT
  const Case cases[] = {
      {"empty", "", "empty input"},
      {"random bytes", "this is not an image at all", "unknown format"},
      {"webp", std::string("RIFF\x10\0\0\0WEBPVP8 ", 16), "WebP is not supported"},
      {"truncated PNG", png.substr(0, png.size() / 2), "corrupt or truncated PNG"},
      {"scrambled PNG", flipped, "corrupt or truncated PNG"},
      {"truncated JPEG", jpg.substr(0, jpg.size() * 2 / 3), "truncated JPEG"},
      {"truncated progressive JPEG", prog.substr(0, prog.size() - 10), "truncated JPEG"},
      {"JPEG header only", jpg.substr(0, 20), "JPEG"},
      {"truncated GIF", gif.substr(0, 30), "GIF"},
      {"truncated BMP", bmp.substr(0, 40), "BMP"},
      {"zero width", PngHeaderOnly(0, 10), "PNG"},
      {"bomb", PngHeaderOnly(10000, 10000), "exceeds the limit"},
      {"bomb past stb's own limit", PngHeaderOnly(60000, 60000), "exceeds the limit"},
  };
  for (const Case& c : cases) {
    INFO(c.what);
    auto img = DecodeImage(c.bytes, DecodeLimits());
    REQUIRE_FALSE(img.ok());
    CHECK(img.status().code() == absl::StatusCode::kInvalidArgument);
    INFO(img.status().message());
    CHECK(img.status().message().find(c.expect) != absl::string_view::npos);
  }
  DecodeLimits small;
  small.max_bytes = 100;
  CHECK(DecodeImage(png, small).status().message().find("exceeds the limit") !=
        absl::string_view::npos);
}

// Sets the 16 symbol counts of the DHT segment at `marker` (FF C4) to 0xFF.
std::string OverfullHuffmanTable(std::string jpg, size_t marker) {
  REQUIRE(jpg.compare(marker, 2, "\xff\xc4") == 0);
  for (int i = 0; i < 16; ++i) jpg[marker + 5 + i] = '\xff';
  return jpg;
}

TEST_CASE(
    "a PNG chunk declaring more bytes than the file holds is refused "
    "before stb",
    "[image]") {
  // stb grew its buffer to the declared length first: 2 GiB for a 113-byte
  // file (//fuzz:image_decode_fuzzer, reproducer in fuzz/corpus).
  std::string png = Read("rgb.png");
  const size_t idat = png.find("IDAT") - 4;
  for (int i = 0; i < 4; ++i) png[idat + i] = '\x7f';
  auto header = ReadImageHeader(png);
  REQUIRE_FALSE(header.ok());
  CHECK(header.status().message().find("a chunk runs past the end") != absl::string_view::npos);
  CHECK_FALSE(DecodeImage(png, DecodeLimits()).ok());
  CHECK(ReadImageHeader(Read("rgb.png")).ok());
}

TEST_CASE("hostile JPEG Huffman tables are refused by the decoder", "[image]") {
  // Tables with more than 256 symbols and scans using a table no DHT defined
  // (stb_image 2.27 wrote past its tables or read uninitialized ones; both
  // found by //fuzz:image_decode_fuzzer, reproducers in fuzz/corpus). JPEG
  // now decodes through libjpeg-turbo, which refuses both; the header read
  // may still succeed when the bad table comes after the frame header.
  const std::string jpg = Read("baseline.jpg"), prog = Read("progressive.jpg");
  const size_t header_dht = jpg.find("\xff\xc4");
  const size_t first_scan = prog.find("\xff\xda");
  const size_t between_scans = prog.find("\xff\xc4", first_scan);  // before the second scan
  REQUIRE(header_dht != std::string::npos);
  REQUIRE(between_scans != std::string::npos);
  std::string undefined = jpg;
  const size_t sos = undefined.find("\xff\xda");
  REQUIRE(sos != std::string::npos);
  const int components = static_cast<uint8_t>(undefined[sos + 4]);
  for (int c = 0; c < components; ++c) undefined[sos + 6 + 2 * c] = '\x33';
  for (const std::string& bad : {OverfullHuffmanTable(jpg, header_dht),
                                 OverfullHuffmanTable(prog, between_scans), undefined}) {
    auto img = DecodeImage(bad, DecodeLimits());
    REQUIRE_FALSE(img.ok());
    CHECK(img.status().code() == absl::StatusCode::kInvalidArgument);
  }
}

}  // namespace
}  // namespace mmserve::model
