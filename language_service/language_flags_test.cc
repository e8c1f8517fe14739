// The language binary's start-up refusals: a combination of flags it cannot
// serve ends the process with exit status 2 and one line naming the flags,
// before it binds a port or registers anywhere.
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "deploy/launcher/child_process.h"

namespace mmserve::language {
namespace {

constexpr char kModel[] = "models/shapes_demo";

struct Refusal {
  std::vector<std::string> flags;
  std::string message;
};

TEST_CASE("the language binary refuses flag combinations it cannot serve, exit status 2") {
  const std::vector<Refusal> cases = {
      {{"--role=router"}, "--role must be both, prefill, decode or elastic, not router"},
      {{"--role=elastic", "--tp=2"}, "--role=elastic needs --tp=1"},
      {{"--mm_handoff=sometimes"}, "--mm_handoff must be async or blocking"},
  };
  const std::string tmp =
      std::getenv("TEST_TMPDIR") != nullptr ? std::getenv("TEST_TMPDIR") : "/tmp";
  int n = 0;
  for (const Refusal& c : cases) {
    INFO(c.message);
    launcher::ChildSpec spec;
    spec.name = "language";
    spec.binary = "language_service/language";
    spec.args = {std::string("--model_dir=") + kModel, "--port=0", "--metrics_port=-1"};
    spec.args.insert(spec.args.end(), c.flags.begin(), c.flags.end());
    spec.log = tmp + "/language_flags_" + std::to_string(n++) + ".log";
    auto child = launcher::ChildProcess::Start(spec);
    REQUIRE(child.ok());
    auto ready = (*child)->WaitReady(absl::Seconds(60));
    REQUIRE(!ready.ok());
    CHECK(ready.status().code() == absl::StatusCode::kUnavailable);  // it exited
    CHECK((*child)->Stop(absl::Seconds(1)) == 2);
    const std::string log = (*child)->LogTail();
    INFO(log);
    CHECK(log.find("language: " + c.message) != std::string::npos);
  }
}

}  // namespace
}  // namespace mmserve::language
