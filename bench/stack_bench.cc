// stack_bench: the demo workload through the whole stack (router, encoder and
// language as separate processes over gRPC and UCX shm) against the
// in-process engine, measured in the same run:
//   - end-to-end latency p50/p99 at concurrency 1 (each request alone),
//   - throughput at concurrency 16,
//   - the stack's resumes, encoder cache hit rate and router overhead.
// Last line JSON with p50_latency_ratio (stack / in-process at concurrency 1,
// target <= 1.25) and throughput_ratio_c16 (stack / in-process, target >= 0.85).
//
//   bazel run --config=opt //bench:stack_bench [-- --sequential=200]
#include <algorithm>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "common/clock.h"
#include "common/grpc_server.h"
#include "common/logging.h"
#include "model/image_decode.h"
#include "tests/stack_harness.h"
#include "worker/engine.h"

ABSL_FLAG(int, sequential, 200, "requests at concurrency 1");
ABSL_FLAG(int, concurrent, 1500, "requests at concurrency 16");
ABSL_FLAG(int, concurrency, 16, "in-flight requests of the throughput run");
ABSL_FLAG(int, encoder_cache_mb, 256,
          "the encoder's embedding cache (0: off, to compare without its help: the in-process "
          "engine has none)");

namespace mmserve::testing {
namespace {

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * (v.size() - 1) + 0.5))];
}

std::unique_ptr<worker::LlmEngine> MakeEngine() {
  worker::EngineOptions o;
  o.model_dir = DemoModelDir();
  o.max_num_seqs = 64;
  o.max_num_batched_tokens = 2048;
  o.kv_cache_bytes = 64ll << 20;
  auto e = worker::LlmEngine::Create(o);
  CHECK_OK(e.status());
  return std::move(*e);
}

worker::EngineRequest InProcessRequest(const DemoSet& set, size_t i) {
  const DemoItem& item = set.items[i];
  worker::EngineRequest req;
  req.id = absl::StrFormat("q%d", i);
  req.prompt = item.prompt;
  // Decoding is part of the work, as it is in the encoder.
  req.images.push_back(
      model::DecodeImage(set.images.at(item.image_file), model::DecodeLimits()).value());
  req.sampling.temperature = 0;
  req.sampling.max_tokens = 8;
  return req;
}

// In-process: requests [begin, end) each alone; seconds per request.
std::vector<double> InProcessSequential(worker::LlmEngine& e, const DemoSet& set, int begin,
                                        int end) {
  std::vector<double> lat;
  for (int i = begin; i < end; ++i) {
    Stopwatch clock;
    CHECK_OK(e.AddRequest(InProcessRequest(set, i), [](const worker::StreamEvent&) {}));
    while (e.has_unfinished()) CHECK_OK(e.Step());
    lat.push_back(clock.ElapsedSeconds());
  }
  return lat;
}

// In-process: `concurrency` requests in flight; requests per second.
double InProcessThroughput(worker::LlmEngine& e, const DemoSet& set, int n, int concurrency) {
  Stopwatch clock;
  int next = 0, finished = 0, live = 0;
  while (finished < n) {
    while (live < concurrency && next < n) {
      CHECK_OK(e.AddRequest(InProcessRequest(set, next++),
                            [&finished, &live](const worker::StreamEvent& ev) {
                              if (ev.finish_reason != worker::FinishReason::kNone) {
                                ++finished;
                                --live;
                              }
                            }));
      ++live;
    }
    CHECK_OK(e.Step());
  }
  return n / clock.ElapsedSeconds();
}

