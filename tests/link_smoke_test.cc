// Calls into every wrapped system library (gRPC, protobuf, abseil, UCX,
// xxHash, stb_image, OpenBLAS) so a missing or misordered library fails the
// link, in shared and --config=static builds alike. Exits non-zero when a
// call gives a wrong answer.
#include <cblas.h>
#include <grpcpp/grpcpp.h>
#include <stb/stb_image.h>
#include <ucp/api/ucp.h>

#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/hash.h"
#include "proto/inference.pb.h"

int main() {
  int failures = 0;
  auto expect = [&](bool ok, const char* what) {
    std::printf("%s %s\n", ok ? "ok  " : "FAIL", what);
    failures += !ok;
  };

  expect(!grpc::Version().empty(), "grpc::Version");

  mmserve::v1::GenerateRequest req;
  req.set_request_id("r");
  mmserve::v1::GenerateRequest back;
  expect(back.ParseFromString(req.SerializeAsString()) && back.request_id() == "r",
         "protobuf round trip");

  expect(absl::StrCat("a", 1) == "a1", "absl::StrCat");

  unsigned major = 0, minor = 0, release = 0;
  ucp_get_version(&major, &minor, &release);
  expect(major == 1 && minor >= 13, "ucp_get_version >= 1.13");

  expect(mmserve::HashBytes("x") != mmserve::HashBytes("y"), "XXH3");

  // A 1x1 8-bit grayscale PNG.
  static const unsigned char kPng[] = {
      0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a, 0x00, 0x00, 0x00, 0x0d, 0x49, 0x48,
      0x44, 0x52, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x01, 0x08, 0x00, 0x00, 0x00,
      0x00, 0x3a, 0x7e, 0x9b, 0x55, 0x00, 0x00, 0x00, 0x0a, 0x49, 0x44, 0x41, 0x54, 0x78,
      0x9c, 0x63, 0x60, 0x00, 0x00, 0x00, 0x02, 0x00, 0x01, 0x48, 0xaf, 0xa4, 0x71, 0x00,
      0x00, 0x00, 0x00, 0x49, 0x45, 0x4e, 0x44, 0xae, 0x42, 0x60, 0x82};
  int w = 0, h = 0, c = 0;
  expect(stbi_info_from_memory(kPng, sizeof(kPng), &w, &h, &c) == 1 && w == 1 && h == 1,
         "stbi_info_from_memory");

  float x[3] = {1, 2, 3}, y[3] = {4, 5, 6};
  expect(cblas_sdot(3, x, 1, y, 1) == 32.0f, "cblas_sdot");

  return failures == 0 ? 0 : 1;
}
