// Arbitrary bytes as the body of POST /v1/chat/completions through
// ParseChatCompletionRequest, as router/http_frontend.cc calls it (limits
// from the router's options), then the router's PrepareRequest on the
// mapped GenerateRequest. Properties:
//  - a refusal is INVALID_ARGUMENT with a non-empty message, and its HTTP
//    reply is the documented one: status 400 and a body that parses as JSON
//    {"error":{"message": <the reason>, "type":"invalid_request_error",
//    "code":"invalid_argument"}};
//  - parsing is deterministic (a second parse gives the same request);
//  - an accepted body maps to a request with no request_id, at most
//    max_images images of at most max_image_bytes each, a model equal to the
//    one echoed, and a stream that asks for usage; PrepareRequest judges it
//    exactly as the gRPC path judges the same request sent as proto bytes
//    (fuzz/router_request_check.h, which also checks the header-vs-decode
//    grid of every accepted image).
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "absl/strings/string_view.h"
#include "fuzz/fuzz_check.h"
#include "fuzz/router_request_check.h"
#include "router/openai.h"
#include "router/request_media.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace mmserve;
  const router::RouterOptions& options = fuzz::FuzzRouterOptions();
  const absl::string_view body(reinterpret_cast<const char*>(data), size);
  router::OpenAiLimits limits;
  limits.max_image_bytes = options.max_image_bytes;
  limits.max_images = options.max_images;
  const absl::StatusOr<router::OpenAiChatRequest> chat =
      router::ParseChatCompletionRequest(body, limits);
  const absl::StatusOr<router::OpenAiChatRequest> again =
      router::ParseChatCompletionRequest(body, limits);
  FUZZ_CHECK(chat.status() == again.status()) << chat.status() << " vs " << again.status();
  if (!chat.ok()) {
    const absl::Status& s = chat.status();
    FUZZ_CHECK(absl::IsInvalidArgument(s)) << s;
    FUZZ_CHECK(!s.message().empty());
    FUZZ_CHECK(router::HttpStatusFor(s.code()) == 400) << router::HttpStatusFor(s.code());
    const std::string reply = router::ErrorJson(s);
    const nlohmann::json j = nlohmann::json::parse(reply, nullptr, /*allow_exceptions=*/false);
    FUZZ_CHECK(j.is_object() && j.contains("error") && j["error"].is_object()) << reply;
    const nlohmann::json& e = j["error"];
    FUZZ_CHECK(e.value("message", std::string()) == std::string(s.message())) << reply;
    FUZZ_CHECK(e.value("type", std::string()) == "invalid_request_error") << reply;
    FUZZ_CHECK(e.contains("code") && e["code"] == "invalid_argument") << reply;
    return 0;
  }
  FUZZ_CHECK(chat->request.SerializeAsString() == again->request.SerializeAsString());
  const v1::GenerateRequest& request = chat->request;
  FUZZ_CHECK(request.request_id().empty()) << request.request_id();
  FUZZ_CHECK(request.model() == chat->model);
  FUZZ_CHECK(request.stream().include_usage());
  const auto media = router::RequestMedia(request);
  FUZZ_CHECK(static_cast<int>(media.size()) <= limits.max_images) << media.size();
  for (const router::MediaPart& m : media) {
    if (m.image != nullptr) {
      FUZZ_CHECK(m.image->data().size() <= limits.max_image_bytes) << m.image->data().size();
    } else {
      FUZZ_CHECK(m.video->data().size() <= limits.max_video_bytes) << m.video->data().size();
    }
  }
  // The gRPC path: the same request as a client would send it.
  v1::GenerateRequest grpc;
  FUZZ_CHECK(grpc.ParseFromString(request.SerializeAsString()));
  const absl::Status http_verdict = fuzz::CheckPrepareRequest(options, request);
  const absl::Status grpc_verdict = fuzz::CheckPrepareRequest(options, grpc);
  FUZZ_CHECK(http_verdict == grpc_verdict) << http_verdict << " vs " << grpc_verdict;
  return 0;
}
