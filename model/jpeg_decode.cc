#include "model/jpeg_decode.h"

// jpeglib.h needs FILE and size_t declared first.
#include <csetjmp>
#include <cstdio>
#include <cstring>
// clang-format off
#include <jpeglib.h>
#include <jerror.h>
// clang-format on

#include "absl/strings/str_cat.h"

namespace mmserve::model::internal {
namespace {

// libjpeg reports fatal errors through error_exit, which must not return:
// it longjmps back to the call that set `jump`. Warnings about data that ran
// out (libjpeg then pads with an end-of-image marker and keeps going) are
// recorded so that a truncated file is refused as Pillow refuses it.
struct ErrorManager {
  jpeg_error_mgr pub;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
  bool truncated;
};

void ErrorExit(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<ErrorManager*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, err->message);
  std::longjmp(err->jump, 1);
}

void EmitMessage(j_common_ptr cinfo, int level) {
  auto* err = reinterpret_cast<ErrorManager*>(cinfo->err);
  if (level < 0 && cinfo->err->msg_code == JWRN_JPEG_EOF) err->truncated = true;
}

// RAII for the decompressor; jpeg_destroy_decompress is safe at any stage.
class Decompressor {
 public:
  Decompressor() {
    std::memset(&cinfo_, 0, sizeof(cinfo_));
    std::memset(&err_, 0, sizeof(err_));
    cinfo_.err = jpeg_std_error(&err_.pub);
    err_.pub.error_exit = ErrorExit;
    err_.pub.emit_message = EmitMessage;
  }
  ~Decompressor() { jpeg_destroy_decompress(&cinfo_); }
  Decompressor(const Decompressor&) = delete;
  Decompressor& operator=(const Decompressor&) = delete;

  jpeg_decompress_struct* cinfo() { return &cinfo_; }
  ErrorManager& err() { return err_; }

 private:
  jpeg_decompress_struct cinfo_;
  ErrorManager err_;
};

absl::Status Corrupt(const ErrorManager& err) {
  return absl::InvalidArgumentError(
      absl::StrCat("image: corrupt or truncated JPEG (", err.message, ")"));
}

// Pillow's MULDIV255: a * b / 255, rounded, in integers.
inline int MulDiv255(int a, int b) {
  const int t = a * b + 128;
  return ((t >> 8) + t) >> 8;
}

// Pillow reads 4-component JPEGs as "CMYK;I": libjpeg's samples inverted
// (Adobe stores 255 - ink), c = 255 - sample. Its cmyk2rgb then gives
// channel = (255 - k) - c * (255 - k) / 255 (MULDIV255), and 255 - k is the
// K sample as stored.
void CmykRowToRgb(const uint8_t* cmyk, int width, uint8_t* rgb) {
  for (int x = 0; x < width; ++x, cmyk += 4, rgb += 3) {
    const int nk = cmyk[3];
    for (int c = 0; c < 3; ++c) rgb[c] = static_cast<uint8_t>(nk - MulDiv255(255 - cmyk[c], nk));
  }
}

}  // namespace

absl::StatusOr<JpegInfo> ReadJpegInfo(absl::string_view bytes) {
  Decompressor d;
  jpeg_decompress_struct* cinfo = d.cinfo();
  if (setjmp(d.err().jump)) return Corrupt(d.err());
  jpeg_create_decompress(cinfo);
  jpeg_mem_src(cinfo, reinterpret_cast<const unsigned char*>(bytes.data()),
               static_cast<unsigned long>(bytes.size()));
  jpeg_read_header(cinfo, TRUE);
  JpegInfo info;
  info.width = static_cast<int>(cinfo->image_width);
  info.height = static_cast<int>(cinfo->image_height);
  info.components = cinfo->num_components;
  return info;
}

absl::Status DecodeJpeg(absl::string_view bytes, JpegInfo* info, std::vector<uint8_t>* rgb) {
  Decompressor d;
  jpeg_decompress_struct* cinfo = d.cinfo();
  std::vector<uint8_t> row;  // constructed before setjmp: longjmp skips no destructor
  if (setjmp(d.err().jump)) return Corrupt(d.err());
  jpeg_create_decompress(cinfo);
  jpeg_mem_src(cinfo, reinterpret_cast<const unsigned char*>(bytes.data()),
               static_cast<unsigned long>(bytes.size()));
  jpeg_read_header(cinfo, TRUE);
  const bool cmyk = cinfo->num_components == 4;
  if (cinfo->num_components != 1 && cinfo->num_components != 3 && !cmyk) {
    return absl::InvalidArgumentError(absl::StrCat("image: JPEG with ", cinfo->num_components,
                                                   " components is not supported (1, 3 or 4)"));
  }
  // Pillow's decoder settings (JpegDecode.c): libjpeg's defaults, which are
  // the islow IDCT and fancy upsampling, with the output colour space its
  // raw mode asks for.
  cinfo->dct_method = JDCT_ISLOW;
  cinfo->do_fancy_upsampling = TRUE;
  cinfo->out_color_space = cmyk ? JCS_CMYK : JCS_RGB;
  jpeg_start_decompress(cinfo);
  const int w = static_cast<int>(cinfo->output_width), h = static_cast<int>(cinfo->output_height);
  info->width = w;
  info->height = h;
  info->components = cinfo->num_components;
  rgb->resize(static_cast<size_t>(w) * h * 3);
  if (cmyk) row.resize(static_cast<size_t>(w) * 4);
  while (cinfo->output_scanline < cinfo->output_height) {
    const size_t y = cinfo->output_scanline;
    JSAMPROW out = cmyk ? row.data() : rgb->data() + y * w * 3;
    if (jpeg_read_scanlines(cinfo, &out, 1) != 1) break;
    if (cmyk) CmykRowToRgb(row.data(), w, rgb->data() + y * w * 3);
    if (d.err().truncated) break;
  }
  if (!d.err().truncated) jpeg_finish_decompress(cinfo);
  if (d.err().truncated) {
    return absl::InvalidArgumentError("image: truncated JPEG (the data ends inside a scan)");
  }
  return absl::OkStatus();
}

}  // namespace mmserve::model::internal