int Main() {
  const DemoSet& set = Demo();
  const int seq = std::min<int>(absl::GetFlag(FLAGS_sequential), set.items.size());
  const int conc_n = std::min<int>(absl::GetFlag(FLAGS_concurrent), set.items.size());
  const int conc = absl::GetFlag(FLAGS_concurrency);

  launcher::StackOptions o = TestStackOptions(1, "shm");
  o.language_args = {"--kv_cache_mb=64"};
  o.encoder_args = {absl::StrFormat("--cache_mb=%d", absl::GetFlag(FLAGS_encoder_cache_mb))};
  o.log_dir = "/tmp";
  auto stack = launcher::LocalStack::Start(o);
  CHECK_OK(stack.status());
  auto stub = mmserve::v1::Inference::NewStub(InternalChannel((*stack)->router_address()));
  auto engine = MakeEngine();

  // Warm both (first calls pay connections and page faults).
  for (int i = 0; i < 8; ++i) AskGrpc(*stub, DemoRequest(set, set.items[i], {}), {});
  InProcessSequential(*engine, set, 0, 8);

  // Concurrency 1, interleaved in blocks of 20 so that machine noise hits both.
  std::vector<double> stack_lat, local_lat;
  for (int start = 0; start < seq; start += 20) {
    const int end = std::min(seq, start + 20);
    for (int i = start; i < end; ++i) {
      Stopwatch clock;
      Answer a = AskGrpc(*stub, DemoRequest(set, set.items[i], {}), {});
      CHECK_OK(a.status);
      stack_lat.push_back(clock.ElapsedSeconds());
    }
    std::vector<double> l = InProcessSequential(*engine, set, start, end);
    local_lat.insert(local_lat.end(), l.begin(), l.end());
  }
  // Concurrency 16.
  Stopwatch clock;
  ParallelFor(conc_n, conc, [&](int i) {
    CHECK_OK(AskGrpc(*stub, DemoRequest(set, set.items[i], {}), {}).status);
  });
  const double stack_rps = conc_n / clock.ElapsedSeconds();
  const double local_rps = InProcessThroughput(*engine, set, conc_n, conc);

  launcher::LocalStack& s = **stack;
  const int ep = s.encoder(0).metrics_port();
  const double hits = ScrapeMetric(ep, "mmserve_encoder_cache_hits_total");
  const double misses = ScrapeMetric(ep, "mmserve_encoder_cache_misses_total");
  const double resumes =
      ScrapeMetric(s.language().metrics_port(), "mmserve_language_resumes_total");
  const int rp = s.router().metrics_port();
  const double oh_sum = ScrapeMetric(rp, "mmserve_router_overhead_seconds_sum");
  const double oh_n = ScrapeMetric(rp, "mmserve_router_overhead_seconds_count");
  s.Stop();

  const double sp50 = Percentile(stack_lat, 0.5), sp99 = Percentile(stack_lat, 0.99);
  const double lp50 = Percentile(local_lat, 0.5), lp99 = Percentile(local_lat, 0.99);
  std::printf("%-34s %12s %12s %8s\n", "", "stack", "in-process", "ratio");
  std::printf("%-34s %10.2f ms %10.2f ms %8.3f\n", "latency p50 (concurrency 1)", sp50 * 1e3,
              lp50 * 1e3, sp50 / lp50);
  std::printf("%-34s %10.2f ms %10.2f ms %8.3f\n", "latency p99 (concurrency 1)", sp99 * 1e3,
              lp99 * 1e3, sp99 / lp99);
  std::printf("%-34s %8.1f req/s %7.1f req/s %8.3f\n",
              absl::StrFormat("throughput (concurrency %d)", conc).c_str(), stack_rps, local_rps,
              stack_rps / local_rps);
  std::printf("encoder cache hit rate %.3f, resumes %.0f, router pre-dispatch mean %.3f ms\n",
              hits / std::max(1.0, hits + misses), resumes, oh_sum / std::max(1.0, oh_n) * 1e3);
  std::printf(
      "{\"bench\":\"stack\",\"model\":\"shapes-demo\",\"profile\":\"shm\",\"sequential\":%d,"
      "\"concurrent\":%d,\"concurrency\":%d,\"encoder_cache_mb\":%d,\"stack_p50_ms\":%.3f,\"stack_"
      "p99_ms\":%.3f,"
      "\"inproc_p50_ms\":%.3f,\"inproc_p99_ms\":%.3f,\"p50_latency_ratio\":%.3f,"
      "\"p99_latency_ratio\":%.3f,\"stack_rps_c16\":%.2f,\"inproc_rps_c16\":%.2f,"
      "\"throughput_ratio_c16\":%.3f,\"cache_hit_rate\":%.3f,\"resumes\":%.0f,"
      "\"router_overhead_mean_ms\":%.4f}\n",
      seq, conc_n, conc, absl::GetFlag(FLAGS_encoder_cache_mb), sp50 * 1e3, sp99 * 1e3, lp50 * 1e3,
      lp99 * 1e3, sp50 / lp50, sp99 / lp99, stack_rps, local_rps, stack_rps / local_rps,
      hits / std::max(1.0, hits + misses), resumes, oh_sum / std::max(1.0, oh_n) * 1e3);
  return 0;
}

}  // namespace
}  // namespace mmserve::testing

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return mmserve::testing::Main();
}
