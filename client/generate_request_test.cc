#include "client/generate_request.h"

#include <catch2/catch.hpp>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

namespace mmserve::client {
namespace {

// Writes bytes to a file under the test's temporary directory.
std::string WriteTempFile(const std::string& name, const std::string& bytes) {
  const char* dir = std::getenv("TEST_TMPDIR");
  std::string path = std::string(dir != nullptr ? dir : "/tmp") + "/" + name;
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

TEST_CASE("a chat request: system turn, then images and prompt in one user turn",
          "[generate_request]") {
  std::string a = WriteTempFile("shot,1.png", std::string("\x89PNG fake a", 11));
  std::string b = WriteTempFile("shot2.JPG", "jpeg bytes");
  GenerateOptions options;
  options.model = "shapes-demo";
  options.request_id = "req-1";
  options.prompt = "Which is bigger?";
  options.image_paths = {a, b};
  options.system = "Answer in two words.";
  options.sampling.set_temperature(0);
  options.sampling.set_max_tokens(8);
  options.sampling.add_stop("\n");
  options.include_token_ids = true;

  absl::StatusOr<mmserve::v1::GenerateRequest> r = BuildGenerateRequest(options);
  REQUIRE(r.ok());
  CHECK(r->model() == "shapes-demo");
  CHECK(r->request_id() == "req-1");
  REQUIRE(r->has_chat());
  REQUIRE(r->chat().messages_size() == 2);
  const mmserve::v1::ChatMessage& system = r->chat().messages(0);
  CHECK(system.role() == "system");
  CHECK(system.content(0).text() == "Answer in two words.");
  const mmserve::v1::ChatMessage& user = r->chat().messages(1);
  CHECK(user.role() == "user");
  REQUIRE(user.content_size() == 3);
  CHECK(user.content(0).image().data() == std::string("\x89PNG fake a", 11));
  CHECK(user.content(0).image().mime_type() == "image/png");
  CHECK(user.content(1).image().data() == "jpeg bytes");
  CHECK(user.content(1).image().mime_type() == "image/jpeg");
  CHECK(user.content(2).text() == "Which is bigger?");
  CHECK(r->sampling().has_temperature());
  CHECK(r->sampling().temperature() == 0);
  CHECK(r->sampling().max_tokens() == 8);
  CHECK(r->sampling().stop(0) == "\n");
  CHECK_FALSE(r->sampling().has_top_p());
  CHECK(r->stream().include_usage());
  CHECK(r->stream().include_timing());
  CHECK(r->stream().include_token_ids());
}

TEST_CASE("a prompt-only chat has no system turn and no images", "[generate_request]") {
  GenerateOptions options;
  options.prompt = "hello";
  absl::StatusOr<mmserve::v1::GenerateRequest> r = BuildGenerateRequest(options);
  REQUIRE(r.ok());
  REQUIRE(r->chat().messages_size() == 1);
  CHECK(r->chat().messages(0).content_size() == 1);
  CHECK_FALSE(r->chat().has_add_generation_prompt());
  CHECK_FALSE(r->stream().include_token_ids());
}

TEST_CASE("a raw request needs one placeholder per image", "[generate_request]") {
  std::string img = WriteTempFile("raw.png", "png");
  GenerateOptions options;
  options.raw = true;
  options.prompt = std::string("Look: ") + kImagePlaceholder + " and " + kImagePlaceholder;
  options.image_paths = {img, img};
  absl::StatusOr<mmserve::v1::GenerateRequest> r = BuildGenerateRequest(options);
  REQUIRE(r.ok());
  REQUIRE(r->has_raw());
  CHECK(r->raw().text() == options.prompt);
  CHECK(r->raw().images_size() == 2);

  options.image_paths = {img};
  r = BuildGenerateRequest(options);
  CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(r.status().message().find("holds 2 image placeholder(s)") != std::string::npos);

  options.image_paths = {img, img};
  options.system = "sys";
  CHECK(BuildGenerateRequest(options).status().code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("videos follow the images with their sampling options", "[generate_request]") {
  std::string img = WriteTempFile("v.png", "png");
  std::string clip = WriteTempFile("v.mp4", "mp4 bytes");
  GenerateOptions options;
  options.prompt = "what happens?";
  options.image_paths = {img};
  options.video_paths = {clip};
  options.video_fps = 2;
  options.video_max_frames = 16;
  absl::StatusOr<mmserve::v1::GenerateRequest> r = BuildGenerateRequest(options);
  REQUIRE(r.ok());
  const auto& user = r->chat().messages(0);
  REQUIRE(user.content_size() == 3);
  CHECK(user.content(0).has_image());
  REQUIRE(user.content(1).has_video());
  CHECK(user.content(1).video().data() == "mp4 bytes");
  CHECK(user.content(1).video().mime_type() == "video/mp4");
  CHECK(user.content(1).video().fps() == 2);
  CHECK(user.content(1).video().max_frames() == 16);
  CHECK(user.content(2).text() == "what happens?");

  options.raw = true;
  options.image_paths = {};
  options.prompt = std::string("See ") + kVideoPlaceholder;
  r = BuildGenerateRequest(options);
  REQUIRE(r.ok());
  CHECK(r->raw().videos_size() == 1);
  options.video_paths = {clip, clip};
  r = BuildGenerateRequest(options);
  CHECK(r.status().message().find("holds 1 video placeholder(s)") != std::string::npos);
  options.raw = false;
  options.video_paths = {"/no/such/clip.mp4"};
  CHECK(BuildGenerateRequest(options).status().message().find("--video /no/such/clip.mp4") !=
        std::string::npos);
}

TEST_CASE("empty requests and unreadable images are refused", "[generate_request]") {
  GenerateOptions empty;
  CHECK(BuildGenerateRequest(empty).status().code() == absl::StatusCode::kInvalidArgument);

  GenerateOptions missing;
  missing.prompt = "hi";
  missing.image_paths = {"/no/such/dir/x.png"};
  absl::StatusOr<mmserve::v1::GenerateRequest> r = BuildGenerateRequest(missing);
  CHECK(r.status().code() == absl::StatusCode::kNotFound);
  CHECK(r.status().message().find("--image /no/such/dir/x.png") != std::string::npos);

  GenerateOptions zero;
  zero.image_paths = {WriteTempFile("zero.png", "")};
  CHECK(BuildGenerateRequest(zero).status().code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("mime type hints follow the file extension", "[generate_request]") {
  CHECK(MimeTypeForPath("a.png") == "image/png");
  CHECK(MimeTypeForPath("dir/A.JPEG") == "image/jpeg");
  CHECK(MimeTypeForPath("x.jpg") == "image/jpeg");
  CHECK(MimeTypeForPath("x.bmp") == "image/bmp");
  CHECK(MimeTypeForPath("x.gif") == "image/gif");
  CHECK(MimeTypeForPath("x.webp").empty());
  CHECK(MimeTypeForPath("dir.png/file").empty());
  CHECK(MimeTypeForPath("noext").empty());
}

TEST_CASE("--json prints one line of protobuf JSON per response", "[generate_request]") {
  mmserve::v1::GenerateResponse r;
  r.set_request_id("r1");
  r.set_text("top left\n");
  r.add_token_ids(5);
  r.add_token_ids(6);
  r.set_finish_reason(mmserve::v1::FINISH_REASON_STOP);
  r.mutable_usage()->set_prompt_tokens(31);
  r.mutable_usage()->set_completion_tokens(2);
  r.set_seed(18446744073709551615ULL);
  std::string line = JsonLine(r);
  CHECK(line.find('\n') == std::string::npos);  // the text's newline is escaped
  nlohmann::json j = nlohmann::json::parse(line);
  CHECK(j["requestId"] == "r1");
  CHECK(j["text"] == "top left\n");
  CHECK(j["tokenIds"] == nlohmann::json{5, 6});
  CHECK(j["finishReason"] == "FINISH_REASON_STOP");
  CHECK(j["usage"]["promptTokens"] == 31);
  CHECK(j["usage"]["completionTokens"] == 2);
  CHECK(j["seed"] == "18446744073709551615");  // 64-bit integers are strings in proto3 JSON
  CHECK_FALSE(j.contains("matchedStop"));      // defaults are left out

  mmserve::v1::GenerateResponse step;
  step.set_text("a");
  CHECK(JsonLine(step) == "{\"text\":\"a\"}");
}

TEST_CASE("the final summary names the finish reason, usage and timing", "[generate_request]") {
  mmserve::v1::GenerateResponse r;
  r.set_finish_reason(mmserve::v1::FINISH_REASON_STOP_STRING);
  r.set_matched_stop("\n");
  r.mutable_usage()->set_prompt_tokens(31);
  r.mutable_usage()->set_completion_tokens(3);
  r.mutable_timing()->set_ttft_ms(41.25);
  r.mutable_timing()->set_e2e_ms(80.5);
  r.set_seed(42);
  CHECK(FinalSummary(r) ==
        "finish_reason=stop_string matched_stop=\"\\n\" prompt_tokens=31 completion_tokens=3 "
        "cached_prompt_tokens=0 image_tokens=0 cached_images=0 ttft_ms=41.2 e2e_ms=80.5 seed=42");
}

}  // namespace
}  // namespace mmserve::client
