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

TEST_CASE("each served model_type speaks its family's format", "[chat][family]") {
  CHECK(*ChatFamilyFor("qwen2_vl") == ChatFamily::kQwen2Vl);
  CHECK(*ChatFamilyFor("qwen2_5_vl") == ChatFamily::kQwen2Vl);
  CHECK(*ChatFamilyFor("qwen2") == ChatFamily::kQwen25);
  CHECK(*ChatFamilyFor("qwen3") == ChatFamily::kQwen3);
  CHECK(*ChatFamilyFor("qwen3_moe") == ChatFamily::kQwen3);
  CHECK(*ChatFamilyFor("qwen3_vl") == ChatFamily::kQwen3Vl);
  CHECK(*ChatFamilyFor("qwen3_vl_moe") == ChatFamily::kQwen3Vl);
  auto unknown = ChatFamilyFor("llama");
  CHECK(unknown.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(unknown.status().message() == "model_type \"llama\" has no known chat format");
}

TEST_CASE("the default system prompt is the family's own, or the one the options give",
          "[chat][family]") {
  const std::vector<ChatMessage> hi = {{"user", {Text("hi")}}};
  CHECK(RenderChat(ChatFamily::kQwen25, hi, ChatOptions())
            ->rfind("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
                    "assistant.<|im_end|>\n",
                    0) == 0);
  ChatOptions own;
  own.default_system_prompt = "Be kind.";
  CHECK(RenderChat(ChatFamily::kQwen2Vl, hi, own)->rfind("<|im_start|>system\nBe kind.", 0) == 0);
  CHECK(*RenderChat(ChatFamily::kQwen3, hi, own) ==
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
}

TEST_CASE("enable_thinking=false closes an empty think block in Qwen3's prompt only",
          "[chat][family]") {
  const std::vector<ChatMessage> hi = {{"user", {Text("hi")}}};
  ChatOptions off;
  off.enable_thinking = false;
  CHECK(*RenderChat(ChatFamily::kQwen3, hi, off) ==
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
  CHECK(*RenderChat(ChatFamily::kQwen3Vl, hi, off) ==
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
  off.add_generation_prompt = false;
  CHECK(*RenderChat(ChatFamily::kQwen3, hi, off) == "<|im_start|>user\nhi<|im_end|>\n");
}

TEST_CASE("text-only families refuse images and videos; vision families place them",
          "[chat][family]") {
  for (ChatFamily text_only : {ChatFamily::kQwen25, ChatFamily::kQwen3}) {
    auto image = RenderChat(text_only, {{"user", {Text("a"), Image()}}}, ChatOptions());
    CHECK(image.status().message() == "message 0: this model does not accept images");
    auto video = RenderChat(text_only, {{"user", {Video()}}}, ChatOptions());
    CHECK(video.status().message() == "message 0: this model does not accept videos");
  }
  auto vl = RenderChat(ChatFamily::kQwen3Vl, {{"user", {Image(), Text("?")}}}, ChatOptions());
  CHECK(*vl == std::string("<|im_start|>user\n") + kQwen2VlImagePlaceholder +
                   "?<|im_end|>\n<|im_start|>assistant\n");
  auto late = RenderChat(ChatFamily::kQwen3Vl, {{"user", {Text("x")}}, {"system", {Text("y")}}},
                         ChatOptions());
  CHECK(late.status().message() == "message 1: a system message may only come first");
}

}  // namespace
}  // namespace mmserve::model
