#include "router/data_url.h"

#include <catch2/catch.hpp>
#include <random>
#include <string>

#include "absl/strings/escaping.h"

namespace mmserve::router {
namespace {

TEST_CASE("DecodeBase64 decodes the RFC 4648 test vectors", "[base64]") {
  CHECK(*DecodeBase64("") == "");
  CHECK(*DecodeBase64("Zg==") == "f");
  CHECK(*DecodeBase64("Zm8=") == "fo");
  CHECK(*DecodeBase64("Zm9v") == "foo");
  CHECK(*DecodeBase64("Zm9vYg==") == "foob");
  CHECK(*DecodeBase64("Zm9vYmE=") == "fooba");
  CHECK(*DecodeBase64("Zm9vYmFy") == "foobar");
  CHECK(*DecodeBase64("+/+/") == "\xfb\xff\xbf");
}

TEST_CASE("DecodeBase64 round-trips random bytes encoded by abseil", "[base64]") {
  std::mt19937 rng(7);
  for (size_t len = 0; len < 300; ++len) {
    std::string bytes(len, '\0');
    for (char& c : bytes) c = static_cast<char>(rng());
    absl::StatusOr<std::string> decoded = DecodeBase64(absl::Base64Escape(bytes));
    REQUIRE(decoded.ok());
    CHECK(*decoded == bytes);
  }
}

TEST_CASE("DecodeBase64 is strict", "[base64]") {
  for (const char* bad : {
           "Zg",          // padding missing
           "Zg=",         // length not a multiple of 4
           "Zm9\n",       // whitespace
           "Zm 9",        // whitespace inside
           "Zm9-",        // URL-safe alphabet
           "Zm9_",        // URL-safe alphabet
           "Z===",        // three padding characters
           "====",        // nothing but padding
           "Zg=a",        // padding before data
           "Zg==Zm9v",    // padding in the middle
           "Zh==",        // non-zero bits dropped by the padding
           "Zm9=",        // non-zero bits dropped by the padding
           "Zm\xc3\xa9",  // non-ASCII
       }) {
    INFO(bad);
    absl::StatusOr<std::string> r = DecodeBase64(bad);
    CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
  }
}

TEST_CASE("ParseDataUrl reads the media type and decodes the payload", "[data_url]") {
  absl::StatusOr<DataUrl> url = ParseDataUrl("data:image/PNG;base64,Zm9vYmFy", 100);
  REQUIRE(url.ok());
  CHECK(url->mime_type == "image/png");
  CHECK(url->data == "foobar");

  url = ParseDataUrl("DATA:image/jpeg;name=a.jpg;BASE64,Zm9v", 100);
  REQUIRE(url.ok());
  CHECK(url->mime_type == "image/jpeg");
  CHECK(url->data == "foo");
}

TEST_CASE("ParseDataUrl refuses malformed URLs and oversized payloads", "[data_url]") {
  auto message = [](absl::string_view url, size_t max_bytes = 100) {
    absl::StatusOr<DataUrl> r = ParseDataUrl(url, max_bytes);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
    return std::string(r.status().message());
  };
  CHECK(message("https://example.com/a.png") == "not a data: URL");
  CHECK(message("data:image/png;base64") == "data: URL has no ',' before its payload");
  CHECK(message("data:image/svg+xml,<svg/>").find("must be base64") != std::string::npos);
  CHECK(message("data:image/png;base64,Zm!v").find("invalid base64 character") !=
        std::string::npos);
  // Exactly at the limit passes, one byte over fails; far over fails before
  // decoding.
  CHECK(ParseDataUrl("data:image/png;base64,Zm9vYmFy", 6).ok());
  CHECK(message("data:image/png;base64,Zm9vYmFy", 5) == "image of 6 bytes exceeds the limit of 5");
  CHECK(message("data:image/png;base64," + std::string(4000, 'A'), 100).find("about 3000 bytes") !=
        std::string::npos);
}

}  // namespace
}  // namespace mmserve::router
