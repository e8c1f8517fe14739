#include "bench/loadgen/workload.h"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

namespace mmserve::loadgen {
namespace {

WorkloadSpec Conversations(int requests, int turns) {
  return {.dataset = "synthetic",
          .num_requests = requests,
          .images = 1,
          .image_width = 32,
          .image_height = 32,
          .prompt_tokens = 4,
          .output_tokens = 2,
          .turns = turns,
          .think_time_s = 0.5};
}

TEST_CASE("turns build conversations whose every prompt extends the turn before it", "[workload]") {
  auto w = BuildWorkload(Conversations(6, 3));
  REQUIRE(w.ok());
  REQUIRE(w->items.size() == 6);
  CHECK(w->turns == 3);
  CHECK(w->think_time_s == 0.5);
  CHECK(w->image_store.size() == 2);  // one image per conversation
  for (size_t i = 0; i < w->items.size(); ++i) {
    const WorkItem& item = w->items[i];
    CHECK(item.conversation == static_cast<int>(i / 3));
    CHECK(item.turn == static_cast<int>(i % 3));
    CHECK(item.earlier_turns.size() == i % 3);
    CHECK(item.images[0] == w->items[i - i % 3].images[0]);
  }
  // The third turn: user (image, first question), assistant, user, assistant,
  // user (its own question); the image leads, once.
  const v1::GenerateRequest r = GrpcRequest(w->items[2]);
  REQUIRE(r.chat().messages_size() == 5);
  CHECK(r.chat().messages(0).content(0).has_image());
  CHECK(r.chat().messages(0).content(1).text() == w->items[0].text);
  CHECK(r.chat().messages(1).role() == "assistant");
  CHECK(r.chat().messages(1).content(0).text() == kAssistantReply);
  CHECK(r.chat().messages(2).content(0).text() == w->items[1].text);
  CHECK(r.chat().messages(4).content(0).text() == w->items[2].text);
  int images = 0;
  for (const auto& m : r.chat().messages()) {
    for (const auto& c : m.content()) images += c.has_image();
  }
  CHECK(images == 1);
  // The same chat over HTTP.
  const nlohmann::json body = nlohmann::json::parse(HttpBody(w->items[2]));
  REQUIRE(body["messages"].size() == 5);
  CHECK(body["messages"][0]["content"][0]["type"] == "image_url");
  CHECK(body["messages"][3]["content"] == kAssistantReply);
  CHECK(body["messages"][4]["content"][0]["text"] == w->items[2].text);
}

TEST_CASE("a single-turn item is one user message", "[workload]") {
  auto w = BuildWorkload(Conversations(2, 1));
  REQUIRE(w.ok());
  CHECK(w->items[1].conversation == -1);
  CHECK(GrpcRequest(w->items[1]).chat().messages_size() == 1);
}

TEST_CASE("bad conversation specs are refused", "[workload]") {
  CHECK(BuildWorkload(Conversations(4, 0)).status().code() == absl::StatusCode::kInvalidArgument);
  WorkloadSpec negative = Conversations(4, 2);
  negative.think_time_s = -1;
  CHECK(BuildWorkload(negative).status().code() == absl::StatusCode::kInvalidArgument);
  WorkloadSpec text = Conversations(4, 2);
  text.images = 0;
  auto w = BuildWorkload(text);
  REQUIRE(w.ok());
  CHECK(LanguageRequest(w->items[1], "id").status().code() == absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace mmserve::loadgen
