// transfer_bench: embeddings through the full default-then-resume protocol
// (init, chunk write, flush/sends, notice, CRC32C verification) between this
// process (receiver) and a transfer_peer child (sender), per profile, for
// 1024 and 4096 tokens x 3584 hidden x bf16. Baseline: the best of
// ucx_perftest tag_bw and ucp_put_bw for the same size, UCX_TLS and endpoint
// error mode (tcp: peer error handling, perftest -e); for tcp also tag_bw
// without error handling (perftest_no_err_gbps, ratio_no_err).
//
// Each size runs --rounds rounds of --iterations timed transfers, each round
// followed by its perftest runs: on this shared VM both swing 2x between
// seconds, so alternating lets each pair see the same noise. gbps and
// perftest_gbps are medians over rounds, ratio their quotient, round_ratios
// each round's own. Prints a table, then one JSON line.
//
// GB/s is streaming bandwidth: image bytes over the wall time of a round's
// transfers, with --window receives in flight; p50/p99 are per-image
// latencies from Receive to the verified image, over all rounds. --window=1
// gives one-at-a-time figures. The sender writes (and checksums) each payload
// once and republishes it, as an encoder computes the checksum while it writes
// the embedding; the receiver verifies every chunk inside the timed window.
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
#include "transfer/payload_testing.h"
#include "transfer/peer_process.h"
#include "transfer/transfer_engine.h"

ABSL_FLAG(int, rounds, 5,
          "rounds per size, each --iterations timed transfers followed by the ucx_perftest "
          "baselines; figures are medians over rounds");
ABSL_FLAG(int, iterations, 30, "timed transfers per size and round");
ABSL_FLAG(int, warmup, 3, "untimed transfers per size");
ABSL_FLAG(int, window, 1,
          "receives in flight at once (ucx_perftest's bandwidth tests keep several "
          "operations outstanding too); 1 measures one transfer at a time");
ABSL_FLAG(std::string, profiles, "shm,tcp", "profiles to run");
ABSL_FLAG(std::string, tokens, "1024,4096", "image lengths");
ABSL_FLAG(uint32_t, hidden, 3584, "hidden size (bf16)");
ABSL_FLAG(std::string, data_path, "", "put, tag or get on both ends (default: the profile's)");
ABSL_FLAG(int64_t, spin_us, -1,
          "progress threads (both ends) busy-poll this long after the last activity "
          "(default: UcxWorkerOptions')");
ABSL_FLAG(std::string, perftest, "/usr/bin/ucx_perftest", "ucx_perftest binary");

