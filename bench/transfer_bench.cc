// transfer_bench: embeddings through the full default-then-resume protocol
// (init, chunk write, flush/sends, notice, CRC32C verification) between this
// process (receiver) and a transfer_peer child (sender), per profile, for
// 1024 and 4096 tokens x 3584 hidden x bf16. Baseline: the best of
// ucx_perftest tag_bw and ucp_put_bw for the same size, UCX_TLS and endpoint
// error mode (tcp: peer error handling, perftest -e), run in the same
// invocation; for tcp also tag_bw without error handling (perftest_no_err_gbps,
// ratio_no_err), which measures 0-40% faster here. Prints a table, then one
// JSON line.
//
// GB/s is streaming bandwidth: image bytes over the wall time of the timed
// transfers, with --window receives in flight (as perftest's bandwidth tests
// keep operations outstanding); p50/p99 are per-image latencies from Receive
// to the verified image. --window=1 gives one-at-a-time figures. The sender
// writes (and checksums) each payload once and republishes it, as an encoder
// computes the checksum while it writes the embedding; the receiver verifies
// every chunk inside the timed window.
#include <algorithm>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/clock.h"
#include "common/logging.h"
#include "transfer/peer_process.h"
#include "transfer/test_payload.h"
#include "transfer/transfer_engine.h"

ABSL_FLAG(int, iterations, 30, "timed transfers per size");
ABSL_FLAG(int, warmup, 3, "untimed transfers per size");
ABSL_FLAG(int, window, 1,
          "receives in flight at once (ucx_perftest's bandwidth tests keep several "
          "operations outstanding too); 1 measures one transfer at a time");
ABSL_FLAG(std::string, profiles, "shm,tcp", "profiles to run");
ABSL_FLAG(std::string, tokens, "1024,4096", "image lengths");
ABSL_FLAG(uint32_t, hidden, 3584, "hidden size (bf16)");
ABSL_FLAG(std::string, data_path, "", "put or tag on both ends (default: the profile's)");
ABSL_FLAG(std::string, perftest, "/usr/bin/ucx_perftest", "ucx_perftest binary");

