// KV hand-off throughput (transfer/kv_handoff): this process is the prefill
// side, a kv_handoff_peer child the decode side; a whole prompt's blocks move
// per hand-off. By default the decode cache is laid out as the language
// service's decode role lays it out (--decode_kv=service): on shm this side
// maps it and copies in on two cores with the CRC32C in the same pass; on
// tcp one active message per run of blocks consecutive on both sides, landed
// by rendezvous, the CRC32C computed while they fly. Each run's JSON names
// the path the hand-offs took.
// Baseline in the same run: ucx_perftest (best of tag_bw and
// ucp_put_bw) for the same total bytes, UCX_TLS and error mode. Rounds
// alternate the two so each pair sees the same noise; medians over rounds.
// KV geometry defaults to Qwen2-VL-2B's (28 layers, 2 KV heads of 128, fp32).
//
// --net_hosts: across hosts (tests/net_hosts, root only): the decode peer and
// the perftest server run in a network namespace of their own, this process
// on the switch's client port, every byte through the emulated switch (a
// userspace TAP forwarder, so perftest across the same switch is the ceiling);
// tcp only.
//
//   bazel run //bench:kv_handoff_bench -- --tokens=1024,4096 --profiles=shm,tcp
//   bazel run //bench:kv_handoff_bench -- --decode_kv=private  # the layout before
//   bazel run //bench:kv_handoff_bench -- --net_hosts --profiles=tcp --tokens=256
#include <algorithm>
#include <cstdio>
#include <cstdlib>
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
#include "tests/net_hosts.h"
#include "transfer/kv_handoff.h"
#include "transfer/peer_process.h"

ABSL_FLAG(std::string, tokens, "1024,4096", "prompt lengths (tokens) to hand off");
ABSL_FLAG(std::string, profiles, "shm,tcp", "transport profiles");
ABSL_FLAG(int, rounds, 3, "rounds per size (hand-offs, then ucx_perftest)");
ABSL_FLAG(int, iterations, 3, "timed hand-offs per round");
ABSL_FLAG(int64_t, layers, 28, "layers");
ABSL_FLAG(int64_t, kv_heads, 2, "KV heads");
ABSL_FLAG(int64_t, head_dim, 128, "head dim");
ABSL_FLAG(int64_t, block_size, 16, "tokens per block");
ABSL_FLAG(std::string, decode_kv, "service",
          "the decode side's cache: service = as the language service's decode role makes it "
          "(KvHandoffReceiver::CreateWithCache: a shared segment this process maps on shm, private "
          "on tcp); private = a registered KvCache in private memory (the layout before)");
ABSL_FLAG(std::string, perftest, "/usr/bin/ucx_perftest", "ucx_perftest binary");
ABSL_FLAG(bool, net_hosts, false,
          "decode peer and perftest server on a namespaced host behind the emulated switch "
          "(tcp only, root)");

