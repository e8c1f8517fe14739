#include "bench/loadgen/stats.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace mmserve::loadgen {

Percentiles ComputePercentiles(std::vector<double> v) {
  Percentiles p;
  p.n = static_cast<int>(v.size());
  if (v.empty()) return p;
  std::sort(v.begin(), v.end());
  double sum = 0;
  for (double x : v) sum += x;
  p.mean = sum / v.size();
  // Nearest rank.
  auto at = [&v](double q) {
    return v[std::min(v.size() - 1, static_cast<size_t>(q * (v.size() - 1) + 0.5))];
  };
  p.p50 = at(0.5);
  p.p90 = at(0.9);
  p.p99 = at(0.99);
  return p;
}

Summary Summarize(const std::vector<Record>& records, const Slo& slo) {
  Summary s;
  s.requests = static_cast<int>(records.size());
  std::vector<double> ttft, tpot, itl, e2e, encode;
  double first = 1e300, last = 0;
  int good = 0;
  for (const Record& r : records) {
    first = std::min(first, r.sent_s);
    last = std::max(last, r.end_s);
    if (!r.status.ok()) {
      ++s.errors_by_code[absl::StatusCodeToString(r.status.code())];
      continue;
    }
    ++s.ok;
    s.output_tokens += r.output_tokens;
    s.sink_bytes += r.sink_bytes;
    e2e.push_back((r.end_s - r.sent_s) * 1e3);
    if (r.encoded_s >= 0) encode.push_back((r.encoded_s - r.sent_s) * 1e3);
    if (r.first_token_s < 0) continue;
    const double t = (r.first_token_s - r.sent_s) * 1e3;
    ttft.push_back(t);
    double per_token = 0;
    if (r.output_tokens > 1) {
      per_token = (r.end_s - r.first_token_s) * 1e3 / (r.output_tokens - 1);
      tpot.push_back(per_token);
    }
    for (size_t i = 1; i < r.token_s.size(); ++i) {
      itl.push_back((r.token_s[i] - r.token_s[i - 1]) * 1e3);
    }
    const double ttft_bound = std::max(slo.ttft_ms, slo.ttft_ms_per_prompt_token * r.prompt_tokens);
    if (t <= ttft_bound && per_token <= slo.tpot_ms) ++good;
  }
  s.duration_s = records.empty() ? 0 : std::max(1e-9, last - first);
  if (!records.empty()) {
    s.request_rate = s.ok / s.duration_s;
    s.output_token_rate = s.output_tokens / s.duration_s;
    s.goodput = good / s.duration_s;
    s.slo_attainment = static_cast<double>(good) / s.requests;
    s.sink_bytes_per_s = s.sink_bytes / s.duration_s;
  }
  s.encode_ms = ComputePercentiles(encode);
  s.ttft_ms = ComputePercentiles(ttft);
  s.tpot_ms = ComputePercentiles(tpot);
  s.itl_ms = ComputePercentiles(itl);
  s.e2e_ms = ComputePercentiles(e2e);
  return s;
}

std::string FormatTable(const Summary& s, const Slo& slo) {
  std::string out;
  absl::StrAppendFormat(&out, "%-28s %d (%d ok)\n", "requests", s.requests, s.ok);
  for (const auto& [code, n] : s.errors_by_code) {
    absl::StrAppendFormat(&out, "%-28s %d\n", absl::StrCat("errors ", code), n);
  }
  absl::StrAppendFormat(&out, "%-28s %.2f s\n", "duration", s.duration_s);
  absl::StrAppendFormat(&out, "%-28s %.2f req/s\n", "request throughput", s.request_rate);
  // The encoder target generates no tokens: its rows are Encode and E2E.
  const bool encoder = s.encode_ms.n > 0;
  if (!encoder) {
    absl::StrAppendFormat(&out, "%-28s %.1f tok/s\n", "output token throughput",
                          s.output_token_rate);
    absl::StrAppendFormat(&out, "%-28s %.2f req/s (TTFT <= %.0f ms, TPOT <= %.0f ms)\n", "goodput",
                          s.goodput, slo.ttft_ms, slo.tpot_ms);
  } else {
    absl::StrAppendFormat(&out, "%-28s %.2f MB/s (%.1f MB)\n", "sink received",
                          s.sink_bytes_per_s / 1e6, s.sink_bytes / 1e6);
  }
  absl::StrAppendFormat(&out, "%-10s %10s %10s %10s %10s %8s\n", "ms", "mean", "p50", "p90", "p99",
                        "n");
  for (const auto& [name, p] :
       {std::pair{"Encode", &s.encode_ms}, std::pair{"TTFT", &s.ttft_ms},
        std::pair{"TPOT", &s.tpot_ms}, std::pair{"ITL", &s.itl_ms}, std::pair{"E2E", &s.e2e_ms}}) {
    if (p == &s.encode_ms ? !encoder : encoder && p != &s.e2e_ms) continue;
    absl::StrAppendFormat(&out, "%-10s %10.2f %10.2f %10.2f %10.2f %8d\n", name, p->mean, p->p50,
                          p->p90, p->p99, p->n);
  }
  return out;
}

std::string FormatJson(const Summary& s, const Slo& slo,
                       const std::vector<std::pair<std::string, std::string>>& extra) {
  nlohmann::ordered_json j;
  j["bench"] = "loadgen";
  for (const auto& [k, v] : extra) j[k] = nlohmann::json::parse(v);
  j["requests"] = s.requests;
  j["ok"] = s.ok;
  nlohmann::ordered_json errors = nlohmann::ordered_json::object();
  for (const auto& [code, n] : s.errors_by_code) errors[code] = n;
  j["errors"] = errors;
  j["duration_s"] = s.duration_s;
  j["request_throughput"] = s.request_rate;
  j["output_token_throughput"] = s.output_token_rate;
  j["slo_ttft_ms"] = slo.ttft_ms;
  j["slo_tpot_ms"] = slo.tpot_ms;
  if (slo.ttft_ms_per_prompt_token > 0) {
    j["slo_ttft_ms_per_prompt_token"] = slo.ttft_ms_per_prompt_token;
  }
  j["goodput"] = s.goodput;
  j["slo_attainment"] = s.slo_attainment;
  for (const auto& [name, p] : {std::pair{"ttft", &s.ttft_ms}, std::pair{"tpot", &s.tpot_ms},
                                std::pair{"itl", &s.itl_ms}, std::pair{"e2e", &s.e2e_ms}}) {
    j[absl::StrCat(name, "_mean_ms")] = p->mean;
    j[absl::StrCat(name, "_p50_ms")] = p->p50;
    j[absl::StrCat(name, "_p90_ms")] = p->p90;
    j[absl::StrCat(name, "_p99_ms")] = p->p99;
  }
  if (s.encode_ms.n > 0) {
    j["encode_mean_ms"] = s.encode_ms.mean;
    j["encode_p50_ms"] = s.encode_ms.p50;
    j["encode_p90_ms"] = s.encode_ms.p90;
    j["encode_p99_ms"] = s.encode_ms.p99;
    j["sink_bytes"] = s.sink_bytes;
    j["sink_bytes_per_s"] = s.sink_bytes_per_s;
  }
  return j.dump();
}

}  // namespace mmserve::loadgen
