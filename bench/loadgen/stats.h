// What one load run measured: per-request timings as the client saw them,
// and their summary in the terms of `vllm bench serve`.
//
//   TTFT: request sent -> first generated token arrives;
//   TPOT: (E2E - TTFT) / (output tokens - 1), per request;
//   ITL:  gaps between consecutive token-carrying responses, all requests;
//   E2E:  request sent -> stream finished (encoder target: Encode returned
//         and every image's embeddings landed in the sink);
//   Encode: request sent -> the Encode call returned (encoder target);
//   sink bytes/s: embedding bytes the encoder target's sink received, over
//         the run's duration;
//   goodput: requests per second that finished OK with TTFT <= slo_ttft and
//            TPOT <= slo_tpot; with slo_ttft_per_prompt_token > 0 the TTFT
//            bound of a request of P prompt tokens is
//            max(slo_ttft, slo_ttft_per_prompt_token * P) instead;
//   SLO attainment: the share of all requests that met the SLO.
//
// Not thread-safe: the runner fills one Record per request on the thread that
// finishes it and hands them over when the run is done.
#ifndef MMSERVE_BENCH_LOADGEN_STATS_H_
#define MMSERVE_BENCH_LOADGEN_STATS_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace mmserve::loadgen {

struct Record {
  int item = 0;
  double sent_s = 0;          // since the run's start
  double first_token_s = -1;  // -1: no token arrived
  double end_s = 0;
  std::vector<double> token_s;  // arrival of each token-carrying response
  int output_tokens = 0;
  // The request's prompt tokens (synthetic items; 0: unknown).
  int prompt_tokens = 0;
  // The final response's usage (gRPC targets; -1: none came): the prompt's
  // tokens and those of them found in the KV cache.
  int usage_prompt_tokens = -1;
  int usage_cached_prompt_tokens = -1;
  absl::Status status;
  std::string text;
  std::vector<int32_t> token_ids;
  // The encoder target's: the Encode call returned (-1: not, or another
  // target); embedding bytes received into the sink.
  double encoded_s = -1;
  int64_t sink_bytes = 0;
};

struct Slo {
  double ttft_ms = 1000;
  double tpot_ms = 100;
  // > 0: the TTFT bound scales with the prompt (see above).
  double ttft_ms_per_prompt_token = 0;
};

struct Percentiles {
  double mean = 0, p50 = 0, p90 = 0, p99 = 0;
  int n = 0;
};

struct Summary {
  int requests = 0;
  int ok = 0;
  std::map<std::string, int> errors_by_code;  // gRPC code name -> count
  double duration_s = 0;                      // first send -> last end
  double request_rate = 0;                    // completed OK per second
  double output_token_rate = 0;
  double goodput = 0;         // per second
  double slo_attainment = 0;  // [0, 1]
  int64_t output_tokens = 0;
  Percentiles ttft_ms, tpot_ms, itl_ms, e2e_ms;
  // Encoder target only (encode_ms.n == 0 otherwise).
  Percentiles encode_ms;
  int64_t sink_bytes = 0;
  double sink_bytes_per_s = 0;
};

Percentiles ComputePercentiles(std::vector<double> values);
Summary Summarize(const std::vector<Record>& records, const Slo& slo);

// The human table, and the one-line JSON (no newline) with `extra` fields
// (already JSON-encoded values) in front.
std::string FormatTable(const Summary& s, const Slo& slo);
std::string FormatJson(const Summary& s, const Slo& slo,
                       const std::vector<std::pair<std::string, std::string>>& extra);

}  // namespace mmserve::loadgen

#endif  // MMSERVE_BENCH_LOADGEN_STATS_H_
