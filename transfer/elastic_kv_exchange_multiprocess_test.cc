// The elastic K/V exchange between processes: member 1 is an elastic_exchange_peer
// child. It gathers layer 0 with this process's member 0, then is SIGKILLed
// while member 0 waits in layer 1: member 0's wait ends UNAVAILABLE, not at
// its 1.5 s layer timeout (DEADLINE_EXCEEDED): over tcp UCX reports the
// peer lost; over shm, which reports nothing, the board sees the child's
// process gone (its target names the process, peer_liveness.h).
#include <catch2/catch.hpp>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "transfer/elastic_exchange_testing.h"
#include "transfer/elastic_kv_exchange.h"
#include "transfer/peer_liveness.h"
#include "transfer/peer_process.h"

namespace mmserve::transfer {
namespace {

constexpr int64_t kLen = 37, kWidth = 16;

std::string PeerPath() {
  std::string p = PeerBinaryPath();
  return p.substr(0, p.rfind('/')) + "/elastic_exchange_peer";
}

std::string TargetWords(const ElasticExchangeTarget& t) {
  return absl::StrCat(ToHex(t.worker_address), " ", ToHex(t.rkey), " ", t.base_address);
}

TEST_CASE("a member killed mid-exchange ends the others' wait in time", "[elastic]") {
  for (TransportProfile profile : {TransportProfile::kTcp, TransportProfile::kShm}) {
    CAPTURE(TransportProfileName(profile));
    auto child =
        PeerProcess::Spawn(PeerPath(), {absl::StrCat("--profile=", TransportProfileName(profile)),
                                        "--members=2", "--self=1", absl::StrCat("--len=", kLen),
                                        absl::StrCat("--width=", kWidth), "--layers=1"});
    REQUIRE(child.ok());
    const std::optional<std::string> line = (*child)->ReadLine(Deadline::After(absl::Seconds(30)));
    REQUIRE(line.has_value());
    REQUIRE(line->rfind("TARGET ", 0) == 0);
    auto ctx = UcxContext::Create(profile);
    REQUIRE(ctx.ok());
    const UcxElasticExchange::Plan plan{ElasticStripes(2, kLen), kLen, kWidth};
    auto ex =
        UcxElasticExchange::Create(**ctx, plan, 0, {.name = "elastic-0"}, absl::Milliseconds(1500));
    REQUIRE(ex.ok());
    REQUIRE((*child)->WriteLine(
        absl::StrCat("TARGETS ", TargetWords((*ex)->target()), " ", line->substr(7))));
    std::vector<std::string> words = absl::StrSplit(line->substr(7), ' ');
    REQUIRE(words.size() == 3);
    ElasticExchangeTarget theirs{FromHex(words[0]), FromHex(words[1]), 0};
    REQUIRE(absl::SimpleAtoi(words[2], &theirs.base_address));
    theirs.process = LocalProcessIdentity((*child)->pid());
    REQUIRE((*ex)->Connect({(*ex)->target(), theirs}).ok());
    bool equal = false;
    REQUIRE(ElasticRunLayer(**ex, plan, 0, 0, &equal).ok());
    CHECK(equal);
    const std::optional<std::string> done = (*child)->ReadLine(Deadline::After(absl::Seconds(30)));
    REQUIRE(done == std::optional<std::string>("LAYER 0 OK"));
    (*child)->Kill();
    const absl::Status s = ElasticRunLayer(**ex, plan, 0, 1, &equal);
    INFO(s);
    CHECK(s.code() == absl::StatusCode::kUnavailable);
  }
}

}  // namespace
}  // namespace mmserve::transfer
