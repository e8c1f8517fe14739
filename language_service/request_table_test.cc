#include "language_service/request_table.h"

#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <vector>

namespace mmserve::language {
namespace {

std::unique_ptr<LiveRequest> Make(const std::string& id, RequestPhase phase) {
  auto r = std::make_unique<LiveRequest>();
  r->id = id;
  r->phase = phase;
  return r;
}

TEST_CASE("a claimed id refuses a duplicate until its record is taken", "[request_table]") {
  RequestTable table;
  int posted = 0;
  REQUIRE(table.Claim("a", [&] { return ++posted > 0; }).ok());
  CHECK(table.Claim("a", [&] { return ++posted > 0; }).code() == absl::StatusCode::kAlreadyExists);
  CHECK(posted == 1);  // the duplicate posts nothing
  CHECK(table.size() == 1);
  table.Insert(Make("a", RequestPhase::kGathering));
  REQUIRE(table.Find("a") != nullptr);
  CHECK(table.Find("b") == nullptr);
  std::unique_ptr<LiveRequest> gone = table.Take("a");
  REQUIRE(gone != nullptr);
  CHECK(gone->id == "a");
  CHECK(table.size() == 0);
  CHECK(table.Find("a") == nullptr);
  CHECK(table.Take("a") == nullptr);
  CHECK(table.Claim("a", [] { return true; }).ok());
}

TEST_CASE("a claim whose post fails, or after Close, leaves no id", "[request_table]") {
  RequestTable table;
  CHECK(table.Claim("a", [] { return false; }).code() == absl::StatusCode::kUnavailable);
  CHECK(table.size() == 0);
  CHECK(table.Close());
  CHECK(!table.Close());  // only the first time
  bool posted = false;
  CHECK(table.Claim("b", [&] { return posted = true; }).code() == absl::StatusCode::kUnavailable);
  CHECK(!posted);
  CHECK(table.size() == 0);
}

TEST_CASE("RunUnlessKnown runs only for ids no request holds", "[request_table]") {
  RequestTable table;
  int ran = 0;
  CHECK(table.RunUnlessKnown("a", [&] { ++ran; }));
  REQUIRE(table.Claim("a", [] { return true; }).ok());
  CHECK(!table.RunUnlessKnown("a", [&] { ++ran; }));
  CHECK(ran == 1);
}

TEST_CASE("Ids selects records by what they hold", "[request_table]") {
  RequestTable table;
  table.Insert(Make("gathering", RequestPhase::kGathering));
  table.Insert(Make("engine", RequestPhase::kInEngine));
  table.Insert(Make("awaiting", RequestPhase::kAwaitingKv));
  CHECK(table.Ids().size() == 3);
  CHECK(table.Ids([](const LiveRequest& r) { return InEngine(r.phase); }) ==
        std::vector<std::string>{"awaiting", "engine"});
}

TEST_CASE("Advance moves a request along the phase table", "[request_table]") {
  LiveRequest r;
  r.id = "a";
  Advance(r, RequestEvent::kImagesArrived);
  CHECK(r.phase == RequestPhase::kInEngine);
  Advance(r, RequestEvent::kPromptDone);
  CHECK(r.phase == RequestPhase::kHandingOff);
  LiveRequest d;
  d.phase = RequestPhase::kRegistered;
  Advance(d, RequestEvent::kKvReserved);
  CHECK(d.phase == RequestPhase::kAwaitingKv);
  Advance(d, RequestEvent::kAbortAsked);
  CHECK(d.phase == RequestPhase::kAborting);
  CHECK(std::string(RequestPhaseName(d.phase)) == "aborting");
}

}  // namespace
}  // namespace mmserve::language
