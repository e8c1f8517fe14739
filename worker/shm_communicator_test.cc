// The shared-memory communicator with its ranks in real forked processes.
#include "worker/shm_communicator.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstring>
#include <string>
#include <vector>

#include "worker/fork_ranks.h"

namespace mmserve::worker {
namespace {

bool SegmentExists(const std::string& id) {
  return access(("/dev/shm" + ShmSegmentName(id)).c_str(), F_OK) == 0;
}

ShmCommunicatorOptions Options(const std::string& id, int rank, int world) {
  ShmCommunicatorOptions o;
  o.instance_id = id;
  o.rank = rank;
  o.world_size = world;
  o.capacity_floats = 4096;  // small, so that large calls go in chunks
  o.timeout = absl::Seconds(20);
  return o;
}

// A value that differs by rank, index and call, with mixed signs and
// magnitudes so that the summation order matters.
float Value(int rank, int64_t i, int64_t call) {
  uint64_t x = (static_cast<uint64_t>(rank) * 1000003u + static_cast<uint64_t>(i)) * 2654435761u +
               static_cast<uint64_t>(call) * 40503u;
  x ^= x >> 13;
  x *= 0x9E3779B97F4A7C15ull;
  const float unit = static_cast<float>(x >> 40) / 16777216.0f - 0.5f;
  return unit * static_cast<float>(1 << (i % 11));
}

const std::vector<int64_t> kSizes = {1, 3, 17, 896, 4096, 4097, 16 * 896, 3 * 4096 + 1};

TEST_CASE("all-reduce sums are bitwise the serial sum in rank order, 1 float to large batches",
          "[shm_communicator]") {
  for (int world : {2, 3}) {
    const std::string id = UniqueInstanceId("allreduce");
    std::vector<int> codes = RunForkedRanks(world, [&](int rank) {
      auto comm = ShmCommunicator::Join(Options(id, rank, world));
      if (!comm.ok()) return 10;
      if (SegmentExists(id)) return 11;  // unlinked once every rank mapped it
      int64_t call = 0;
      for (int repeat = 0; repeat < 3; ++repeat) {
        for (int64_t n : kSizes) {
          std::vector<float> data(n), want(n);
          for (int64_t i = 0; i < n; ++i) {
            data[i] = Value(rank, i, call);
            float acc = Value(0, i, call);
            for (int r = 1; r < world; ++r) acc += Value(r, i, call);
            want[i] = acc;
          }
          if (!(*comm)->AllReduceSum(absl::MakeSpan(data)).ok()) return 12;
          if (std::memcmp(data.data(), want.data(), n * sizeof(float)) != 0) return 13;
          ++call;
        }
      }
      return 0;
    });
    INFO("world " << world);
    CHECK(codes == std::vector<int>(world, 0));
    CHECK_FALSE(SegmentExists(id));
  }
}

TEST_CASE("gather, all-gather and broadcast deliver every rank's data in rank order",
          "[shm_communicator]") {
  const int world = 3;
  const std::string id = UniqueInstanceId("gather");
  std::vector<int> codes = RunForkedRanks(world, [&](int rank) {
    auto comm = ShmCommunicator::Join(Options(id, rank, world));
    if (!comm.ok()) return 10;
    for (int64_t n : kSizes) {
      std::vector<float> in(n), want(world * n);
      for (int64_t i = 0; i < n; ++i) in[i] = Value(rank, i, n);
      for (int r = 0; r < world; ++r) {
        for (int64_t i = 0; i < n; ++i) want[r * n + i] = Value(r, i, n);
      }
      std::vector<float> out(world * n, -1.0f);
      if (!(*comm)->Gather(in, absl::MakeSpan(out)).ok()) return 11;
      if (rank == 0 && out != want) return 12;
      if (rank != 0 && out != std::vector<float>(world * n, -1.0f)) return 13;
      std::fill(out.begin(), out.end(), -1.0f);
      if (!(*comm)->AllGather(in, absl::MakeSpan(out)).ok()) return 14;
      if (out != want) return 15;
      std::vector<float> b = in;
      if (!(*comm)->Broadcast(absl::MakeSpan(b)).ok()) return 16;
      if (!std::equal(b.begin(), b.end(), want.begin())) return 17;
      if (!(*comm)->Barrier().ok()) return 18;
    }
    return 0;
  });
  CHECK(codes == std::vector<int>(world, 0));
  CHECK_FALSE(SegmentExists(id));
}

TEST_CASE("one rank alone needs no peers and leaves no segment", "[shm_communicator]") {
  const std::string id = UniqueInstanceId("solo");
  auto comm = ShmCommunicator::Join(Options(id, 0, 1));
  REQUIRE(comm.ok());
  CHECK_FALSE(SegmentExists(id));
  std::vector<float> data = {1.5f, -2.0f};
  REQUIRE((*comm)->AllReduceSum(absl::MakeSpan(data)).ok());
  CHECK(data == std::vector<float>{1.5f, -2.0f});
  std::vector<float> out(2);
  REQUIRE((*comm)->AllGather(data, absl::MakeSpan(out)).ok());
  CHECK(out == data);
  REQUIRE((*comm)->Barrier().ok());
}

TEST_CASE("a rank killed with SIGKILL mid-decode fails every survivor's call with UNAVAILABLE",
          "[shm_communicator][fault]") {
  const int world = 3;
  const std::string id = UniqueInstanceId("sigkill");
  // Rank 1 dies after 50 all-reduces; ranks 0 and 2 wait with a long timeout,
  // so only the dead-peer check can end their wait.
  std::vector<int> codes = RunForkedRanks(world, [&](int rank) {
    ShmCommunicatorOptions o = Options(id, rank, world);
    o.timeout = absl::Seconds(120);
    auto comm = ShmCommunicator::Join(o);
    if (!comm.ok()) return 10;
    std::vector<float> data(896, 1.0f);
    for (int step = 0; step < 1000; ++step) {
      if (rank == 1 && step == 50) raise(SIGKILL);
      absl::Status s = (*comm)->AllReduceSum(absl::MakeSpan(data));
      if (!s.ok()) {
        if (!absl::IsUnavailable(s) || step != 50) return 11;
        // Broken for good: the next call fails at once.
        if (!absl::IsUnavailable((*comm)->Barrier())) return 12;
        return 0;
      }
    }
    return 13;  // never noticed
  });
  CHECK(codes[0] == 0);
  CHECK(codes[1] == 128 + SIGKILL);
  CHECK(codes[2] == 0);
  CHECK_FALSE(SegmentExists(id));
}

TEST_CASE("rank 0 exiting without a word fails rank 1's call with UNAVAILABLE",
          "[shm_communicator][fault]") {
  const std::string id = UniqueInstanceId("rank0gone");
  const pid_t rank0 = ForkChild([&] {
    auto comm = ShmCommunicator::Join(Options(id, 0, 2));
    if (!comm.ok()) return 10;
    _exit(0);  // no destructor: the segment is not marked broken
  });
  const pid_t rank1 = ForkChild([&] {
    auto comm = ShmCommunicator::Join(Options(id, 1, 2));
    if (!comm.ok()) return 10;
    std::vector<float> data(4);
    absl::Status s = absl::OkStatus();
    for (int i = 0; i < 100 && s.ok(); ++i) s = (*comm)->AllReduceSum(absl::MakeSpan(data));
    return absl::IsUnavailable(s) ? 0 : 11;
  });
  CHECK(WaitChild(rank1) == 0);
  CHECK(WaitChild(rank0) == 0);
  CHECK_FALSE(SegmentExists(id));
}

TEST_CASE("a peer that stops responding fails the call with UNAVAILABLE at the timeout",
          "[shm_communicator][fault]") {
  const std::string id = UniqueInstanceId("stopped");
  const pid_t peer = ForkChild([&] {
    auto comm = ShmCommunicator::Join(Options(id, 1, 2));
    if (!comm.ok()) return 10;
    raise(SIGSTOP);
    return 0;
  });
  ShmCommunicatorOptions o = Options(id, 0, 2);
  o.timeout = absl::Milliseconds(300);
  auto comm = ShmCommunicator::Join(o);
  REQUIRE(comm.ok());
  std::vector<float> data(16);
  absl::Status s = (*comm)->AllReduceSum(absl::MakeSpan(data));
  INFO(s.ToString());
  CHECK(absl::IsUnavailable(s));
  CHECK(s.message().find("timed out") != std::string::npos);
  kill(peer, SIGKILL);
  CHECK(WaitChild(peer) == 128 + SIGKILL);
  CHECK_FALSE(SegmentExists(id));
}

TEST_CASE("Join fails with UNAVAILABLE when a rank never arrives, and removes the segment",
          "[shm_communicator][fault]") {
  const std::string id = UniqueInstanceId("absent");
  ShmCommunicatorOptions o = Options(id, 0, 2);
  o.timeout = absl::Milliseconds(200);
  auto comm = ShmCommunicator::Join(o);
  CHECK(absl::IsUnavailable(comm.status()));
  CHECK_FALSE(SegmentExists(id));
  // A non-zero rank whose rank 0 never creates the segment.
  ShmCommunicatorOptions o1 = Options(UniqueInstanceId("absent"), 1, 2);
  o1.timeout = absl::Milliseconds(100);
  CHECK(absl::IsUnavailable(ShmCommunicator::Join(o1).status()));
}

TEST_CASE("bad options are refused with INVALID_ARGUMENT", "[shm_communicator]") {
  const std::string id = UniqueInstanceId("bad");
  ShmCommunicatorOptions o = Options(id, 0, 2);
  o.instance_id = "../etc";
  CHECK(absl::IsInvalidArgument(ShmCommunicator::Join(o).status()));
  o.instance_id = "";
  CHECK(absl::IsInvalidArgument(ShmCommunicator::Join(o).status()));
  o = Options(id, 2, 2);
  CHECK(absl::IsInvalidArgument(ShmCommunicator::Join(o).status()));
  o = Options(id, -1, 2);
  CHECK(absl::IsInvalidArgument(ShmCommunicator::Join(o).status()));
  o = Options(id, 0, 0);
  CHECK(absl::IsInvalidArgument(ShmCommunicator::Join(o).status()));
  o = Options(id, 0, kMaxShmRanks + 1);
  CHECK(absl::IsInvalidArgument(ShmCommunicator::Join(o).status()));
  o = Options(id, 0, 2);
  o.capacity_floats = 8;
  CHECK(absl::IsInvalidArgument(ShmCommunicator::Join(o).status()));
  CHECK_FALSE(SegmentExists(id));
}

TEST_CASE("ranks that disagree on the world size or a call's size are refused",
          "[shm_communicator]") {
  SECTION("world size") {
    const std::string id = UniqueInstanceId("worlds");
    const pid_t peer = ForkChild([&] {
      ShmCommunicatorOptions o = Options(id, 1, 3);
      o.timeout = absl::Seconds(5);
      return absl::IsInvalidArgument(ShmCommunicator::Join(o).status()) ? 0 : 1;
    });
    ShmCommunicatorOptions o = Options(id, 0, 2);
    o.timeout = absl::Seconds(1);
    CHECK(absl::IsUnavailable(ShmCommunicator::Join(o).status()));
    CHECK(WaitChild(peer) == 0);
    CHECK_FALSE(SegmentExists(id));
  }
  SECTION("call size") {
    const std::string id = UniqueInstanceId("sizes");
    std::vector<int> codes = RunForkedRanks(2, [&](int rank) {
      auto comm = ShmCommunicator::Join(Options(id, rank, 2));
      if (!comm.ok()) return 10;
      std::vector<float> data(rank == 0 ? 10 : 11);
      if (!absl::IsInvalidArgument((*comm)->AllReduceSum(absl::MakeSpan(data)))) return 11;
      return absl::IsUnavailable((*comm)->Barrier()) ? 0 : 12;
    });
    CHECK(codes == std::vector<int>{0, 0});
  }
  SECTION("a rank taken twice") {
    const std::string id = UniqueInstanceId("twice");
    auto second_rank1 = [&] {
      ShmCommunicatorOptions o = Options(id, 1, 3);
      o.timeout = absl::Seconds(10);
      absl::Status s = ShmCommunicator::Join(o).status();
      if (absl::IsInvalidArgument(s)) return 2;
      if (absl::IsUnavailable(s)) return 3;
      return 1;
    };
    const pid_t a = ForkChild(second_rank1);
    const pid_t b = ForkChild(second_rank1);
    ShmCommunicatorOptions o = Options(id, 0, 3);
    o.timeout = absl::Seconds(2);
    CHECK(absl::IsUnavailable(ShmCommunicator::Join(o).status()));
    std::vector<int> codes = {WaitChild(a), WaitChild(b)};
    std::sort(codes.begin(), codes.end());
    CHECK(codes == std::vector<int>{2, 3});
    CHECK_FALSE(SegmentExists(id));
  }
}

}  // namespace
}  // namespace mmserve::worker
