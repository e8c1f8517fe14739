// The OpenAI mapping's error bodies, HTTP statuses, SSE framing and
// /v1/models listing (router/openai.h).
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <string>

#include "absl/status/status.h"
#include "router/openai.h"

namespace mmserve::router {
namespace {

using json = nlohmann::json;

TEST_CASE("SSE framing", "[openai]") {
  CHECK(SseEvent("{\"a\":1}") == "data: {\"a\":1}\n\n");
  CHECK(SseDone() == "data: [DONE]\n\n");
}

TEST_CASE("status codes map to HTTP statuses and OpenAI error bodies", "[openai]") {
  CHECK(HttpStatusFor(absl::StatusCode::kOk) == 200);
  CHECK(HttpStatusFor(absl::StatusCode::kInvalidArgument) == 400);
  CHECK(HttpStatusFor(absl::StatusCode::kOutOfRange) == 400);
  CHECK(HttpStatusFor(absl::StatusCode::kNotFound) == 404);
  CHECK(HttpStatusFor(absl::StatusCode::kResourceExhausted) == 429);
  CHECK(HttpStatusFor(absl::StatusCode::kCancelled) == 499);
  CHECK(HttpStatusFor(absl::StatusCode::kUnimplemented) == 501);
  CHECK(HttpStatusFor(absl::StatusCode::kUnavailable) == 503);
  CHECK(HttpStatusFor(absl::StatusCode::kDeadlineExceeded) == 504);
  CHECK(HttpStatusFor(absl::StatusCode::kInternal) == 500);
  CHECK(HttpStatusFor(absl::StatusCode::kFailedPrecondition) == 500);
  CHECK(HttpStatusFor(absl::StatusCode::kUnknown) == 500);

  json j = json::parse(ErrorJson(absl::InvalidArgumentError("temperature: must be a number")));
  CHECK(j == json{{"error",
                   {{"message", "temperature: must be a number"},
                    {"type", "invalid_request_error"},
                    {"param", nullptr},
                    {"code", "invalid_argument"}}}});
  CHECK(json::parse(ErrorJson(absl::NotFoundError("model x")))["error"]["type"] ==
        "not_found_error");
  CHECK(json::parse(ErrorJson(absl::ResourceExhaustedError("busy")))["error"]["type"] ==
        "rate_limit_error");
  CHECK(json::parse(ErrorJson(absl::DeadlineExceededError("late")))["error"]["code"] ==
        "deadline_exceeded");
  CHECK(HttpStatusFor(absl::StatusCode::kUnauthenticated) == 401);
  json key = json::parse(ErrorJson(absl::UnauthenticatedError("bad key")));
  CHECK(key["error"]["code"] == "invalid_api_key");
  CHECK(key["error"]["type"] == "invalid_request_error");
  CHECK(json::parse(ErrorJson(absl::ResourceExhaustedError("busy")))["error"]["code"] ==
        "rate_limit_exceeded");
  json too_big = json::parse(HttpErrorJson(413, "request_too_large", "big"));
  CHECK(too_big["error"]["type"] == "invalid_request_error");
  CHECK(too_big["error"]["code"] == "request_too_large");
  // A message that is not valid UTF-8 still makes valid JSON.
  CHECK_NOTHROW(json::parse(ErrorJson(absl::InternalError("bad \xff byte"))));
}

TEST_CASE("GET /v1/models lists every model card", "[openai]") {
  mmserve::v1::ListModelsResponse models;
  CHECK(json::parse(ModelsJson(models)) == json{{"object", "list"}, {"data", json::array()}});
  mmserve::v1::ModelCard* card = models.add_models();
  card->set_id("shapes-demo");
  card->set_max_model_len(4096);
  models.add_models()->set_id("other");
  json j = json::parse(ModelsJson(models, 1700000000));
  CHECK(j["object"] == "list");
  REQUIRE(j["data"].size() == 2);
  CHECK(j["data"][0] == json{{"id", "shapes-demo"},
                             {"object", "model"},
                             {"created", 1700000000},
                             {"owned_by", "mmserve"},
                             {"root", "shapes-demo"},
                             {"max_model_len", 4096}});
  CHECK(j["data"][1]["id"] == "other");
}

}  // namespace
}  // namespace mmserve::router
