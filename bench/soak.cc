// soak: the whole stack (router, two encoders, language) under a steady mixed
// load for --minutes: demo questions at --concurrency, a share cancelled
// mid-stream, --bad_share of hostile requests, and one encoder killed and
// restarted every --restart_minutes. Every minute it records each process's
// RSS and the error counts by code; at the end, the leaked blocks. Prints a
// table per minute and a last JSON line.
//
//   bazel run --config=opt //bench:soak -- --minutes=30
//
// Target: RSS flat within 5% after warm-up, zero unexpected errors
// (only the INVALID_ARGUMENT of the bad requests and the CANCELLED of the
// cancelled ones), zero leaked blocks.
#include <signal.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/clock.h"
#include "common/grpc_server.h"
#include "common/logging.h"
#include "tests/stack_harness.h"

ABSL_FLAG(double, minutes, 30, "how long to run");
ABSL_FLAG(int, concurrency, 6, "client threads");
ABSL_FLAG(double, bad_share, 0.10, "share of hostile requests");
ABSL_FLAG(double, cancel_share, 0.10, "share of requests cancelled mid-stream");
ABSL_FLAG(double, restart_minutes, 5, "kill and restart one encoder this often");
ABSL_FLAG(std::string, profile, "shm", "UCX profile");

namespace mmserve::testing {
namespace {

double RssMb(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::atof(line.c_str() + 6) / 1024.0;
  }
  return 0;
}

int Main() {
  const DemoSet& set = Demo();
  launcher::StackOptions o = TestStackOptions(2, absl::GetFlag(FLAGS_profile));
  o.log_dir = "/tmp";
  o.language_args = {"--kv_cache_mb=64"};
  auto stack = launcher::LocalStack::Start(o);
  CHECK_OK(stack.status());
  launcher::LocalStack& s = **stack;
  auto stub = mmserve::v1::Inference::NewStub(InternalChannel(s.router_address()));
  // Clients ask any question: the reference covers the whole set.
  const Reference& ref = InProcess(set, static_cast<int>(set.items.size()));

  std::mutex mu;
  std::map<std::string, int> codes;  // expected and unexpected, by kind
  int wrong_answers = 0;
  std::atomic<bool> stop{false};
  std::vector<std::thread> clients;
  for (int t = 0; t < absl::GetFlag(FLAGS_concurrency); ++t) {
    clients.emplace_back([&, t] {
      std::mt19937_64 rng(1000 + t);
      std::uniform_real_distribution<double> u(0, 1);
      for (uint64_t n = 0; !stop.load(); ++n) {
        const size_t i = rng() % set.items.size();
        const double roll = u(rng);
        AskOptions opts;
        mmserve::v1::GenerateRequest req = DemoRequest(set, set.items[i], opts);
        std::string kind = "ok";
        if (roll < absl::GetFlag(FLAGS_bad_share)) {
          kind = "bad";
          req.mutable_chat()->mutable_messages(0)->mutable_content(0)->mutable_image()->set_data(
              "definitely not an image");
        } else if (roll < absl::GetFlag(FLAGS_bad_share) + absl::GetFlag(FLAGS_cancel_share)) {
          kind = "cancel";
          opts.max_tokens = 200;
          opts.ignore_eos = true;
          opts.cancel_after = 2;
          req = DemoRequest(set, set.items[i], opts);
        }
        Answer a = AskGrpc(*stub, req, opts);
        const std::string code = absl::StatusCodeToString(a.status.code());
        const bool expected =
            (kind == "ok" && a.status.ok()) ||
            (kind == "bad" && a.status.code() == absl::StatusCode::kInvalidArgument) ||
            (kind == "cancel" && a.status.code() == absl::StatusCode::kCancelled);
        std::lock_guard<std::mutex> lock(mu);
        ++codes[absl::StrCat(expected ? "" : "UNEXPECTED ", kind, " ", code)];
        if (kind == "ok" && a.status.ok() && a.text != ref.text[i]) ++wrong_answers;
      }
    });
  }

  const double minutes = absl::GetFlag(FLAGS_minutes);
  const double restart_every = absl::GetFlag(FLAGS_restart_minutes);
  std::vector<std::vector<double>> rss;  // per minute: router, encoder-0, encoder-1, language
  Stopwatch clock;
  double next_restart = restart_every;
  int restarts = 0;
  // Per encoder: the minute its current process started, and per minute row
  // that start (so growth is measured within one process's life).
  double started[2] = {0, 0};
  std::vector<std::vector<double>> life_start;
  std::printf("%6s %10s %10s %10s %10s  %s\n", "minute", "router", "encoder-0", "encoder-1",
              "language", "requests so far by code");
  for (int minute = 1; minute <= static_cast<int>(minutes + 0.5); ++minute) {
    while (clock.ElapsedSeconds() < minute * 60.0) {
      absl::SleepFor(absl::Milliseconds(200));
      if (clock.ElapsedSeconds() >= next_restart * 60.0) {
        const int e = restarts % 2;
        s.encoder(e).process->Signal(SIGKILL);
        s.encoder(e).process->Stop(absl::Seconds(5));
        CHECK_OK(s.StartEncoder(e));
        started[e] = clock.ElapsedSeconds() / 60;
        ++restarts;
        next_restart += restart_every;
      }
    }
    std::vector<double> row = {RssMb(s.router().process->pid()), RssMb(s.encoder(0).process->pid()),
                               RssMb(s.encoder(1).process->pid()),
                               RssMb(s.language().process->pid())};
    rss.push_back(row);
    life_start.push_back({started[0], started[1]});
    std::string summary;
    {
      std::lock_guard<std::mutex> lock(mu);
      for (const auto& [k, v] : codes) absl::StrAppend(&summary, k, "=", v, " ");
    }
    std::printf("%6d %8.1f MB %8.1f MB %8.1f MB %8.1f MB  %s\n", minute, row[0], row[1], row[2],
                row[3], summary.c_str());
    std::fflush(stdout);
  }
  stop = true;
  for (auto& t : clients) t.join();
  const Leaks leaks = WaitForNoLeaks(s, absl::Seconds(15));
  // RSS growth after warm-up (minute 2 on), router and language: the
  // encoders restart, so theirs is measured within each process's life.
  auto growth = [&](int col) {
    if (rss.size() < 3) return 0.0;
    double lo = rss[1][col], hi = rss[1][col];
    for (size_t m = 1; m < rss.size(); ++m) {
      lo = std::min(lo, rss[m][col]);
      hi = std::max(hi, rss[m][col]);
    }
    return lo > 0 ? hi / lo - 1 : 0.0;
  };
  // Encoders: within each process's life, from 2 minutes after its start
  // (the same warm-up as above), the largest growth of any life of either.
  auto encoder_growth = [&] {
    double worst = 0;
    for (int e = 0; e < 2; ++e) {
      std::map<double, std::pair<double, double>> lives;  // start -> (lo, hi)
      std::map<double, int> samples;
      for (size_t m = 0; m < rss.size(); ++m) {
        const double start = life_start[m][e];
        if (m + 1 - start < 2 - 1e-9 || rss[m][1 + e] <= 0) continue;
        auto it = lives.try_emplace(start, rss[m][1 + e], rss[m][1 + e]).first;
        it->second.first = std::min(it->second.first, rss[m][1 + e]);
        it->second.second = std::max(it->second.second, rss[m][1 + e]);
        ++samples[start];
      }
      for (const auto& [start, lohi] : lives) {
        if (samples[start] >= 2) worst = std::max(worst, lohi.second / lohi.first - 1);
      }
    }
    return worst;
  };
  int unexpected = 0, total = 0;
  std::string codes_json;
  for (const auto& [k, v] : codes) {
    total += v;
    if (k.rfind("UNEXPECTED", 0) == 0) unexpected += v;
    absl::StrAppend(&codes_json, codes_json.empty() ? "" : ",", "\"", k, "\":", v);
  }
  s.Stop();
  std::printf("leaks after the load: %s\n", leaks.ToString().c_str());
  std::printf(
      "{\"bench\":\"soak\",\"minutes\":%.1f,\"requests\":%d,\"unexpected_errors\":%d,"
      "\"wrong_answers\":%d,\"encoder_restarts\":%d,\"router_rss_growth\":%.4f,"
      "\"language_rss_growth\":%.4f,\"encoder_rss_growth\":%.4f,\"leaks_zero\":%s,"
      "\"codes\":{%s}}\n",
      clock.ElapsedSeconds() / 60, total, unexpected, wrong_answers, restarts, growth(0), growth(3),
      encoder_growth(), leaks.zero() ? "true" : "false", codes_json.c_str());
  return 0;
}

}  // namespace
}  // namespace mmserve::testing

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return mmserve::testing::Main();
}