namespace mmserve::transfer {
namespace {

constexpr uint32_t kBlockSize = 128;

// One size on one profile, over all rounds.
struct Result {
  std::string profile;
  std::string data_path;
  uint32_t tokens = 0;
  size_t bytes = 0;
  // Per round: the protocol's GB/s, the best perftest test's GB/s and its
  // name, and (tcp) tag_bw without peer error handling.
  std::vector<double> gbps, perftest_gbps, perftest_no_err_gbps;
  std::vector<std::string> perftest_test;
  std::vector<double> ms;  // every timed image's latency
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

bool SameBytes(const ReceivedMedia& image, const EmbeddingLayout& layout, const PayloadSpec& spec) {
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

double Median(std::vector<double> v) { return v.empty() ? 0 : Percentile(std::move(v), 0.5); }

// This process as the receiver, a transfer_peer child as the sender of
// `total` images of `tokens` tokens, received in batches by Run.
class ProtocolRun {
 public:
  ProtocolRun(TransportProfile profile, uint32_t tokens, int total)
      : spec_{.seed = 42, .total_tokens = tokens}, total_(total) {
    const uint32_t hidden = absl::GetFlag(FLAGS_hidden);
    const int window = Window();
    // Room for `window` images in flight on each side, plus the last image,
    // held until its bytes are checked.
    const uint32_t num_blocks = (window + 1) * ((tokens + kBlockSize - 1) / kBlockSize);
    TransferEngineOptions options{
        .instance_id = "bench-lang",
        .profile = profile,
        .layout = {.block_size = kBlockSize, .num_blocks = num_blocks, .hidden_size = hidden},
        .default_num_blocks = 8,
        .data_path = ParseDataPath(absl::GetFlag(FLAGS_data_path))};
    const int64_t spin_us = absl::GetFlag(FLAGS_spin_us);
    if (spin_us >= 0) options.worker.spin = absl::Microseconds(spin_us);
    auto engine = TransferEngine::Create(options);
    CHECK(engine.ok()) << engine.status();
    engine_ = *std::move(engine);
    auto child = PeerProcess::Spawn(
        PeerBinaryPath(),
        {"--role=sender", std::string("--profile=") + TransportProfileName(profile),
         "--hidden=" + std::to_string(hidden), "--block_size=" + std::to_string(kBlockSize),
         "--num_blocks=" + std::to_string(num_blocks), "--tokens=" + std::to_string(tokens),
         "--repeat=" + std::to_string(total), "--window=" + std::to_string(window),
         "--reuse_payload", "--timeout_ms=600000", "--seed=42",
         "--data_path=" + absl::GetFlag(FLAGS_data_path), "--spin_us=" + std::to_string(spin_us)});
    CHECK(child.ok()) << child.status();
    child_ = *std::move(child);
    Deadline d = Deadline::After(absl::Seconds(60));
    auto info = child_->ReadLine(d);
    CHECK(info && info->rfind("INFO ", 0) == 0);
    v1::ConnectRequest peer;
    CHECK(peer.ParseFromString(FromHex(info->substr(5))));
    CHECK_OK(engine_->Connect(peer));
    child_->WriteLine("PEER " + ToHex(engine_->local_info().SerializeAsString()));
    CHECK(child_->ReadLine(d) == std::optional<std::string>("READY"));
  }

  static int Window() { return std::max(1, absl::GetFlag(FLAGS_window)); }
  std::string data_path() const { return DataPathName(engine_->data_path()); }
  size_t bytes() const {
    return size_t{spec_.total_tokens} * engine_->buffer().layout().BytesPerToken();
  }

  // Receives the next `count` images, up to --window in flight, and returns
  // the wall time from the first Receive until the last completed; adds each
  // image's latency (Receive to verified image) to `ms` if not null. The
  // first and the last image are checked byte for byte (the last one after
  // the clock stopped).
  double Run(int count, std::vector<double>* ms) {
    CHECK_LE(next_ + count, total_);
    const int window = Window();
    int in_flight = 0, finished = 0;
    Stopwatch wall;
    for (int i = 0; i < count; ++i) {
      const int k = next_++;
      {
        absl::MutexLock lock(&mu_);
        auto room = [&] { return in_flight < window; };
        mu_.Await(absl::Condition(&room));
        ++in_flight;
      }
      auto watch = std::make_shared<Stopwatch>();
      engine_->Receive({.request_id = "req-" + std::to_string(k),
                        .sender = "sender",
                        .known_tokens = spec_.total_tokens,
                        .timeout = absl::Seconds(60)},
                       [&, k, watch](absl::StatusOr<ReceivedMedia> image) {
                         const double s = watch->ElapsedSeconds();
                         CHECK(image.ok()) << image.status();
                         bool ok = true;
                         std::optional<ReceivedMedia> keep;
                         if (k == 0) {
                           ok = SameBytes(*image, engine_->buffer().layout(), spec_);
                         } else if (k == total_ - 1) {
                           keep = *std::move(image);  // checked in Finish
                         }
                         if (!keep) image->Release();
                         absl::MutexLock lock(&mu_);
                         bytes_ok_ = bytes_ok_ && ok;
                         if (keep) last_ = std::move(keep);
                         if (ms != nullptr) ms->push_back(s * 1e3);
                         --in_flight;
                         ++finished;
                       });
    }
    absl::MutexLock lock(&mu_);
    auto all = [&] { return finished == count; };
    mu_.Await(absl::Condition(&all));
    return wall.ElapsedSeconds();
  }

  // After all `total` images: checks the last one, stops the child; true if
  // every checked image matched.
  bool Finish() {
    CHECK_EQ(next_, total_);
    absl::MutexLock lock(&mu_);
    if (last_) {
      bytes_ok_ = bytes_ok_ && SameBytes(*last_, engine_->buffer().layout(), spec_);
      last_->Release();
      last_.reset();
    }
    child_->WriteLine("EXIT");
    child_->Wait(Deadline::After(absl::Seconds(10)));
    return bytes_ok_;
  }

 private:
  const PayloadSpec spec_;
  const int total_;
  std::unique_ptr<TransferEngine> engine_;
  std::unique_ptr<PeerProcess> child_;
  int next_ = 0;
  absl::Mutex mu_;
  bool bytes_ok_ = true;
  std::optional<ReceivedMedia> last_;
};

// Rounds of: --iterations timed transfers through the protocol, then the
// ucx_perftest baselines for the same size, transports and endpoint error
// mode (best of tag_bw and ucp_put_bw). On a shared VM both swing 2x from
// one second to the next; alternating them lets each round's pair see the
// same spell of noise, and medians over rounds damp the rest.
Result Measure(TransportProfile profile, uint32_t tokens) {
  const int warmup = absl::GetFlag(FLAGS_warmup);
  const int iterations = std::max(1, absl::GetFlag(FLAGS_iterations));
  const int rounds = std::max(1, absl::GetFlag(FLAGS_rounds));
  const bool tcp = profile == TransportProfile::kTcp;
  ProtocolRun run(profile, tokens, warmup + rounds * iterations);
  Result r;
  r.profile = TransportProfileName(profile);
  r.data_path = run.data_path();
  r.tokens = tokens;
  r.bytes = run.bytes();
  run.Run(warmup, nullptr);
  // Emulated puts over tcp crawl (< 0.1 GB/s): measured once, a few
  // iterations tell the story.
  const double tcp_put = tcp ? Perftest(profile, "ucp_put_bw", r.bytes, 3, true) : 0;
  for (int round = 0; round < rounds; ++round) {
    const double s = run.Run(iterations, &r.ms);
    r.gbps.push_back(r.bytes * iterations / s / 1e9);
    const int n = std::max(5, iterations);
    const double tag = Perftest(profile, "tag_bw", r.bytes, n, /*peer_errors=*/tcp);
    const double put = tcp ? tcp_put : Perftest(profile, "ucp_put_bw", r.bytes, n, false);
    r.perftest_gbps.push_back(std::max(tag, put));
    r.perftest_test.push_back(tag >= put ? "tag_bw" : "ucp_put_bw");
    if (tcp) r.perftest_no_err_gbps.push_back(Perftest(profile, "tag_bw", r.bytes, n, false));
    fprintf(stderr, "%s %u tokens, round %d: protocol %.2f GB/s, tag_bw %.2f, ucp_put_bw %.2f%s\n",
            r.profile.c_str(), tokens, round, r.gbps.back(), tag, put,
            tcp ? absl::StrFormat(", tag_bw without peer error handling %.2f",
                                  r.perftest_no_err_gbps.back())
                      .c_str()
                : "");
  }
  r.bytes_ok = run.Finish();
  return r;
}

// The test that was best in most rounds.
std::string BestTest(const Result& r) {
  const auto tag = std::count(r.perftest_test.begin(), r.perftest_test.end(), "tag_bw");
  return 2 * tag >= static_cast<long>(r.perftest_test.size()) ? "tag_bw" : "ucp_put_bw";
}

std::vector<double> Ratios(const std::vector<double>& a, const std::vector<double>& b) {
  std::vector<double> out;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) out.push_back(b[i] > 0 ? a[i] / b[i] : 0);
  return out;
}

std::string JsonList(const std::vector<double>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) absl::StrAppendFormat(&s, "%s%.3f", i ? "," : "", v[i]);
  return s + "]";
}

int Main() {
  std::vector<Result> results;
  for (absl::string_view name : absl::StrSplit(absl::GetFlag(FLAGS_profiles), ',')) {
    absl::StatusOr<TransportProfile> profile = ParseTransportProfile(name);
    CHECK(profile.ok()) << profile.status();
    for (absl::string_view t : absl::StrSplit(absl::GetFlag(FLAGS_tokens), ',')) {
      uint32_t tokens = 0;
      CHECK(absl::SimpleAtoi(t, &tokens));
      results.push_back(Measure(*profile, tokens));
    }
  }

  printf("%-5s %-4s %7s %10s %8s %8s %8s %13s %11s %6s %11s %5s\n", "prof", "path", "tokens",
         "bytes", "GB/s", "p50 ms", "p99 ms", "perftest GB/s", "perftest", "ratio", "min-max",
         "bytes");
  for (const Result& r : results) {
    const double gbps = Median(r.gbps), perftest = Median(r.perftest_gbps);
    const std::vector<double> ratios = Ratios(r.gbps, r.perftest_gbps);
    printf("%-5s %-4s %7u %10zu %8.2f %8.2f %8.2f %13.2f %11s %6.2f %5.2f-%5.2f %5s\n",
           r.profile.c_str(), r.data_path.c_str(), r.tokens, r.bytes, gbps, Percentile(r.ms, 0.5),
           Percentile(r.ms, 0.99), perftest, BestTest(r).c_str(),
           perftest > 0 ? gbps / perftest : 0, *std::min_element(ratios.begin(), ratios.end()),
           *std::max_element(ratios.begin(), ratios.end()), r.bytes_ok ? "ok" : "BAD");
  }
  // JSON: per profile, the headline numbers are the largest size's; every
  // size is listed under "sizes". gbps and perftest_gbps are medians over
  // rounds, ratio their quotient; round_ratios are each round's own.
  std::string json = absl::StrFormat(
      "{\"bench\":\"transfer\",\"hidden\":%u,\"dtype\":\"bf16\",\"window\":%d,\"rounds\":%d,"
      "\"iterations\":%d",
      absl::GetFlag(FLAGS_hidden), ProtocolRun::Window(), std::max(1, absl::GetFlag(FLAGS_rounds)),
      std::max(1, absl::GetFlag(FLAGS_iterations)));
  std::vector<std::string> seen;
  for (const Result& first : results) {
    if (std::find(seen.begin(), seen.end(), first.profile) != seen.end()) continue;
    seen.push_back(first.profile);
    std::string sizes;
    const Result* head = nullptr;
    for (const Result& r : results) {
      if (r.profile != first.profile) continue;
      if (head == nullptr || r.bytes > head->bytes) head = &r;
      const double gbps = Median(r.gbps), perftest = Median(r.perftest_gbps);
      std::string no_err;
      if (!r.perftest_no_err_gbps.empty()) {
        const double p = Median(r.perftest_no_err_gbps);
        no_err = absl::StrFormat(",\"perftest_no_err_gbps\":%.3f,\"ratio_no_err\":%.3f", p,
                                 p > 0 ? gbps / p : 0);
      }
      absl::StrAppendFormat(
          &sizes,
          "%s{\"tokens\":%u,\"bytes\":%zu,\"gbps\":%.3f,\"p50_ms\":%.3f,\"p99_ms\":%.3f,"
          "\"perftest_gbps\":%.3f,\"perftest_test\":\"%s\",\"ratio\":%.3f,\"round_ratios\":%s%s,"
          "\"bytes_ok\":%s}",
          sizes.empty() ? "" : ",", r.tokens, r.bytes, gbps, Percentile(r.ms, 0.5),
          Percentile(r.ms, 0.99), perftest, BestTest(r), perftest > 0 ? gbps / perftest : 0,
          JsonList(Ratios(r.gbps, r.perftest_gbps)), no_err, r.bytes_ok ? "true" : "false");
    }
    const double gbps = Median(head->gbps), perftest = Median(head->perftest_gbps);
    absl::StrAppendFormat(&json,
                          ",\"%s\":{\"data_path\":\"%s\",\"tokens\":%u,\"gbps\":%.3f,"
                          "\"perftest_gbps\":%.3f,\"ratio\":%.3f,\"sizes\":[%s]}",
                          head->profile, head->data_path, head->tokens, gbps, perftest,
                          perftest > 0 ? gbps / perftest : 0, sizes);
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
