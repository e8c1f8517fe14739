// The role connectors' decisions, without an engine: what each plans for a
// request, when a prefill hands off, and a decode side's commit deadlines
// and preemption aborts.
#include "worker/kv_connector.h"

#include <catch2/catch.hpp>

namespace mmserve::worker {
namespace {

using scheduler::FinishReason;

TEST_CASE("prefill plans prompt-only requests and hands off unless the first token ends them",
          "[kv_connector]") {
  PrefillKvConnector c;
  CHECK(c.Attach({.tp_size = 1}).ok());
  CHECK(c.Attach({.tp_size = 2}).ok());  // each rank's heads are handed off
  const KvPlan plan = c.PlanRequest({.id = "r"});
  CHECK(plan.prompt_only);
  CHECK_FALSE(plan.remote_prompt);
  auto done = [&](FinishReason reason, int max_tokens) {
    return c.OnPromptDone(
        {.id = "r", .first_token = 7, .reason = reason, .max_tokens = max_tokens});
  };
  CHECK(done(FinishReason::kLength, 16));       // the one-token limit: the rest is decoded
  CHECK_FALSE(done(FinishReason::kLength, 1));  // the client asked for one token
  CHECK_FALSE(done(FinishReason::kStop, 16));   // a stop token or eos
  CHECK(c.OnPreempted("r").ok());               // recomputed here
  CHECK(c.TakeExpired().empty());
}

TEST_CASE("decode reserves remote prompts and aborts those not committed in time",
          "[kv_connector]") {
  DecodeKvConnector c({.commit_timeout = absl::ZeroDuration()});
  CHECK(c.Attach({.tp_size = 2}).ok());
  const KvPlan plan = c.PlanRequest({.id = "a"});
  CHECK(plan.remote_prompt);
  CHECK_FALSE(plan.prompt_only);
  c.OnReserved("a", {.id = "a"});
  c.OnReserved("b", {.id = "b"});
  c.OnCommitted("b");
  CHECK(c.TakeExpired() == std::vector<std::string>{"a"});  // a zero timeout has passed
  c.OnFinished("a");
  CHECK(c.TakeExpired().empty());
  DecodeKvConnector patient;  // no timeout
  patient.OnReserved("c", {.id = "c"});
  CHECK(patient.TakeExpired().empty());
}

TEST_CASE("decode aborts a preempted image request, which it cannot recompute", "[kv_connector]") {
  DecodeKvConnector c;
  c.OnReserved("text", {.id = "text"});
  c.OnReserved("image", {.id = "image", .num_handoff_images = 1});
  CHECK(c.OnPreempted("text").ok());
  CHECK(c.OnPreempted("image").code() == absl::StatusCode::kResourceExhausted);
  c.OnFinished("image");
  CHECK(c.OnPreempted("image").ok());  // forgotten once it left
  CHECK_FALSE(c.OnPromptDone({.id = "text"}));
}

}  // namespace
}  // namespace mmserve::worker
