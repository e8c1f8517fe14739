// bench/loadgen against a stack spread over namespaced test hosts
// (tests/net_stack.h: router, one encoder and the language instances, each
// on a host of its own, UCX tcp) at several one-way delays added to every
// link (jitter --jitter_share of the delay, 40% by default): TTFT, TPOT, E2E
// and goodput per delay, and the network round trips on a request's
// critical path two ways, side by side:
//   counted: from the services' own metrics, per request that got a first
//     token: mmserve_router_critical_round_trips (router RPCs the first
//     token waited for) + mmserve_language_embedding_round_trips (Connect,
//     init/resume answered by a chunk) + mmserve_language_kv_handoff_round_trips
//     (P/D: AllocateKv, a flush per decode rank, CommitKv), plus 1 for the
//     client's own Generate call;
//   inferred: (TTFT p50 - TTFT p50 at the first delay) / (2 x delay).
// Needs root (network namespaces, TAP devices).
//
//   bazel run //bench/loadgen:net_delay_bench -- --delays_ms=0,10,50 --num_requests=40
//   bazel run //bench/loadgen:net_delay_bench -- --roles=prefill,decode
//
// Prints each loadgen JSON line with "delay_ms" and the round trips added,
// a table, and last one JSON line with every delay's figures
// (tools/plot_net_delay.py draws it).
#include <algorithm>
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
ABSL_FLAG(std::vector<std::string>, roles, std::vector<std::string>({"both"}),
          "the language instances' roles, one host each: both, or prefill,decode");

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

// The round-trip metrics summed over the stack, at one instant.
struct TripCounts {
  double first_tokens = 0;  // requests whose first token the router saw
  double router = 0;
  double embedding = 0;
  double kv_handoff = 0;
};

TripCounts ScrapeTrips(NetStack& stack, int languages) {
  auto value = [&stack](launcher::Service& s, const std::string& name) {
    return std::max(0.0, stack.Metric(s, name));  // absent (-1): nothing counted yet
  };
  TripCounts t;
  t.first_tokens = value(stack.router(), "mmserve_router_critical_round_trips_count");
  t.router = value(stack.router(), "mmserve_router_critical_round_trips_sum");
  for (int i = 0; i < languages; ++i) {
    t.embedding += value(stack.language(i), "mmserve_language_embedding_round_trips_sum");
    t.kv_handoff += value(stack.language(i), "mmserve_language_kv_handoff_round_trips_sum");
  }
  return t;
}

// Adds the counted (per request, between two scrapes) round trips to `j`.
void AddCountedTrips(const TripCounts& before, const TripCounts& after, nlohmann::json& j) {
  const double n = std::max(1.0, after.first_tokens - before.first_tokens);
  const double router = (after.router - before.router) / n;
  const double embedding = (after.embedding - before.embedding) / n;
  const double kv = (after.kv_handoff - before.kv_handoff) / n;
  j["round_trips_router"] = router;
  j["round_trips_embedding"] = embedding;
  j["round_trips_kv_handoff"] = kv;
  j["round_trips_services"] = router + embedding + kv;
  j["round_trips_counted"] = router + embedding + kv + 1;  // + the client's Generate
}

void PrintTable(const std::vector<nlohmann::json>& runs) {
  std::printf("%-8s %9s %9s %9s %9s %9s %9s %9s %9s %9s %9s\n", "delay_ms", "ttft_p50", "ttft_p99",
              "tpot_p50", "tpot_p99", "e2e_p50", "e2e_p99", "goodput", "rt_svc", "rt_count",
              "rt_infer");
  for (const nlohmann::json& j : runs) {
    std::printf("%-8d %9.1f %9.1f %9.2f %9.2f %9.1f %9.1f %9.2f %9.2f %9.2f %9.2f\n",
                j["delay_ms"].get<int>(), j["ttft_p50_ms"].get<double>(),
                j["ttft_p99_ms"].get<double>(), j["tpot_p50_ms"].get<double>(),
                j["tpot_p99_ms"].get<double>(), j["e2e_p50_ms"].get<double>(),
                j["e2e_p99_ms"].get<double>(), j["goodput"].get<double>(),
                j["round_trips_services"].get<double>(), j["round_trips_counted"].get<double>(),
                j["round_trips_inferred"].get<double>());
  }
  std::printf(
      "(ms; goodput req/s; rt_svc: round trips per request from the services' metrics, rt_count: "
      "the same + 1 for the client's call, rt_infer: TTFT p50 growth / (2 x delay))\n");
}

