// KV hand-off into a TP=2 decode instance, real processes: rank 1 (forked)
// runs RunShardSteps with a ShardKvReceiver, rank 0 a TpKvReceivers, both
// joined by the shared-memory communicator and step ring; a prefill-side
// cache with every KV head writes each rank its head slice over UCX (shm:
// into each rank's segment, mapped by the sender).
// Each rank's received blocks must equal the prefill side's slice byte for
// byte (rank 1 compares its own in its process and reports through its exit
// code), the gathered CRC32Cs must equal the sender's, and a rank killed
// mid-hand-off fails the next check with UNAVAILABLE, not a hang.
#include "worker/tp_kv_receiver.h"

#include <signal.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/status_macros.h"
#include "model/cpu/thread_pool.h"
#include "model/model_config.h"
#include "model/qwen2_weights.h"
#include "model/safetensors.h"
#include "worker/fork_ranks.h"
#include "worker/shm_communicator.h"

namespace mmserve::worker {
namespace {

constexpr char kModelDir[] = "models/shapes-demo";
constexpr int64_t kBlocks = 16;
constexpr int64_t kBlockSize = 4;
// The prefill side's blocks and where the decode side puts them.
const std::vector<int32_t> kSrc = {3, 4, 11, 0};
const std::vector<int32_t> kDst = {9, 2, 5, 15};

// The prefill side's value of one element (every KV head).
float PrefillValue(int64_t layer, int64_t kv, int64_t block, int64_t token, int64_t head,
                   int64_t d) {
  return static_cast<float>(((((layer * 2 + kv) * 31 + block) * 17 + token) * 13 + head) * 7 + d) *
         0.001f;
}

model::KvCacheShape WithHeads(model::KvCacheShape s, int64_t heads) {
  s.num_kv_heads = heads;
  return s;
}

float* Plane(model::KvCache& c, int64_t layer, int64_t kv) {
  return kv == 0 ? c.Key(layer) : c.Value(layer);
}

void FillPrefill(model::KvCache& c) {
  const model::KvCacheShape& s = c.shape();
  for (int64_t l = 0; l < s.num_layers; ++l) {
    for (int64_t kv = 0; kv < 2; ++kv) {
      float* p = Plane(c, l, kv);
      for (int64_t b = 0; b < s.num_blocks; ++b) {
        for (int64_t t = 0; t < s.block_size; ++t) {
          for (int64_t h = 0; h < s.num_kv_heads; ++h) {
            for (int64_t d = 0; d < s.head_dim; ++d) {
              p[((b * s.block_size + t) * s.num_kv_heads + h) * s.head_dim + d] =
                  PrefillValue(l, kv, b, t, h, d);
            }
          }
        }
      }
    }
  }
}

// Elements of rank `rank`'s kDst blocks that differ from the prefill side's
// kSrc blocks of its heads (bitwise).
int64_t Mismatches(model::KvCache& c, int rank) {
  const model::KvCacheShape& s = c.shape();
  int64_t bad = 0;
  for (int64_t l = 0; l < s.num_layers; ++l) {
    for (int64_t kv = 0; kv < 2; ++kv) {
      const float* p = Plane(c, l, kv);
      for (size_t i = 0; i < kDst.size(); ++i) {
        for (int64_t t = 0; t < s.block_size; ++t) {
          for (int64_t h = 0; h < s.num_kv_heads; ++h) {
            for (int64_t d = 0; d < s.head_dim; ++d) {
              const float want = PrefillValue(l, kv, kSrc[i], t, rank * s.num_kv_heads + h, d);
              const float got =
                  p[((kDst[i] * s.block_size + t) * s.num_kv_heads + h) * s.head_dim + d];
              bad += std::memcmp(&want, &got, sizeof(float)) != 0;
            }
          }
        }
      }
    }
  }
  return bad;
}

// Rank 1's hooks: a ShardKvReceiver that also compares its blocks byte for
// byte on every check of kDst.
class VerifyingHooks final : public ShardKvHooks {
 public:
  explicit VerifyingHooks(ShardKvReceiver& inner) : inner_(inner) {}
  void Release() override { inner_.Release(); }
  absl::StatusOr<model::KvCache*> Allocate(const model::KvCacheShape& shape) override {
    return inner_.Allocate(shape);
  }
  absl::Status Register(model::KvCache& kv) override { return inner_.Register(kv); }
  absl::Status Check(model::KvCache& kv, const std::vector<int32_t>& blocks) override {
    absl::Status s = inner_.Check(kv, blocks);
    if (s.ok() && blocks == kDst) {
      ++checks;
      mismatches += Mismatches(kv, 1);
    }
    return s;
  }
  int checks = 0;
  int64_t mismatches = 0;