namespace mmserve::transfer {
namespace {

constexpr uint32_t kBlockSize = 128;

struct Result {
  std::string profile;
  std::string data_path;
  uint32_t tokens = 0;
  size_t bytes = 0;
  double gbps = 0, p50_ms = 0, p99_ms = 0;
  double perftest_gbps = 0;
  std::string perftest_test;
  // tcp: tag_bw without peer error handling (faster, not the profile's setup).
  double perftest_no_err_gbps = 0;
  bool bytes_ok = false;
};

// ucx_perftest server + client on loopback; overall bandwidth in GB/s, 0 on
// failure. `peer_errors` creates the endpoints with peer error handling (-e),
// as the tcp profile does.
double Perftest(TransportProfile profile, const std::string& test, size_t size, int iterations,
                bool peer_errors) {
  static int port = 20000 + (getpid() % 5000);
  ++port;
  const std::string tls = std::string("UCX_TLS=") + TransportProfileTls(profile);
  const std::string bin = absl::GetFlag(FLAGS_perftest);
  auto server = PeerProcess::Spawn("/usr/bin/env", {tls, bin, "-p", std::to_string(port)});
  if (!server.ok()) return 0;
  for (int attempt = 0; attempt < 20; ++attempt) {
    absl::SleepFor(absl::Milliseconds(200));
    std::vector<std::string> args = {tls,  bin,
                                     "-p", std::to_string(port),
                                     "-t", test,
                                     "-s", std::to_string(size),
                                     "-n", std::to_string(iterations),
                                     "-w", "2"};
    if (peer_errors) args.push_back("-e");
    args.push_back("localhost");
    auto client = PeerProcess::Spawn("/usr/bin/env", args);
    if (!client.ok()) return 0;
    Deadline d = Deadline::After(absl::Seconds(120));
    while (auto line = (*client)->ReadLine(d)) {
      std::vector<std::string> f = absl::StrSplit(*line, ' ', absl::SkipWhitespace());
      double mbps = 0;
      if (f.size() >= 7 && f[0] == "Final:" && absl::SimpleAtod(f[6], &mbps)) {
        return mbps * 1048576.0 / 1e9;  // perftest's MB is 2^20 bytes
      }
    }
    if ((*client)->Wait(Deadline::After(absl::Seconds(1))) == 0) break;  // ran, no result
  }
  return 0;
}

bool SameBytes(const ReceivedImage& image, const EmbeddingLayout& layout, const PayloadSpec& spec) {
  for (int s = 0; s < kNumSections; ++s) {
    if (image.Section(s) != ExpectedSection(layout, spec, s)) return false;
  }
  return true;
}

double Percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  size_t i = std::min(v.size() - 1, static_cast<size_t>(p * (v.size() - 1) + 0.5));
  return v[i];
}

Result RunProtocol(TransportProfile profile, uint32_t tokens) {
  const uint32_t hidden = absl::GetFlag(FLAGS_hidden);
  const int warmup = absl::GetFlag(FLAGS_warmup);
  const int iterations = absl::GetFlag(FLAGS_iterations);
  const int window = std::max(1, absl::GetFlag(FLAGS_window));
  // Room for `window` images in flight on each side, plus the last image,
  // held until its bytes are checked.
  const uint32_t num_blocks = (window + 1) * ((tokens + kBlockSize - 1) / kBlockSize);
  auto engine = TransferEngine::Create(
      {.instance_id = "bench-lang",
       .profile = profile,
       .layout = {.block_size = kBlockSize, .num_blocks = num_blocks, .hidden_size = hidden},
       .default_num_blocks = 8,
       .data_path = ParseDataPath(absl::GetFlag(FLAGS_data_path))});
  CHECK(engine.ok()) << engine.status();
  auto child = PeerProcess::Spawn(
      PeerBinaryPath(),
      {"--role=sender", std::string("--profile=") + TransportProfileName(profile),
       "--hidden=" + std::to_string(hidden), "--block_size=" + std::to_string(kBlockSize),
       "--num_blocks=" + std::to_string(num_blocks), "--tokens=" + std::to_string(tokens),
       "--repeat=" + std::to_string(warmup + iterations), "--window=" + std::to_string(window),
       "--reuse_payload", "--timeout_ms=60000", "--seed=42",
       "--data_path=" + absl::GetFlag(FLAGS_data_path)});
  CHECK(child.ok()) << child.status();
  Deadline d = Deadline::After(absl::Seconds(60));
  auto info = (*child)->ReadLine(d);
  CHECK(info && info->rfind("INFO ", 0) == 0);
  v1::ConnectRequest peer;
  CHECK(peer.ParseFromString(FromHex(info->substr(5))));
  CHECK_OK((*engine)->Connect(peer));
  (*child)->WriteLine("PEER " + ToHex((*engine)->local_info().SerializeAsString()));
  CHECK((*child)->ReadLine(d) == std::optional<std::string>("READY"));

  Result r;
  r.profile = TransportProfileName(profile);
  r.data_path = DataPathName((*engine)->data_path());
  r.tokens = tokens;
  r.bytes = size_t{tokens} * (*engine)->buffer().layout().BytesPerToken();
  const PayloadSpec spec{.seed = 42, .total_tokens = tokens};
  const int total = warmup + iterations;
  // Up to `window` receives in flight; each completion records its latency,
  // spot-checks the first and last image byte for byte, and frees its blocks.
  absl::Mutex mu;
  int in_flight = 0, finished = 0;
  bool bytes_ok = true;
  std::optional<ReceivedImage> last;
  std::vector<double> ms;
  Stopwatch wall;
  double timed_start_s = 0;
  for (int k = 0; k < total; ++k) {
    {
      absl::MutexLock lock(&mu);
      auto room = [&] { return in_flight < window; };
      mu.Await(absl::Condition(&room));
      if (k == warmup) {
        // Timing starts once the warm-up transfers have drained.
        auto drained = [&] { return in_flight == 0; };
        mu.Await(absl::Condition(&drained));
        timed_start_s = wall.ElapsedSeconds();
      }
      ++in_flight;
    }
    auto watch = std::make_shared<Stopwatch>();
    (*engine)->Receive({.request_id = "req-" + std::to_string(k),
                        .sender = "sender",
                        .known_tokens = tokens,
                        .timeout = absl::Seconds(60)},
                       [&, k, watch](absl::StatusOr<ReceivedImage> image) {
                         const double s = watch->ElapsedSeconds();
                         CHECK(image.ok()) << image.status();
                         bool ok = true;
                         std::optional<ReceivedImage> keep;
                         if (k == 0) {  // byte-for-byte spot check (a warm-up transfer)
                           ok = SameBytes(*image, (*engine)->buffer().layout(), spec);
                         } else if (k == total - 1) {
                           keep = *std::move(image);  // checked after the clock stops
                         }
                         if (!keep) image->Release();
                         absl::MutexLock lock(&mu);
                         bytes_ok = bytes_ok && ok;
                         if (keep) last = std::move(keep);
                         if (k >= warmup) ms.push_back(s * 1e3);
                         --in_flight;
                         ++finished;
                       });
  }
  {
    absl::MutexLock lock(&mu);
    auto all = [&] { return finished == total; };
    mu.Await(absl::Condition(&all));
  }
  const double timed_s = wall.ElapsedSeconds() - timed_start_s;
  if (last) {
    bytes_ok = bytes_ok && SameBytes(*last, (*engine)->buffer().layout(), spec);
    last->Release();
  }
  r.bytes_ok = bytes_ok;
  (*child)->WriteLine("EXIT");
  (*child)->Wait(Deadline::After(absl::Seconds(10)));
  r.gbps = r.bytes * iterations / timed_s / 1e9;
  r.p50_ms = Percentile(ms, 0.5);
  r.p99_ms = Percentile(ms, 0.99);
  return r;
}

int Main() {
  std::vector<Result> results;
  for (absl::string_view name : absl::StrSplit(absl::GetFlag(FLAGS_profiles), ',')) {
    absl::StatusOr<TransportProfile> profile = ParseTransportProfile(name);
    CHECK(profile.ok()) << profile.status();
    for (absl::string_view t : absl::StrSplit(absl::GetFlag(FLAGS_tokens), ',')) {
      uint32_t tokens = 0;
      CHECK(absl::SimpleAtoi(t, &tokens));
      Result r = RunProtocol(*profile, tokens);
      // Baseline for the same message size, transports and endpoint error
      // mode as the profile, best of two tests.
      const int n = std::max(5, absl::GetFlag(FLAGS_iterations));
      const bool tcp = *profile == TransportProfile::kTcp;
      double tag = Perftest(*profile, "tag_bw", r.bytes, n, /*peer_errors=*/tcp);
      // Emulated puts over tcp crawl: a few iterations tell the story.
      double put = Perftest(*profile, "ucp_put_bw", r.bytes, tcp ? 3 : n, /*peer_errors=*/tcp);
      r.perftest_gbps = std::max(tag, put);
      r.perftest_test = tag >= put ? "tag_bw" : "ucp_put_bw";
      if (tcp) r.perftest_no_err_gbps = Perftest(*profile, "tag_bw", r.bytes, n, false);
      fprintf(stderr,
              "%s %u tokens: protocol %.2f GB/s, tag_bw %.2f, ucp_put_bw %.2f, tag_bw without "
              "peer error handling %.2f\n",
              r.profile.c_str(), tokens, r.gbps, tag, put, r.perftest_no_err_gbps);
      results.push_back(r);
    }
  }

  printf("%-5s %-4s %7s %10s %8s %8s %8s %13s %11s %6s %5s\n", "prof", "path", "tokens", "bytes",
         "GB/s", "p50 ms", "p99 ms", "perftest GB/s", "perftest", "ratio", "bytes");
  for (const Result& r : results) {
    printf("%-5s %-4s %7u %10zu %8.2f %8.2f %8.2f %13.2f %11s %6.2f %5s\n", r.profile.c_str(),
           r.data_path.c_str(), r.tokens, r.bytes, r.gbps, r.p50_ms, r.p99_ms, r.perftest_gbps,
           r.perftest_test.c_str(), r.perftest_gbps > 0 ? r.gbps / r.perftest_gbps : 0,
           r.bytes_ok ? "ok" : "BAD");
  }
  // JSON: per profile, the headline numbers are the largest size's; every
  // size is listed under "sizes".
  std::string json =
      "{\"bench\":\"transfer\",\"hidden\":" + std::to_string(absl::GetFlag(FLAGS_hidden)) +
      ",\"dtype\":\"bf16\",\"window\":" + std::to_string(std::max(1, absl::GetFlag(FLAGS_window)));
  std::vector<std::string> seen;
  for (const Result& first : results) {
    if (std::find(seen.begin(), seen.end(), first.profile) != seen.end()) continue;
    seen.push_back(first.profile);
    std::string sizes;
    const Result* head = nullptr;
    for (const Result& r : results) {
      if (r.profile != first.profile) continue;
      if (head == nullptr || r.bytes > head->bytes) head = &r;
      absl::StrAppendFormat(
          &sizes,
          "%s{\"tokens\":%u,\"bytes\":%zu,\"gbps\":%.3f,\"p50_ms\":%.3f,\"p99_ms\":%.3f,"
          "\"perftest_gbps\":%.3f,\"perftest_test\":\"%s\",\"ratio\":%.3f%s,\"bytes_ok\":%s}",
          sizes.empty() ? "" : ",", r.tokens, r.bytes, r.gbps, r.p50_ms, r.p99_ms, r.perftest_gbps,
          r.perftest_test, r.perftest_gbps > 0 ? r.gbps / r.perftest_gbps : 0,
          r.perftest_no_err_gbps > 0
              ? absl::StrFormat(",\"perftest_no_err_gbps\":%.3f,\"ratio_no_err\":%.3f",
                                r.perftest_no_err_gbps, r.gbps / r.perftest_no_err_gbps)
              : "",
          r.bytes_ok ? "true" : "false");
    }
    absl::StrAppendFormat(&json,
                          ",\"%s\":{\"data_path\":\"%s\",\"tokens\":%u,\"gbps\":%.3f,"
                          "\"perftest_gbps\":%.3f,\"ratio\":%.3f,\"sizes\":[%s]}",
                          head->profile, head->data_path, head->tokens, head->gbps,
                          head->perftest_gbps,
                          head->perftest_gbps > 0 ? head->gbps / head->perftest_gbps : 0, sizes);
  }
  json += "}";
  printf("%s\n", json.c_str());
  return 0;
}

}  // namespace
}  // namespace mmserve::transfer

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return mmserve::transfer::Main();
}
