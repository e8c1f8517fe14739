// KV hand-off into a decode side in another process, and that process dying
// or freezing mid-hand-off: the prefill side gets a bounded error, keeps its
// own blocks intact, and hands off to the next decode side as before.
#include <signal.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <random>
#include <string>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "transfer/kv_handoff.h"
#include "transfer/peer_process.h"

namespace mmserve::transfer {
namespace {

// 2 layers x 2 x 256 blocks x 16 x 4 heads x 64 floats = 32 MiB per side.
const model::KvCacheShape kShape = {
    .num_layers = 2, .num_blocks = 256, .block_size = 16, .num_kv_heads = 4, .head_dim = 64};

std::string PeerPath() {
  std::string p = PeerBinaryPath();
  return p.substr(0, p.rfind('/')) + "/kv_handoff_peer";
}

struct Peer {
  std::unique_ptr<PeerProcess> process;
  KvHandoffTarget target;
};

// `decode_kv`: "service" (the cache as role decode makes it) or "private".
Peer StartPeer(TransportProfile profile, const std::string& decode_kv) {
  auto p = PeerProcess::Spawn(
      PeerPath(),
      {absl::StrCat("--profile=", TransportProfileName(profile)),
       absl::StrCat("--layers=", kShape.num_layers), absl::StrCat("--blocks=", kShape.num_blocks),
       absl::StrCat("--block_size=", kShape.block_size),
       absl::StrCat("--kv_heads=", kShape.num_kv_heads),
       absl::StrCat("--head_dim=", kShape.head_dim), absl::StrCat("--decode_kv=", decode_kv)});
  REQUIRE(p.ok());
  Peer peer{std::move(*p), {}};
  auto line = peer.process->ReadLine(Deadline::After(absl::Seconds(10)));
  REQUIRE(line.has_value());
  std::vector<std::string> w = absl::StrSplit(*line, ' ');
  REQUIRE(w.size() == 4);
  REQUIRE(w[0] == "TARGET");
  peer.target.worker_address = FromHex(w[1]);
  peer.target.rkey = FromHex(w[2]);
  REQUIRE(absl::SimpleAtoi(w[3], &peer.target.base_address));
  peer.target.shape = kShape;
  return peer;
}

uint32_t PeerCrc(Peer& peer, const std::vector<int32_t>& blocks) {
  std::string q = "CRC";
  for (int32_t b : blocks) absl::StrAppend(&q, " ", b);
  REQUIRE(peer.process->WriteLine(q));
  auto line = peer.process->ReadLine(Deadline::After(absl::Seconds(10)));
  REQUIRE(line.has_value());
  uint32_t crc = 0;
  REQUIRE(absl::SimpleAtoi(line->substr(4), &crc));
  return crc;
}

std::vector<int32_t> Range(int32_t from, int32_t n) {
  std::vector<int32_t> v(n);
  for (int32_t i = 0; i < n; ++i) v[i] = from + i;
  return v;
}

TEST_CASE("KV hand-off to a decode process; a frozen or killed decode side fails in bounds",
          "[kv_handoff]") {
  for (TransportProfile profile : {TransportProfile::kShm, TransportProfile::kTcp}) {
    CAPTURE(TransportProfileName(profile));
    auto ctx = UcxContext::Create(profile);
    REQUIRE(ctx.ok());
    auto cache = model::KvCache::Create(kShape);
    REQUIRE(cache.ok());
    std::mt19937 rng(7);
    for (int64_t l = 0; l < kShape.num_layers; ++l) {
      for (float* plane : {(*cache)->Key(l), (*cache)->Value(l)}) {
        for (int64_t i = 0; i < kShape.LayerPlaneFloats(); ++i) plane[i] = float(rng() % 1000);
      }
    }
    const uint32_t local_before = KvBlocksCrc(**cache, Range(0, 256));
    auto tx = KvHandoffSender::Create(**ctx, **cache, {.name = "prefill"});
    REQUIRE(tx.ok());

    // A live decode process gets the blocks; its CRC matches the sender's.
    Peer good = StartPeer(profile, "service");
    const std::vector<int32_t> src = Range(0, 128), dst = Range(100, 128);
    KvHandoffPath path = KvHandoffPath::kPut;
    auto crc = (*tx)->Send(good.target, src, dst, Deadline::After(absl::Seconds(20)), 0, &path);
    REQUIRE(crc.ok());
    // Another process's shared segment, mapped here (shm); tcp lands by rendezvous.
    CHECK(path == (profile == TransportProfile::kShm ? KvHandoffPath::kMapped
                                                     : KvHandoffPath::kRendezvous));
    CHECK(*crc == PeerCrc(good, dst));

    // A decode process that is frozen, then killed, while the blocks move.
    // Its cache is private registered memory, so UCX needs its progress to
    // complete the puts (into a shared segment on shm they would land
    // without it, and the hand-off would succeed; the commit RPC is what
    // fails then).
    Peer bad = StartPeer(profile, "private");
    REQUIRE(kill(bad.process->pid(), SIGSTOP) == 0);
    absl::StatusOr<uint32_t> result;
    Stopwatch sw;
    std::thread send([&] {
      result = (*tx)->Send(bad.target, Range(0, 256), Range(0, 256),
                           Deadline::After(absl::Milliseconds(1500)));
    });
    absl::SleepFor(absl::Milliseconds(200));
    bad.process->Kill();
    send.join();
    CHECK_FALSE(result.ok());
    WARN("killed mid-hand-off: " << result.status() << " after " << sw.ElapsedSeconds() << " s");
    // The prefill side's own blocks are untouched.
    CHECK(KvBlocksCrc(**cache, Range(0, 256)) == local_before);

    // And it still hands off to a live decode process.
    auto again = (*tx)->Send(good.target, {7, 8}, {1, 2}, Deadline::After(absl::Seconds(20)));
    REQUIRE(again.ok());
    CHECK(*again == PeerCrc(good, {1, 2}));
    good.process->WriteLine("EXIT");
    CHECK(good.process->Wait(Deadline::After(absl::Seconds(10))) == 0);
  }
}

}  // namespace
}  // namespace mmserve::transfer