 private:
  ShardKvReceiver& inner_;
};

struct Joined {
  std::unique_ptr<ShmCommunicator> comm;
  std::unique_ptr<StepRing> ring;
};

absl::StatusOr<Joined> Join(const std::string& id, int rank) {
  ShmCommunicatorOptions co;
  co.instance_id = id;
  co.rank = rank;
  co.world_size = 2;
  co.timeout = absl::Seconds(30);
  StepRingOptions ro;
  ro.instance_id = id;
  ro.rank = rank;
  ro.world_size = 2;
  ro.timeout = absl::Seconds(30);
  Joined j;
  ASSIGN_OR_RETURN(j.comm, ShmCommunicator::Join(co));
  ASSIGN_OR_RETURN(j.ring, StepRing::Join(ro));
  return j;
}

// Rank 1's life. Exit 0: stopped after at least one byte-exact check; 30:
// a mismatch; 31: no check of kDst; 20: UNAVAILABLE; others: set-up.
int ShardRank(const std::string& id) {
  auto j = Join(id, 1);
  if (!j.ok()) return 10;
  auto cfg = model::LoadModelConfig(kModelDir);
  auto ckpt = model::SafetensorsCheckpoint::Open(kModelDir);
  if (!cfg.ok() || !ckpt.ok()) return 11;
  model::Qwen2WeightsOptions wo;
  wo.shard = {1, 2};
  auto w = model::Qwen2Weights::Load(**ckpt, cfg->text, wo);
  if (!w.ok()) return 12;
  model::cpu::ThreadPool pool(1);
  model::Qwen2Model m(cfg->text, **w, pool, {model::cpu::LinearKernel::kDot, j->comm.get()});
  auto ucx = transfer::UcxContext::Create(transfer::TransportProfile::kShm);
  if (!ucx.ok()) return 13;
  ShardKvReceiver rx(**ucx, *j->comm, {.name = "rank1"});
  VerifyingHooks hooks(rx);
  absl::Status s = RunShardSteps(*j->ring, m, {}, &hooks);
  if (!s.ok()) {
    std::fprintf(stderr, "shard rank: %s\n", s.ToString().c_str());
    return absl::IsUnavailable(s) ? 20 : 14;
  }
  if (hooks.mismatches != 0) return 30;
  return hooks.checks > 0 ? 0 : 31;
}

struct Rank0 {
  Joined joined;
  std::unique_ptr<transfer::UcxContext> ucx;
  std::unique_ptr<TpKvReceivers> rx;
  model::KvCache* kv = nullptr;  // in rx
};

void StartRank0(const std::string& id, Rank0* r) {
  auto j = Join(id, 0);
  REQUIRE(j.ok());
  r->joined = std::move(*j);
  auto cfg = model::LoadModelConfig(kModelDir);
  REQUIRE(cfg.ok());
  // Rank 0's cache: its half of the KV heads (as the shard's model shapes it).
  model::KvCacheShape shape{cfg->text.num_hidden_layers, kBlocks, kBlockSize,
                            cfg->text.num_key_value_heads / 2,
                            cfg->text.hidden_size / cfg->text.num_attention_heads};
  REQUIRE(AllocateKvOnAllRanks(*r->joined.ring, kBlocks, kBlockSize).ok());
  auto ucx = transfer::UcxContext::Create(transfer::TransportProfile::kShm);
  REQUIRE(ucx.ok());
  r->ucx = std::move(*ucx);
  auto rank0 = transfer::KvHandoffReceiver::CreateWithCache(*r->ucx, shape, {.name = "rank0"});
  REQUIRE(rank0.ok());
  r->kv = (*rank0)->owned_cache();
  auto rx = TpKvReceivers::Create(std::move(*rank0), r->joined.ring.get(), r->joined.comm.get());
  INFO(rx.status().ToString());
  REQUIRE(rx.ok());
  r->rx = std::move(*rx);
}

TEST_CASE("each decode rank receives exactly its KV heads; checks gather every rank's CRC",
          "[tp_kv_receiver]") {
  const std::string id = UniqueInstanceId("tp-kv");
  const pid_t rank1 = ForkChild([&] { return ShardRank(id); });
  Rank0 r;
  StartRank0(id, &r);
  const std::vector<transfer::KvHandoffTarget>& targets = r.rx->targets();
  REQUIRE(targets.size() == 2);
  CHECK(targets[0].worker_address != targets[1].worker_address);
  CHECK(targets[1].shape.num_kv_heads == r.kv->shape().num_kv_heads);
  const int64_t heads = r.kv->shape().num_kv_heads;

  auto prefill = model::KvCache::Create(WithHeads(r.kv->shape(), 2 * heads));
  REQUIRE(prefill.ok());
  FillPrefill(**prefill);
  auto tx = transfer::KvHandoffSender::Create(*r.ucx, **prefill, {.name = "prefill"});
  REQUIRE(tx.ok());
  // A fence first, as AllocateKv does.
  auto fence = r.rx->Check({});
  REQUIRE(fence.ok());
  CHECK(fence->size() == 2);
  std::vector<uint32_t> sent;
  for (int rank = 0; rank < 2; ++rank) {
    transfer::KvHandoffPath path = transfer::KvHandoffPath::kPut;
    auto crc = (*tx)->Send(targets[rank], kSrc, kDst, Deadline::After(absl::Seconds(10)),
                           rank * heads, &path);
    INFO(crc.status().ToString());
    REQUIRE(crc.ok());
    // Every rank's cache lies in a shared segment the sender maps (shm).
    CHECK(path == transfer::KvHandoffPath::kMapped);
    CHECK(*crc == transfer::KvBlocksCrc(**prefill, kSrc, rank * heads, heads));
    sent.push_back(*crc);
  }
  CHECK(sent[0] != sent[1]);
  auto crcs = r.rx->Check(kDst);
  INFO(crcs.status().ToString());
  REQUIRE(crcs.ok());
  CHECK(*crcs == sent);
  CHECK(Mismatches(*r.kv, 0) == 0);
  // A block out of range is refused before any rank is asked.
  CHECK(r.rx->Check({static_cast<int32_t>(kBlocks)}).status().code() ==
        absl::StatusCode::kInvalidArgument);
  // The ranks still agree after the refusal.
  auto again = r.rx->Check(kDst);
  REQUIRE(again.ok());
  CHECK(*again == sent);
  REQUIRE(StopShardSteps(*r.joined.ring).ok());
  CHECK(WaitChild(rank1) == 0);  // rank 1 found its blocks byte-exact
}

TEST_CASE("a decode rank killed mid-hand-off: the sender and the check fail, bounded",
          "[tp_kv_receiver]") {
  const std::string id = UniqueInstanceId("tp-kv-kill");
  const pid_t rank1 = ForkChild([&] { return ShardRank(id); });
  Rank0 r;
  StartRank0(id, &r);
  const int64_t heads = r.kv->shape().num_kv_heads;
  auto prefill = model::KvCache::Create(WithHeads(r.kv->shape(), 2 * heads));
  REQUIRE(prefill.ok());
  FillPrefill(**prefill);
  auto tx = transfer::KvHandoffSender::Create(*r.ucx, **prefill, {.name = "prefill"});
  REQUIRE(tx.ok());
  REQUIRE((*tx)->Send(r.rx->targets()[0], kSrc, kDst, Deadline::After(absl::Seconds(10)), 0).ok());
  // Rank 1 dies before its slice is written.
  REQUIRE(kill(rank1, SIGKILL) == 0);
  CHECK(WaitChild(rank1) == 128 + SIGKILL);
  Stopwatch clock;
  auto lost = (*tx)->Send(r.rx->targets()[1], kSrc, kDst, Deadline::After(absl::Seconds(5)), heads);
  CHECK_FALSE(lost.ok());
  auto crcs = r.rx->Check(kDst);
  CHECK(crcs.status().code() == absl::StatusCode::kUnavailable);
  CHECK(clock.ElapsedSeconds() < 10);
}

}  // namespace
}  // namespace mmserve::worker
