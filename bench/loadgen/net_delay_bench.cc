// bench/loadgen against a stack spread over namespaced test hosts
// (tests/net_stack.h: router, one encoder, one language instance, each on a
// host of its own, UCX tcp) at several one-way delays added to every link
// (jitter --jitter_share of the delay, 40% by default): TTFT, TPOT and goodput per delay, and the
// round trips on the critical path, (TTFT p50 - TTFT p50 at 0 ms) / (2 x delay). Needs root
// (network namespaces, TAP devices).
//
//   bazel run //bench/loadgen:net_delay_bench -- --delays_ms=0,10,50 --num_requests=40
//
// Prints each loadgen JSON line with "delay_ms" and "round_trips" added,
// then a table.
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "tests/net_stack.h"
#include "tests/stack_harness.h"

ABSL_FLAG(std::vector<std::string>, delays_ms, std::vector<std::string>({"0", "10", "50"}),
          "one-way delays added to every link, in ms");
ABSL_FLAG(double, jitter_share, 0.4, "jitter (uniform +-) as a share of the delay");
ABSL_FLAG(int, num_requests, 40, "requests per delay");
ABSL_FLAG(int, max_concurrency, 4, "requests in flight at most");
ABSL_FLAG(double, slo_ttft_ms, 1000, "goodput SLO on TTFT");
ABSL_FLAG(double, slo_tpot_ms, 100, "goodput SLO on TPOT");

namespace mmserve::testing {
namespace {

// One loadgen run against the router; its JSON line.
absl::StatusOr<nlohmann::json> RunLoadgen(const std::string& router, int delay_ms, int first) {
  const std::vector<std::string> argv = {
      RunfilesRoot() + "/bench/loadgen/loadgen",
      "--target=router",
      "--address=" + router,
      "--dataset=demo",
      absl::StrCat("--num_requests=", absl::GetFlag(FLAGS_num_requests)),
      absl::StrCat("--max_concurrency=", absl::GetFlag(FLAGS_max_concurrency)),
      absl::StrCat("--slo_ttft_ms=", absl::GetFlag(FLAGS_slo_ttft_ms)),
      absl::StrCat("--slo_tpot_ms=", absl::GetFlag(FLAGS_slo_tpot_ms)),
      absl::StrCat("--seed=", first + 1),
      "--check=answers",
      "--fail_on_error",
      absl::StrCat("--label=delay_", delay_ms, "ms")};
  absl::StatusOr<std::string> out = RunCommand(argv);
  if (!out.ok()) return out.status();
  for (absl::string_view line : absl::StrSplit(*out, '\n')) {
    if (line.empty() || line[0] != '{') continue;
    nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_discarded() && j.contains("ttft_p50_ms")) return j;
  }
  return absl::InternalError("no JSON line from loadgen:\n" + *out);
}

int Run() {
  if (absl::Status s = NetHostsSupported(); !s.ok()) {
    std::fprintf(stderr, "net_delay_bench: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  NetStackOptions o;
  o.router_args = {"--poll_timeout_ms=2000", "--down_after=3", "--heartbeat_timeout_ms=10000"};
  auto hosts = NetHosts::Create(NetStack::HostsFor(o));
  if (!hosts.ok()) return std::fprintf(stderr, "%s\n", hosts.status().ToString().c_str()), 1;
  auto stack = NetStack::Start(**hosts, o);
  if (!stack.ok()) return std::fprintf(stderr, "%s\n", stack.status().ToString().c_str()), 1;
  std::vector<std::pair<int, nlohmann::json>> runs;
  int first = 0;
  for (const std::string& d : absl::GetFlag(FLAGS_delays_ms)) {
    int ms = 0;
    if (!absl::SimpleAtoi(d, &ms) || ms < 0)
      return std::fprintf(stderr, "bad delay %s\n", d.c_str()), 2;
    const LinkFault f{.delay = absl::Milliseconds(ms),
                      .jitter = absl::Milliseconds(ms * absl::GetFlag(FLAGS_jitter_share))};
    for (int h = 0; h < (*hosts)->size(); ++h) (*hosts)->SetLink(h, f);
    (*hosts)->SetClientLink(f);
    absl::StatusOr<nlohmann::json> j = RunLoadgen((*stack)->router_address(), ms, first++);
    if (!j.ok()) return std::fprintf(stderr, "%s\n", j.status().ToString().c_str()), 1;
    runs.emplace_back(ms, *j);
  }
  const double base = runs.empty() ? 0 : runs[0].second["ttft_p50_ms"].get<double>();
  std::printf("%-10s %12s %12s %12s %12s %14s %12s\n", "delay_ms", "ttft_p50_ms", "ttft_p99_ms",
              "tpot_p50_ms", "e2e_p50_ms", "goodput_rps", "round_trips");
  for (auto& [ms, j] : runs) {
    const double trips = ms == 0 ? 0 : (j["ttft_p50_ms"].get<double>() - base) / (2.0 * ms);
    j["delay_ms"] = ms;
    j["round_trips"] = trips;
    std::printf("%-10d %12.1f %12.1f %12.2f %12.1f %14.2f %12.2f\n", ms,
                j["ttft_p50_ms"].get<double>(), j["ttft_p99_ms"].get<double>(),
                j["tpot_p50_ms"].get<double>(), j.value("e2e_p50_ms", -1.0),
                j["goodput"].get<double>(), trips);
  }
  for (const auto& [ms, j] : runs) std::printf("%s\n", j.dump().c_str());
  return 0;
}

}  // namespace
}  // namespace mmserve::testing

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return mmserve::testing::Run();
}
