// Hostile image bytes through the router's header read and the encoder's
// decode. Properties: a decode never succeeds where the header read fails;
// when both succeed they agree on the size, the pixel buffer has exactly
// width * height * 3 bytes, and the image token count the router computes
// from the header (SmartResize) equals the one the encoder gets from the
// decoded image.
#include <cstddef>
#include <cstdint>

#include "absl/strings/string_view.h"
#include "fuzz/fuzz_check.h"
#include "model/image_decode.h"
#include "model/image_tokens.h"

namespace mmserve::model {
namespace {

int64_t Tokens(int64_t width, int64_t height) {
  absl::StatusOr<MediaGrid> grid = SmartResize(width, height, ImageGridParams());
  return grid.ok() ? grid->num_tokens() : -1;
}

}  // namespace
}  // namespace mmserve::model

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace mmserve::model;
  const absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  const absl::StatusOr<ImageHeader> header = ReadImageHeader(bytes);
  if (header.ok()) {
    FUZZ_CHECK(header->width > 0 && header->height > 0) << header->width << "x" << header->height;
    FUZZ_CHECK(header->channels >= 1 && header->channels <= 4) << header->channels;
  }
  // A small pixel limit keeps each run fast; the limit check itself is part
  // of what is exercised.
  DecodeLimits limits;
  limits.max_pixels = 1 << 20;
  const absl::StatusOr<RgbImage> image = DecodeImage(bytes, limits);
  if (!image.ok()) {
    FUZZ_CHECK(absl::IsInvalidArgument(image.status())) << image.status();
    return 0;
  }
  FUZZ_CHECK(header.ok()) << "decoded an image whose header read failed: " << header.status();
  FUZZ_CHECK(image->width == header->width && image->height == header->height)
      << "header " << header->width << "x" << header->height << ", decoded " << image->width << "x"
      << image->height;
  FUZZ_CHECK(image->pixels.size() == static_cast<size_t>(image->width) * image->height * 3)
      << image->pixels.size();
  FUZZ_CHECK(int64_t{image->width} * image->height <= limits.max_pixels);
  FUZZ_CHECK(Tokens(header->width, header->height) == Tokens(image->width, image->height));
  return 0;
}
