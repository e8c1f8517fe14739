// Image decoding to 8-bit RGB exactly as Pillow (and so transformers) does
// it: JPEG (baseline, progressive, gray, CMYK/YCCK) through libjpeg-turbo with
// Pillow's settings (jpeg_decode.h); PNG (alpha, 16-bit, palette), BMP and
// GIF (first frame) through stb_image.
//
//   ASSIGN_OR_RETURN(ImageHeader h, ReadImageHeader(bytes));  // cheap: no decode
//   ASSIGN_OR_RETURN(RgbImage img, DecodeImage(bytes, DecodeLimits()));
//
// The header is read before decoding and an image above max_pixels is
// refused without decoding it (decompression bombs). Alpha is dropped, as
// transformers' convert_to_rgb (PIL convert("RGB")) does. Every failure
// is InvalidArgument with a reason (empty, unknown format, corrupt or
// truncated data, zero or oversized dimensions). Thread-safe.
#ifndef MMSERVE_MODEL_IMAGE_DECODE_H_
#define MMSERVE_MODEL_IMAGE_DECODE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace mmserve::model {

enum class ImageFormat { kJpeg, kPng, kBmp, kGif };

struct ImageHeader {
  ImageFormat format;
  int width = 0;
  int height = 0;
  int channels = 0;  // in the file: 1 gray, 2 gray+alpha, 3 RGB, 4 RGBA (CMYK for JPEG)
};

struct DecodeLimits {
  // Refuse images with more pixels than this (before decoding). The default
  // is PIL's decompression-bomb threshold, which HF pipelines inherit.
  int64_t max_pixels = 89478485;
  // Refuse encoded inputs larger than this.
  int64_t max_bytes = 32ll << 20;
};

// Choices where the reference pipeline loses information.
struct DecodeOptions {
  // 16-bit grayscale PNG (no alpha): Pillow opens it as "I;16", and
  // convert("RGB") clips every sample to 255, so a real 16-bit picture comes
  // out (nearly) all white. kClipLikePillow (the default) does the same, so
  // that pixels and model outputs match transformers; kHighByte keeps the
  // picture (sample >> 8). Other 16-bit PNGs (gray+alpha, RGB, RGBA) keep the
  // high byte in both, as Pillow does.
  enum class Gray16 { kClipLikePillow, kHighByte };
  Gray16 gray16 = Gray16::kClipLikePillow;
};

// Interleaved 8-bit RGB, row-major, `width * height * 3` bytes.
struct RgbImage {
  int width = 0;
  int height = 0;
  std::vector<uint8_t> pixels;
};

absl::string_view ImageFormatName(ImageFormat format);

// Identifies the format from magic bytes and reads the dimensions.
[[nodiscard]] absl::StatusOr<ImageHeader> ReadImageHeader(absl::string_view bytes);

[[nodiscard]] absl::StatusOr<RgbImage> DecodeImage(absl::string_view bytes,
                                                   const DecodeLimits& limits);
[[nodiscard]] absl::StatusOr<RgbImage> DecodeImage(absl::string_view bytes,
                                                   const DecodeLimits& limits,
                                                   const DecodeOptions& options);

}  // namespace mmserve::model

#endif  // MMSERVE_MODEL_IMAGE_DECODE_H_
