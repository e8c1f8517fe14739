// A member of an elastic prefill group in its own process, for the
// multi-process exchange tests: member --self of --members, every member
// computing rows r with r % members == self of a --len-token prompt, K/V
// rows of --width floats whose values ElasticTestValue gives. Prints
//   TARGET <hex worker address> <hex rkey> <base address>
// then reads one "TARGETS <addr> <rkey> <base> ..." line (every member, in
// order), and runs --layers layers, printing "LAYER <n> OK" after each (or
// "LAYER <n> <status>" and exits); then waits for EXIT (or a SIGKILL).
//   elastic_exchange_peer --profile=tcp --members=2 --self=1 --len=37 --width=16 --layers=1
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "common/logging.h"
#include "transfer/elastic_exchange_testing.h"
#include "transfer/peer_process.h"

ABSL_FLAG(std::string, profile, "shm", "tcp or shm");
ABSL_FLAG(int, members, 2, "members of the group");
ABSL_FLAG(int, self, 1, "this member");
ABSL_FLAG(int64_t, len, 37, "prompt tokens");
ABSL_FLAG(int64_t, width, 16, "floats of one token's K (or V)");
ABSL_FLAG(int, layers, 1, "layers to run before waiting for EXIT");

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  using namespace mmserve::transfer;  // NOLINT
  auto profile = ParseTransportProfile(absl::GetFlag(FLAGS_profile));
  CHECK(profile.ok()) << profile.status();
  auto ctx = UcxContext::Create(*profile);
  CHECK(ctx.ok()) << ctx.status();
  const int members = absl::GetFlag(FLAGS_members), self = absl::GetFlag(FLAGS_self);
  const int64_t len = absl::GetFlag(FLAGS_len), width = absl::GetFlag(FLAGS_width);
  const UcxElasticExchange::Plan plan{ElasticStripes(members, len), len, width};
  auto ex =
      UcxElasticExchange::Create(**ctx, plan, self, {.name = "elastic-peer"}, absl::Seconds(10));
  CHECK(ex.ok()) << ex.status();
  const ElasticExchangeTarget& t = (*ex)->target();
  std::cout << "TARGET " << ToHex(t.worker_address) << " " << ToHex(t.rkey) << " " << t.base_address
            << std::endl;
  std::string line;
  CHECK(std::getline(std::cin, line));
  std::vector<std::string> words = absl::StrSplit(line, ' ', absl::SkipEmpty());
  CHECK_EQ(words.size(), 1 + 3 * static_cast<size_t>(members));
  std::vector<ElasticExchangeTarget> targets(members);
  for (int m = 0; m < members; ++m) {
    targets[m].worker_address = FromHex(words[1 + 3 * m]);
    targets[m].rkey = FromHex(words[2 + 3 * m]);
    CHECK(absl::SimpleAtoi(words[3 + 3 * m], &targets[m].base_address));
  }
  CHECK_OK((*ex)->Connect(targets));
  for (int layer = 0; layer < absl::GetFlag(FLAGS_layers); ++layer) {
    bool equal = false;
    const absl::Status s = ElasticRunLayer(**ex, plan, self, layer, &equal);
    std::cout << "LAYER " << layer << " " << (s.ok() && equal ? "OK" : s.ToString()) << std::endl;
    if (!s.ok()) return 1;
  }
  while (std::getline(std::cin, line) && line != "EXIT") {
  }
  return 0;
}
