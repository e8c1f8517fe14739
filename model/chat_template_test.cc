#include "model/chat_template.h"

#include <catch2/catch.hpp>

namespace mmserve::model {
namespace {

ChatPart Text(std::string t) { return {ChatPart::Kind::kText, std::move(t)}; }
ChatPart Image() { return {ChatPart::Kind::kImage, ""}; }
ChatPart Video() { return {ChatPart::Kind::kVideo, ""}; }

TEST_CASE("a user turn gets the default system prompt and a generation prompt", "[chat]") {
  auto out = RenderQwen2VlChat({{"user", {Image(), Text("What is this?")}}}, ChatOptions());
  REQUIRE(out.ok());
  CHECK(*out ==
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>What is this?<|im_end|>\n"
        "<|im_start|>assistant\n");
}

TEST_CASE("an explicit system message replaces the default; turns keep order", "[chat]") {
  ChatOptions opts;
  opts.add_generation_prompt = false;
  auto out = RenderQwen2VlChat(
      {{"system", {Text("Be terse.")}}, {"user", {Text("hi")}}, {"assistant", {Text("hello")}}},
      opts);
  REQUIRE(out.ok());
  CHECK(*out ==
        "<|im_start|>system\nBe terse.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
        "<|im_start|>assistant\nhello<|im_end|>\n");
}

TEST_CASE("add_vision_id numbers images across the whole chat", "[chat]") {
  ChatOptions opts;
  opts.add_vision_id = true;
  auto out = RenderQwen2VlChat(
      {{"user", {Image(), Text("and")}}, {"assistant", {Text("ok")}}, {"user", {Image()}}}, opts);
  REQUIRE(out.ok());
  CHECK(out->find("Picture 1: <|vision_start|>") != std::string::npos);
  CHECK(out->find("Picture 2: <|vision_start|>") != std::string::npos);
}

TEST_CASE("a video part renders as the video placeholder, numbered apart from images", "[chat]") {
  auto out =
      RenderQwen2VlChat({{"user", {Video(), Text("then"), Image(), Video()}}}, ChatOptions());
  REQUIRE(out.ok());
  CHECK(*out ==
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\n<|vision_start|><|video_pad|><|vision_end|>then"
        "<|vision_start|><|image_pad|><|vision_end|><|vision_start|><|video_pad|><|vision_end|>"
        "<|im_end|>\n<|im_start|>assistant\n");
  ChatOptions opts;
  opts.add_vision_id = true;
  auto ids = RenderQwen2VlChat({{"user", {Video(), Image(), Video()}}}, opts);
  REQUIRE(ids.ok());
  CHECK(ids->find("Video 1: " + std::string(kQwen2VlVideoPlaceholder) +
                  "Picture 1: " + kQwen2VlImagePlaceholder +
                  "Video 2: " + kQwen2VlVideoPlaceholder) != std::string::npos);
  auto bad = RenderQwen2VlChat({{"system", {Video()}}}, ChatOptions());
  CHECK(bad.status().message() == "message 0: only user messages may hold videos");
}

TEST_CASE("malformed chats are rejected with the offending message", "[chat]") {
  CHECK(RenderQwen2VlChat({}, ChatOptions()).status().code() == absl::StatusCode::kInvalidArgument);
  auto role = RenderQwen2VlChat({{"function", {Text("x")}}}, ChatOptions()).status();
  CHECK(role.message() == "message 0 has role \"function\" (system, user, assistant or tool)");
  auto late = RenderQwen2VlChat({{"user", {Text("x")}}, {"system", {Text("y")}}}, ChatOptions());
  CHECK(late.status().message() == "message 1: a system message may only come first");
  auto img = RenderQwen2VlChat({{"assistant", {Image()}}}, ChatOptions());
  CHECK(img.status().message() == "message 0: only user messages may hold images");
}

}  // namespace
}  // namespace mmserve::model
