#include "router/openai_testing.h"

#include <catch2/catch.hpp>
#include <utility>

namespace mmserve::router {

OpenAiLimits TestLimits() {
  OpenAiLimits limits;
  limits.max_body_bytes = 1 << 20;
  limits.max_image_bytes = 1000;
  limits.max_images = 2;
  return limits;
}

OpenAiChatRequest MustParse(const nlohmann::json& body) {
  absl::StatusOr<OpenAiChatRequest> r = ParseChatCompletionRequest(body.dump(), TestLimits());
  INFO(body.dump());
  INFO(r.status().ToString());
  REQUIRE(r.ok());
  return *std::move(r);
}

nlohmann::json UserSays(const std::string& text) {
  return {{"model", "shapes-demo"}, {"messages", {{{"role", "user"}, {"content", text}}}}};
}

}  // namespace mmserve::router
