// JPEG through libjpeg-turbo with Pillow's settings, so that decoded pixels
// equal Pillow's (and so transformers') byte for byte: the accurate integer
// IDCT (JDCT_ISLOW), fancy chroma upsampling, YCbCr -> RGB in the library,
// grayscale replicated to RGB, and CMYK/YCCK read as Pillow's "CMYK;I"
// (Adobe's inverted samples) and converted with Pillow's cmyk2rgb.
// Internal to image_decode; use DecodeImage / ReadImageHeader.
//
// Thread-safe (each call owns its decompressor).
#ifndef MMSERVE_MODEL_JPEG_DECODE_H_
#define MMSERVE_MODEL_JPEG_DECODE_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace mmserve::model::internal {

struct JpegInfo {
  int width = 0;
  int height = 0;
  int components = 0;  // 1 gray, 3 YCbCr/RGB, 4 CMYK/YCCK
};

// Reads the frame header (SOF) without decoding any scan.
[[nodiscard]] absl::StatusOr<JpegInfo> ReadJpegInfo(absl::string_view bytes);

// Decodes to interleaved 8-bit RGB (`width * height * 3` bytes in `rgb`).
// InvalidArgument for corrupt or truncated data.
[[nodiscard]] absl::Status DecodeJpeg(absl::string_view bytes, JpegInfo* info,
                                      std::vector<uint8_t>* rgb);

}  // namespace mmserve::model::internal

#endif  // MMSERVE_MODEL_JPEG_DECODE_H_
