// Summaries of hand-made records: percentiles, TTFT/TPOT/ITL from token
// arrival times, errors by code, goodput under the SLO.
#include "bench/loadgen/stats.h"

#include <catch2/catch.hpp>
#include <map>
#include <nlohmann/json.hpp>
#include <vector>

#include "absl/strings/str_split.h"
#include "bench/loadgen/workload.h"

namespace mmserve::loadgen {
namespace {

Record Finished(double sent, std::vector<double> tokens, double end) {
  Record r;
  r.sent_s = sent;
  r.first_token_s = tokens.front();
  r.token_s = tokens;
  r.output_tokens = static_cast<int>(tokens.size());
  r.end_s = end;
  return r;
}

TEST_CASE("percentiles use the nearest rank; empty input gives zeros") {
  std::vector<double> v;
  for (int i = 1; i <= 100; ++i) v.push_back(i);
  const Percentiles p = ComputePercentiles(v);
  CHECK(p.n == 100);
  CHECK(p.mean == Approx(50.5));
  CHECK(p.p50 == 51);  // rank round(0.5 * 99) = 50 -> value 51
  CHECK(p.p90 == 90);
  CHECK(p.p99 == 99);
  const Percentiles e = ComputePercentiles({});
  CHECK(e.n == 0);
  CHECK(e.p99 == 0);
}

TEST_CASE("TTFT, TPOT, ITL and E2E come from the token arrival times") {
  // Sent at 0, tokens at 0.1, 0.12, 0.16, done at 0.2.
  const Summary s = Summarize({Finished(0, {0.1, 0.12, 0.16}, 0.2)}, {});
  CHECK(s.ok == 1);
  CHECK(s.ttft_ms.p50 == Approx(100));
  CHECK(s.tpot_ms.p50 == Approx(50));  // (E2E 0.2 - TTFT 0.1) / 2
  CHECK(s.itl_ms.n == 2);
  CHECK(s.itl_ms.p90 == Approx(40));
  CHECK(s.e2e_ms.p50 == Approx(200));
  CHECK(s.output_tokens == 3);
}

TEST_CASE("a TTFT SLO per prompt token scales the bound; attainment counts all requests") {
  // TTFT 100 ms each, TPOT 20 ms: prompts of 10, 100 and 1000 tokens under
  // max(50 ms, 0.5 ms x prompt) -> bounds 50, 50 and 500 ms.
  std::vector<Record> rs;
  for (int prompt : {10, 100, 1000}) {
    rs.push_back(Finished(0, {0.1, 0.12}, 0.12));
    rs.back().prompt_tokens = prompt;
  }
  Record failed;
  failed.status = absl::UnavailableError("down");
  rs.push_back(failed);
  const Slo slo{.ttft_ms = 50, .tpot_ms = 30, .ttft_ms_per_prompt_token = 0.5};
  const Summary s = Summarize(rs, slo);
  CHECK(s.slo_attainment == Approx(0.25));  // only the 1000-token prompt
  CHECK(s.goodput == Approx(1 / 0.12));
  const auto j = nlohmann::json::parse(FormatJson(s, slo, {}));
  CHECK(j["slo_ttft_ms_per_prompt_token"] == 0.5);
  CHECK(j["slo_attainment"] == Approx(0.25));
  // Without the per-token term the fixed bound holds for every prompt.
  CHECK(Summarize(rs, {.ttft_ms = 150, .tpot_ms = 30}).slo_attainment == Approx(0.75));
  CHECK(nlohmann::json::parse(FormatJson(s, {}, {})).count("slo_ttft_ms_per_prompt_token") == 0);
}

TEST_CASE("errors are counted by code and excluded from latencies and goodput") {
  Record bad;
  bad.sent_s = 0.5;
  bad.end_s = 2.0;
  bad.status = absl::UnavailableError("gone");
  Record late = Finished(0, {0.9, 1.0}, 1.0);  // TTFT 900 ms
  const Summary s =
      Summarize({Finished(0, {0.1, 0.15}, 0.2), late, bad}, {.ttft_ms = 500, .tpot_ms = 100});
  CHECK(s.requests == 3);
  CHECK(s.ok == 2);
  CHECK(s.errors_by_code.at("UNAVAILABLE") == 1);
  CHECK(s.duration_s == Approx(2.0));
  CHECK(s.request_rate == Approx(1.0));
  CHECK(s.goodput == Approx(0.5));  // only the first meets TTFT <= 500 ms
  CHECK(s.e2e_ms.n == 2);
}

TEST_CASE("the JSON line holds the extras first and every percentile") {
  const Summary s = Summarize({Finished(0, {0.1, 0.2}, 0.3)}, {});
  const auto j = nlohmann::json::parse(FormatJson(s, {}, {{"target", "\"router\""}}));
  CHECK(j["bench"] == "loadgen");
  CHECK(j["target"] == "router");
  CHECK(j["ok"] == 1);
  CHECK(j["errors"].empty());
  CHECK(j["ttft_p99_ms"].get<double>() == Approx(100));
  CHECK(j["tpot_p50_ms"].get<double>() == Approx(200));  // (0.3 - 0.1) / 1
}

TEST_CASE("encoder records: Encode latency and the sink's bytes per second") {
  Record a;  // Encode returned at 40 ms, embeddings in at 50 ms
  a.sent_s = 0;
  a.encoded_s = 0.04;
  a.end_s = 0.05;
  a.sink_bytes = 1000;
  Record b = a;
  b.sent_s = 1.0;
  b.encoded_s = 1.02;
  b.end_s = 2.0;
  Record failed = a;
  failed.status = absl::InvalidArgumentError("not an image");
  const Summary s = Summarize({a, b, failed}, {});
  CHECK(s.ok == 2);
  CHECK(s.encode_ms.n == 2);
  CHECK(s.encode_ms.p99 == Approx(40));
  CHECK(s.encode_ms.mean == Approx(30));
  CHECK(s.e2e_ms.p99 == Approx(1000));
  CHECK(s.sink_bytes == 2000);  // the failed request's bytes are not counted
  CHECK(s.sink_bytes_per_s == Approx(1000));
  const auto j = nlohmann::json::parse(FormatJson(s, {}, {}));
  CHECK(j["encode_p50_ms"].get<double>() == Approx(40));  // nearest rank of {20, 40}
  CHECK(j["sink_bytes_per_s"].get<double>() == Approx(1000));
  CHECK(FormatTable(s, {}).find("Encode") != std::string::npos);
  CHECK(FormatTable(s, {}).find("TTFT") == std::string::npos);  // no tokens here
  // Other targets' lines carry no encoder keys.
  const auto plain =
      nlohmann::json::parse(FormatJson(Summarize({Finished(0, {0.1}, 0.2)}, {}), {}, {}));
  CHECK(!plain.contains("encode_p50_ms"));
}

TEST_CASE("a prompt length mix draws each entry about equally, the words as drawn") {
  WorkloadSpec spec;
  spec.dataset = "synthetic";
  spec.images = 0;
  spec.num_requests = 300;
  spec.prompt_tokens_mix = {4, 40, 400};
  auto w = BuildWorkload(spec);
  REQUIRE(w.ok());
  std::map<int, int> count;
  for (const WorkItem& item : w->items) {
    ++count[item.prompt_tokens];
    CHECK(std::vector<std::string>(absl::StrSplit(item.text, ' ')).size() ==
          static_cast<size_t>(item.prompt_tokens));
  }
  REQUIRE(count.size() == 3);
  for (int n : {4, 40, 400}) {
    CHECK(count[n] > 60);  // 100 expected each
    CHECK(count[n] < 140);
  }
  // Without a mix every prompt has prompt_tokens words; a bad entry is refused.
  spec.prompt_tokens_mix.clear();
  spec.prompt_tokens = 7;
  auto fixed = BuildWorkload(spec);
  REQUIRE(fixed.ok());
  for (const WorkItem& item : fixed->items) CHECK(item.prompt_tokens == 7);
  spec.prompt_tokens_mix = {8, 0};
  CHECK(BuildWorkload(spec).status().code() == absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace mmserve::loadgen