// The final JSON line: every delay's figures.
nlohmann::json Summary(const std::vector<nlohmann::json>& runs) {
  nlohmann::json s;
  s["bench"] = "net_delay_bench";
  s["roles"] = absl::GetFlag(FLAGS_roles);
  s["jitter_share"] = absl::GetFlag(FLAGS_jitter_share);
  s["num_requests"] = absl::GetFlag(FLAGS_num_requests);
  s["max_concurrency"] = absl::GetFlag(FLAGS_max_concurrency);
  s["slo_ttft_ms"] = absl::GetFlag(FLAGS_slo_ttft_ms);
  s["slo_tpot_ms"] = absl::GetFlag(FLAGS_slo_tpot_ms);
  for (const nlohmann::json& j : runs) {
    nlohmann::json r;
    for (const char* k : {"delay_ms", "ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms",
                          "e2e_p50_ms", "e2e_p99_ms", "goodput", "request_throughput",
                          "round_trips_router", "round_trips_embedding", "round_trips_kv_handoff",
                          "round_trips_services", "round_trips_counted", "round_trips_inferred"}) {
      r[k] = j[k];
    }
    s["runs"].push_back(r);
  }
  return s;
}

// Every delay in turn: each link delayed, one loadgen run, the metrics
// scraped around it.
absl::StatusOr<std::vector<nlohmann::json>> RunDelays(NetHosts& hosts, NetStack& stack) {
  const int languages = static_cast<int>(absl::GetFlag(FLAGS_roles).size());
  std::vector<nlohmann::json> runs;
  int first = 0;
  for (const std::string& d : absl::GetFlag(FLAGS_delays_ms)) {
    int ms = 0;
    if (!absl::SimpleAtoi(d, &ms) || ms < 0) return absl::InvalidArgumentError("bad delay " + d);
    const LinkFault f{.delay = absl::Milliseconds(ms),
                      .jitter = absl::Milliseconds(ms * absl::GetFlag(FLAGS_jitter_share))};
    for (int h = 0; h < hosts.size(); ++h) hosts.SetLink(h, f);
    hosts.SetClientLink(f);
    const TripCounts before = ScrapeTrips(stack, languages);
    absl::StatusOr<nlohmann::json> j = RunLoadgen(stack.router_address(), ms, first++);
    if (!j.ok()) return j.status();
    AddCountedTrips(before, ScrapeTrips(stack, languages), *j);
    (*j)["delay_ms"] = ms;
    runs.push_back(*std::move(j));
  }
  for (nlohmann::json& j : runs) {
    const int base_ms = runs[0]["delay_ms"].get<int>();
    const int ms = j["delay_ms"].get<int>();
    const double growth = j["ttft_p50_ms"].get<double>() - runs[0]["ttft_p50_ms"].get<double>();
    j["round_trips_inferred"] = ms == base_ms ? 0.0 : growth / (2.0 * (ms - base_ms));
  }
  return runs;
}

int Run() {
  if (absl::Status s = NetHostsSupported(); !s.ok()) {
    std::fprintf(stderr, "net_delay_bench: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  NetStackOptions o;
  o.languages = absl::GetFlag(FLAGS_roles);
  o.router_args = {"--poll_timeout_ms=2000", "--down_after=3", "--heartbeat_timeout_ms=10000"};
  auto hosts = NetHosts::Create(NetStack::HostsFor(o));
  if (!hosts.ok()) return std::fprintf(stderr, "%s\n", hosts.status().ToString().c_str()), 1;
  auto stack = NetStack::Start(**hosts, o);
  if (!stack.ok()) return std::fprintf(stderr, "%s\n", stack.status().ToString().c_str()), 1;
  absl::StatusOr<std::vector<nlohmann::json>> runs = RunDelays(**hosts, **stack);
  if (!runs.ok()) return std::fprintf(stderr, "%s\n", runs.status().ToString().c_str()), 1;
  for (const nlohmann::json& j : *runs) std::printf("%s\n", j.dump().c_str());
  PrintTable(*runs);
  std::printf("%s\n", Summary(*runs).dump().c_str());
  return 0;
}

}  // namespace
}  // namespace mmserve::testing

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return mmserve::testing::Run();
}
