// The step ring with its ranks in real forked processes.
#include "worker/step_ring.h"

#include <signal.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "worker/fork_ranks.h"

namespace mmserve::worker {
namespace {

bool SegmentExists(const std::string& id) {
  return access(("/dev/shm" + StepRingName(id)).c_str(), F_OK) == 0;
}

StepRingOptions Options(const std::string& id, int rank, int world) {
  StepRingOptions o;
  o.instance_id = id;
  o.rank = rank;
  o.world_size = world;
  o.num_slots = 2;  // rank 0 often waits for a free slot
  o.slot_bytes = 64 * 1024;
  o.timeout = absl::Seconds(20);
  return o;
}

// Step s: s % 7 + 1 decode rows whose token ids and slots encode s.
StepMessage StepNumber(int64_t s) {
  StepMessage m;
  const int64_t rows = s % 7 + 1;
  for (int64_t r = 0; r < rows; ++r) {
    m.batch.token_ids.push_back(static_cast<int32_t>(s * 10 + r));
    m.batch.slot_mapping.push_back(s + r);
    m.batch.sequences.push_back({r, 1, s + 1, std::vector<int32_t>(s % 5 + 1, 3)});
    m.batch.logits_rows.push_back(r);
  }
  for (int c = 0; c < 3; ++c) {
    for (int64_t r = 0; r < rows; ++r) m.batch.positions.push_back(s);
  }
  return m;
}

bool Same(const StepMessage& a, const StepMessage& b) {
  if (a.batch.sequences.size() != b.batch.sequences.size()) return false;
  for (size_t i = 0; i < a.batch.sequences.size(); ++i) {
    if (a.batch.sequences[i].block_table != b.batch.sequences[i].block_table) return false;
  }
  return a.kind == b.kind && a.batch.token_ids == b.batch.token_ids &&
         a.batch.positions == b.batch.positions && a.batch.slot_mapping == b.batch.slot_mapping &&
         a.batch.logits_rows == b.batch.logits_rows;
}

TEST_CASE("every rank takes every step rank 0 publishes, in order, through a 2-slot ring",
          "[step_ring]") {
  const int world = 3;
  constexpr int kSteps = 500;
  const std::string id = UniqueInstanceId("ring");
  std::vector<int> codes = RunForkedRanks(world, [&](int rank) {
    auto ring = StepRing::Join(Options(id, rank, world));
    if (!ring.ok()) return 10;
    if (SegmentExists(id)) return 11;
    if (rank == 0) {
      for (int s = 0; s < kSteps; ++s) {
        if (!(*ring)->Publish(StepNumber(s)).ok()) return 12;
      }
      StepMessage stop;
      stop.kind = StepKind::kStop;
      return (*ring)->Publish(stop).ok() ? 0 : 13;
    }
    StepMessage m;
    for (int s = 0; s < kSteps; ++s) {
      if (!(*ring)->Next(&m).ok()) return 14;
      if (!Same(m, StepNumber(s))) return 15;
    }
    if (!(*ring)->Next(&m).ok() || m.kind != StepKind::kStop) return 16;
    return (*ring)->steps() == kSteps + 1 ? 0 : 17;
  });
  CHECK(codes == std::vector<int>(world, 0));
  CHECK_FALSE(SegmentExists(id));
}

TEST_CASE("ranks waiting for a step fail with UNAVAILABLE when rank 0 is killed",
          "[step_ring][fault]") {
  const std::string id = UniqueInstanceId("ring-rank0");
  const pid_t rank0 = ForkChild([&] {
    auto ring = StepRing::Join(Options(id, 0, 2));
    if (!ring.ok()) return 10;
    if (!(*ring)->Publish(StepNumber(0)).ok()) return 11;
    raise(SIGKILL);
    return 12;
  });
  auto ring = StepRing::Join(Options(id, 1, 2));
  REQUIRE(ring.ok());
  StepMessage m;
  REQUIRE((*ring)->Next(&m).ok());  // published before rank 0 died
  absl::Status s = (*ring)->Next(&m);
  INFO(s.ToString());
  CHECK(absl::IsUnavailable(s));
  CHECK(absl::IsUnavailable((*ring)->Next(&m)));
  CHECK(WaitChild(rank0) == 128 + SIGKILL);
  CHECK_FALSE(SegmentExists(id));
}

TEST_CASE("rank 0 fails with UNAVAILABLE when a rank it waits for is killed",
          "[step_ring][fault]") {
  const std::string id = UniqueInstanceId("ring-rank1");
  const pid_t rank1 = ForkChild([&] {
    auto ring = StepRing::Join(Options(id, 1, 2));
    if (!ring.ok()) return 10;
    raise(SIGKILL);  // takes no step
    return 11;
  });
  StepRingOptions o = Options(id, 0, 2);
  o.timeout = absl::Seconds(120);  // only the dead-peer check can end the wait
  auto ring = StepRing::Join(o);
  REQUIRE(ring.ok());
  absl::Status s = absl::OkStatus();
  int published = 0;
  while (s.ok() && published < 10) {
    s = (*ring)->Publish(StepNumber(published));
    if (s.ok()) ++published;
  }
  INFO(s.ToString());
  CHECK(absl::IsUnavailable(s));
  CHECK(published == 2);  // the two slots filled, then no slot came free
  CHECK(WaitChild(rank1) == 128 + SIGKILL);
  CHECK_FALSE(SegmentExists(id));
}

TEST_CASE("step ring misuse and bad options are refused", "[step_ring]") {
  StepRingOptions o = Options(UniqueInstanceId("ring-bad"), 0, 1);
  o.num_slots = 0;
  CHECK(absl::IsInvalidArgument(StepRing::Join(o).status()));
  o.num_slots = 2;
  o.slot_bytes = 100;
  CHECK(absl::IsInvalidArgument(StepRing::Join(o).status()));
  o.slot_bytes = 1024;
  o.instance_id = "a/b";
  CHECK(absl::IsInvalidArgument(StepRing::Join(o).status()));

  const std::string id = UniqueInstanceId("ring-misuse");
  std::vector<int> codes = RunForkedRanks(2, [&](int rank) {
    StepRingOptions ro = Options(id, rank, 2);
    ro.slot_bytes = 256;
    auto ring = StepRing::Join(ro);
    if (!ring.ok()) return 10;
    StepMessage m;
    if (rank == 0) {
      if (!absl::IsFailedPrecondition((*ring)->Next(&m))) return 11;
      // Too big for a 256-byte slot: refused, and the ring still works.
      if (!absl::IsResourceExhausted((*ring)->Publish(StepNumber(6)))) return 12;
      return (*ring)->Publish(StepNumber(0)).ok() ? 0 : 13;
    }
    if (!absl::IsFailedPrecondition((*ring)->Publish(m))) return 14;
    if (!(*ring)->Next(&m).ok()) return 15;
    return Same(m, StepNumber(0)) ? 0 : 16;
  });
  CHECK(codes == std::vector<int>{0, 0});
}

}  // namespace
}  // namespace mmserve::worker