namespace mmserve::transfer {
namespace {

// Set with --net_hosts: where the peers run.
testing::NetHosts* g_hosts = nullptr;

// argv that runs `binary args` where the peers run.
std::vector<std::string> OnPeerHost(const std::string& binary, std::vector<std::string> args) {
  if (g_hosts == nullptr) {
    args.insert(args.begin(), binary);
    return args;
  }
  return g_hosts->Command(0, binary, args);
}

absl::StatusOr<std::unique_ptr<PeerProcess>> SpawnArgv(std::vector<std::string> argv) {
  const std::string binary = argv[0];
  argv.erase(argv.begin());
  return PeerProcess::Spawn(binary, argv);
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// ucx_perftest server + client on loopback; GB/s, 0 on failure (as in
// transfer_bench).
double Perftest(TransportProfile profile, const std::string& test, size_t size, int iterations,
                bool peer_errors) {
  static int port = 25000 + (getpid() % 5000);
  ++port;
  const std::string tls = std::string("UCX_TLS=") + TransportProfileTls(profile);
  const std::string bin = absl::GetFlag(FLAGS_perftest);
  auto server = SpawnArgv(OnPeerHost("/usr/bin/env", {tls, bin, "-p", std::to_string(port)}));
  if (!server.ok()) return 0;
  for (int attempt = 0; attempt < 20; ++attempt) {
    absl::SleepFor(absl::Milliseconds(200));
    std::vector<std::string> args = {tls};
    if (g_hosts != nullptr) args.push_back("UCX_NET_DEVICES=" + g_hosts->client_device());
    args.insert(args.end(), {bin, "-p", std::to_string(port), "-t", test, "-s",
                             std::to_string(size), "-n", std::to_string(iterations), "-w", "1"});
    if (peer_errors) args.push_back("-e");
    args.push_back(g_hosts != nullptr ? g_hosts->address(0) : "localhost");
    auto client = PeerProcess::Spawn("/usr/bin/env", args);
    if (!client.ok()) return 0;
    Deadline d = Deadline::After(absl::Seconds(120));
    while (auto line = (*client)->ReadLine(d)) {
      std::vector<std::string> f = absl::StrSplit(*line, ' ', absl::SkipWhitespace());
      double mbps = 0;
      if (f.size() >= 7 && f[0] == "Final:" && absl::SimpleAtod(f[6], &mbps)) {
        return mbps * 1048576.0 / 1e9;
      }
    }
    if ((*client)->Wait(Deadline::After(absl::Seconds(1))) == 0) break;
  }
  return 0;
}

struct Result {
  std::string profile;
  int tokens = 0;
  size_t bytes = 0;
  std::vector<double> gbps, perftest_gbps;
  std::vector<std::string> perftest_test;
  bool bytes_ok = true;
  std::string path;  // how the hand-offs moved (KvHandoffPathName); "mixed" if they differed
};

Result Measure(TransportProfile profile, int tokens) {
  const model::KvCacheShape shape = {.num_layers = absl::GetFlag(FLAGS_layers),
                                     .num_blocks = 0,
                                     .block_size = absl::GetFlag(FLAGS_block_size),
                                     .num_kv_heads = absl::GetFlag(FLAGS_kv_heads),
                                     .head_dim = absl::GetFlag(FLAGS_head_dim)};
  model::KvCacheShape s = shape;
  const int blocks = static_cast<int>((tokens + s.block_size - 1) / s.block_size);
  s.num_blocks = blocks;
  auto ctx = UcxContext::Create(profile);
  CHECK(ctx.ok()) << ctx.status();
  auto cache = model::KvCache::Create(s);
  CHECK(cache.ok()) << cache.status();
  for (int64_t l = 0; l < s.num_layers; ++l) {
    for (float* p : {(*cache)->Key(l), (*cache)->Value(l)}) {
      for (int64_t i = 0; i < s.LayerPlaneFloats(); ++i)
        p[i] = static_cast<float>((i * 31 + l) % 977);
    }
  }
  auto tx = KvHandoffSender::Create(**ctx, **cache, {.name = "prefill"});
  CHECK(tx.ok()) << tx.status();
  std::string peer_path = PeerBinaryPath();
  peer_path = peer_path.substr(0, peer_path.rfind('/')) + "/kv_handoff_peer";
  auto peer = SpawnArgv(OnPeerHost(
      peer_path,
      {absl::StrCat("--profile=", TransportProfileName(profile)),
       absl::StrCat("--layers=", s.num_layers), absl::StrCat("--blocks=", blocks),
       absl::StrCat("--block_size=", s.block_size), absl::StrCat("--kv_heads=", s.num_kv_heads),
       absl::StrCat("--head_dim=", s.head_dim),
       absl::StrCat("--decode_kv=", absl::GetFlag(FLAGS_decode_kv))}));
  CHECK(peer.ok()) << peer.status();
  auto line = (*peer)->ReadLine(Deadline::After(absl::Seconds(30)));
  CHECK(line.has_value()) << "kv_handoff_peer did not start";
  std::vector<std::string> w = absl::StrSplit(*line, ' ');
  CHECK(w.size() == 4 && w[0] == "TARGET") << *line;
  KvHandoffTarget target;
  target.worker_address = FromHex(w[1]);
  target.rkey = FromHex(w[2]);
  CHECK(absl::SimpleAtoi(w[3], &target.base_address));
  target.shape = s;
  std::vector<int32_t> ids(blocks);
  for (int i = 0; i < blocks; ++i) ids[i] = i;

  Result r;
  r.profile = TransportProfileName(profile);
  r.tokens = tokens;
  r.bytes = (*cache)->bytes();
  const bool tcp = profile == TransportProfile::kTcp;
  uint32_t crc = 0;
  auto once = [&] {
    KvHandoffPath path = KvHandoffPath::kRendezvous;
    auto c = (*tx)->Send(target, ids, ids, Deadline::After(absl::Seconds(120)), 0, &path);
    CHECK(c.ok()) << c.status();
    crc = *c;
    const std::string name = KvHandoffPathName(path);
    r.path = r.path.empty() || r.path == name ? name : "mixed";
  };
  once();  // warm-up: endpoint, registration caches
  // Emulated puts over tcp crawl; measured once with few iterations.
  const double tcp_put = tcp ? Perftest(profile, "ucp_put_bw", r.bytes, 3, true) : 0;
  for (int round = 0; round < std::max(1, absl::GetFlag(FLAGS_rounds)); ++round) {
    const int n = std::max(1, absl::GetFlag(FLAGS_iterations));
    Stopwatch sw;
    for (int i = 0; i < n; ++i) once();
    r.gbps.push_back(r.bytes * n / sw.ElapsedSeconds() / 1e9);
    const double tag = Perftest(profile, "tag_bw", r.bytes, std::max(5, n), tcp);
    const double put =
        tcp ? tcp_put : Perftest(profile, "ucp_put_bw", r.bytes, std::max(5, n), false);
    r.perftest_gbps.push_back(std::max(tag, put));
    r.perftest_test.push_back(tag >= put ? "tag_bw" : "ucp_put_bw");
    fprintf(stderr, "%s %d tokens, round %d: hand-off %.2f GB/s, tag_bw %.2f, ucp_put_bw %.2f\n",
            r.profile.c_str(), tokens, round, r.gbps.back(), tag, put);
  }
  std::string q = "CRC";
  for (int32_t b : ids) absl::StrAppend(&q, " ", b);
  (*peer)->WriteLine(q);
  auto reply = (*peer)->ReadLine(Deadline::After(absl::Seconds(30)));
  r.bytes_ok = reply.has_value() && *reply == absl::StrCat("CRC ", crc);
  (*peer)->WriteLine("EXIT");
  (*peer)->Wait(Deadline::After(absl::Seconds(10)));
  return r;
}

int Main() {
  std::unique_ptr<testing::NetHosts> hosts;
  if (absl::GetFlag(FLAGS_net_hosts)) {
    CHECK_OK(testing::NetHostsSupported());
    auto h = testing::NetHosts::Create(1);
    CHECK(h.ok()) << h.status();
    hosts = *std::move(h);
    g_hosts = hosts.get();
    // This process's UCX (read when each context is created) on the client
    // port only, so its traffic crosses the switch.
    setenv("UCX_NET_DEVICES", hosts->client_device().c_str(), 1);
  }
  std::vector<Result> results;
  for (absl::string_view name : absl::StrSplit(absl::GetFlag(FLAGS_profiles), ',')) {
    auto profile = ParseTransportProfile(name);
    CHECK(profile.ok()) << profile.status();
    for (absl::string_view t : absl::StrSplit(absl::GetFlag(FLAGS_tokens), ',')) {
      int tokens = 0;
      CHECK(absl::SimpleAtoi(t, &tokens) && tokens > 0);
      results.push_back(Measure(*profile, tokens));
    }
  }
  printf("%-5s %7s %11s %8s %13s %6s %5s %s\n", "prof", "tokens", "bytes", "GB/s", "perftest GB/s",
         "ratio", "bytes", "path");
  std::string sizes;
  for (const Result& r : results) {
    const double g = Median(r.gbps), p = Median(r.perftest_gbps);
    // The label names the test of the round whose figure is the median.
    std::string test;
    for (size_t i = 0; i < r.perftest_gbps.size(); ++i) {
      if (r.perftest_gbps[i] == p) test = r.perftest_test[i];
    }
    printf("%-5s %7d %11zu %8.3f %13.3f %6.3f %5s %s\n", r.profile.c_str(), r.tokens, r.bytes, g, p,
           p > 0 ? g / p : 0, r.bytes_ok ? "ok" : "BAD", r.path.c_str());
    absl::StrAppendFormat(&sizes,
                          "%s{\"profile\":\"%s\",\"tokens\":%d,\"bytes\":%zu,\"path\":\"%s\","
                          "\"gbps\":%.3f,\"perftest_gbps\":%.3f,\"perftest_test\":\"%s\","
                          "\"ratio\":%.3f,\"bytes_ok\":%s}",
                          sizes.empty() ? "" : ",", r.profile, r.tokens, r.bytes, r.path, g, p,
                          test, p > 0 ? g / p : 0, r.bytes_ok ? "true" : "false");
  }
  printf(
      "{\"bench\":\"kv_handoff\",\"net_hosts\":%s,\"layers\":%ld,\"kv_heads\":%ld,\"head_dim\":%ld,"
      "\"block_size\":%ld,\"dtype\":\"fp32\",\"decode_kv\":\"%s\",\"rounds\":%d,\"iterations\":%d,"
      "\"runs\":[%s]}\n",
      hosts != nullptr ? "true" : "false", static_cast<long>(absl::GetFlag(FLAGS_layers)),
      static_cast<long>(absl::GetFlag(FLAGS_kv_heads)),
      static_cast<long>(absl::GetFlag(FLAGS_head_dim)),
      static_cast<long>(absl::GetFlag(FLAGS_block_size)), absl::GetFlag(FLAGS_decode_kv).c_str(),
      absl::GetFlag(FLAGS_rounds), absl::GetFlag(FLAGS_iterations), sizes.c_str());
  return 0;
}

}  // namespace
}  // namespace mmserve::transfer

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return mmserve::transfer::Main();
}
