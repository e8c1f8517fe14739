#include "router/choice_calls.h"

#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <vector>

namespace mmserve::router {
namespace {

using mmserve::v1::GenerateRequest;
using mmserve::v1::GenerateResponse;

// Calls the test drives by hand: what each was started with, its sink, and
// the cancels it got.
struct FakeCalls {
  struct Call {
    GenerateRequest request;
    CallSink sink;
    std::vector<std::string> cancels;
  };
  std::vector<std::shared_ptr<Call>> calls;

  ChoiceCalls::StartCall Starter() {
    return [this](GenerateRequest r, CallSink s) {
      auto call = std::make_shared<Call>(Call{std::move(r), std::move(s), {}});
      calls.push_back(call);
      const std::string id = call->request.request_id().empty()
                                 ? "req-" + std::to_string(calls.size())
                                 : call->request.request_id();
      return ChoiceCalls::StartedCall{
          id, [call](const std::string& why) { call->cancels.push_back(why); }};
    };
  }
};

// What reached the request's sink.
struct Received {
  std::vector<GenerateResponse> responses;
  std::vector<absl::Status> ends;
  CallSink Sink() {
    return {.on_response = [this](GenerateResponse r) { responses.push_back(std::move(r)); },
            .on_end = [this](absl::Status s) { ends.push_back(std::move(s)); }};
  }
};

GenerateResponse Token(const std::string& id, uint32_t token, bool final = false) {
  GenerateResponse r;
  r.set_request_id(id);
  r.add_token_ids(token);
  r.set_text("t");
  if (final) r.set_finish_reason(mmserve::v1::FINISH_REASON_LENGTH);
  return r;
}

GenerateRequest Request(uint32_t n) {
  GenerateRequest r;
  r.set_request_id("mine");
  r.set_n(n);
  r.mutable_sampling()->set_seed(40);
  r.mutable_raw()->set_text("hi");
  return r;
}

TEST_CASE("the other choices start after choice 0's first token, seeds s + i", "[choices]") {
  FakeCalls fake;
  Received got;
  auto choices = ChoiceCalls::Start(Request(3), got.Sink(), fake.Starter());
  REQUIRE(choices != nullptr);
  CHECK(choices->id() == "mine");
  REQUIRE(fake.calls.size() == 1);
  const GenerateRequest& first = fake.calls[0]->request;
  CHECK(first.n() == 0);
  CHECK(first.request_id() == "mine");
  CHECK(first.sampling().seed() == 40);
  CHECK(first.stream().include_token_ids());  // the first token is what starts the others

  GenerateResponse empty;
  empty.set_request_id("mine");
  fake.calls[0]->sink.on_response(empty);  // no token yet: nothing more starts
  CHECK(fake.calls.size() == 1);
  fake.calls[0]->sink.on_response(Token("mine", 7));
  REQUIRE(fake.calls.size() == 3);
  for (uint32_t i = 1; i < 3; ++i) {
    INFO("choice " << i);
    CHECK(fake.calls[i]->request.request_id().empty());  // the router assigns one
    CHECK(fake.calls[i]->request.sampling().seed() == 40 + i);
    CHECK(fake.calls[i]->request.raw().text() == "hi");
  }
  fake.calls[2]->sink.on_response(Token("req-2", 9));
  fake.calls[1]->sink.on_response(Token("req-1", 8, /*final=*/true));
  fake.calls[1]->sink.on_end(absl::OkStatus());
  fake.calls[0]->sink.on_response(Token("mine", 5, true));
  fake.calls[0]->sink.on_end(absl::OkStatus());
  CHECK(got.ends.empty());  // choice 2 still runs
  fake.calls[2]->sink.on_response(Token("req-2", 3, true));
  fake.calls[2]->sink.on_end(absl::OkStatus());
  REQUIRE(got.ends.size() == 1);
  CHECK(got.ends[0].ok());

  // Each response: the request's id, its choice's index, no token ids
  // (the client did not ask for them).
  std::vector<uint32_t> indices;
  for (const GenerateResponse& r : got.responses) {
    CHECK(r.request_id() == "mine");
    CHECK(r.token_ids_size() == 0);
    indices.push_back(r.index());
  }
  CHECK(indices == std::vector<uint32_t>{0, 0, 2, 1, 0, 2});
  for (const auto& c : fake.calls) CHECK(c->cancels.empty());
}

TEST_CASE("a failing choice cancels the others; the end waits for them", "[choices]") {
  FakeCalls fake;
  Received got;
  GenerateRequest req = Request(3);
  req.mutable_stream()->set_include_token_ids(true);
  auto choices = ChoiceCalls::Start(req, got.Sink(), fake.Starter());
  fake.calls[0]->sink.on_response(Token("mine", 7));
  REQUIRE(fake.calls.size() == 3);
  CHECK(got.responses[0].token_ids_size() == 1);  // asked for: kept
  fake.calls[1]->sink.on_end(absl::UnavailableError("instance lost"));
  REQUIRE(fake.calls[0]->cancels.size() == 1);
  REQUIRE(fake.calls[2]->cancels.size() == 1);
  CHECK(fake.calls[0]->cancels[0] == "choice 1 failed: instance lost");
  CHECK(fake.calls[1]->cancels.empty());
  CHECK(got.ends.empty());
  fake.calls[0]->sink.on_end(absl::CancelledError("cancelled"));
  fake.calls[2]->sink.on_end(absl::CancelledError("cancelled"));
  REQUIRE(got.ends.size() == 1);
  CHECK(got.ends[0].code() == absl::StatusCode::kUnavailable);  // the first error
}

TEST_CASE("choice 0 refused before a token: no other choice starts", "[choices]") {
  FakeCalls fake;
  Received got;
  auto choices = ChoiceCalls::Start(Request(4), got.Sink(), fake.Starter());
  fake.calls[0]->sink.on_end(absl::InvalidArgumentError("temperature must be >= 0"));
  CHECK(fake.calls.size() == 1);
  REQUIRE(got.ends.size() == 1);
  CHECK(got.ends[0].code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("cancel before the first token: only choice 0 ran, and it is cancelled", "[choices]") {
  FakeCalls fake;
  Received got;
  auto choices = ChoiceCalls::Start(Request(2), got.Sink(), fake.Starter());
  choices->CancelAll("client gone");
  REQUIRE(fake.calls[0]->cancels == std::vector<std::string>{"client gone"});
  fake.calls[0]->sink.on_response(Token("mine", 1));  // raced with the cancel
  CHECK(fake.calls.size() == 1);
  fake.calls[0]->sink.on_end(absl::CancelledError("client gone"));
  REQUIRE(got.ends.size() == 1);
  CHECK(got.ends[0].code() == absl::StatusCode::kCancelled);
}

TEST_CASE("a sink that cancels inline, calls that end inline: one end, no deadlock", "[choices]") {
  // As a gRPC stream whose write fails inline: the client is gone, the
  // front end cancels, and a call's cancel runs its sink's on_end inline.
  std::vector<std::shared_ptr<FakeCalls::Call>> calls;
  ChoiceCalls::StartCall start = [&calls](GenerateRequest r, CallSink s) {
    auto call = std::make_shared<FakeCalls::Call>(FakeCalls::Call{std::move(r), std::move(s), {}});
    calls.push_back(call);
    return ChoiceCalls::StartedCall{"mine", [call](const std::string& why) {
                                      call->cancels.push_back(why);
                                      call->sink.on_end(absl::CancelledError(why));
                                    }};
  };
  std::shared_ptr<ChoiceCalls> choices;
  std::vector<absl::Status> ends;
  int responses = 0;
  CallSink sink{.on_response =
                    [&](GenerateResponse) {
                      ++responses;
                      choices->CancelAll("the client is gone");
                    },
                .on_end = [&](absl::Status s) { ends.push_back(std::move(s)); }};
  choices = ChoiceCalls::Start(Request(3), std::move(sink), start);
  calls[0]->sink.on_response(Token("mine", 1));
  CHECK(responses == 1);
  CHECK(calls.size() == 1);  // cancelled before the others started
  REQUIRE(ends.size() == 1);
  CHECK(ends[0].code() == absl::StatusCode::kCancelled);
}

TEST_CASE("n above the limit is refused before anything starts", "[choices]") {
  FakeCalls fake;
  Received got;
  CHECK(ChoiceCalls::Start(Request(ChoiceCalls::kMaxChoices + 1), got.Sink(), fake.Starter()) ==
        nullptr);
  CHECK(fake.calls.empty());
  REQUIRE(got.ends.size() == 1);
  CHECK(got.ends[0].code() == absl::StatusCode::kInvalidArgument);
  CHECK(got.ends[0].message() == "n must be in [1, 16], got 17");
}

}  // namespace
}  // namespace mmserve::router
