#include "transfer/block_allocator.h"

#include <catch2/catch.hpp>
#include <random>
#include <thread>
#include <vector>

namespace mmserve::transfer {
namespace {

TEST_CASE("allocations: default blocks, exact blocks, contiguous runs") {
  BlockAllocator alloc({.block_size = 128, .num_blocks = 64, .default_num_blocks = 8});
  auto a = alloc.AllocDefault("req-1");
  REQUIRE(a.ok());
  CHECK(*a == BlockAllocation{0, 8, 1024});
  auto b = alloc.Alloc(2000, "req-2");
  REQUIRE(b.ok());
  CHECK(*b == BlockAllocation{8, 16, 2000});
  auto c = alloc.Alloc(976, "req-1");
  REQUIRE(c.ok());
  CHECK(c->num_blocks == 8);
  CHECK(alloc.used_blocks() == 32);
  CHECK(alloc.Free(*a, "req-1").ok());
  CHECK(alloc.Free(*b, "req-2").ok());
  CHECK(alloc.Free(*c, "req-1").ok());
  CHECK(alloc.used_blocks() == 0);
}

TEST_CASE("a full pool reports exhaustion and a pool-sized request is rejected outright") {
  BlockAllocator alloc({.block_size = 16, .num_blocks = 4, .default_num_blocks = 2});
  auto a = alloc.Alloc(64, "a");
  REQUIRE(a.ok());
  CHECK(absl::IsResourceExhausted(alloc.Alloc(1, "b").status()));
  CHECK(absl::IsResourceExhausted(alloc.AllocDefault("b").status()));
  CHECK(absl::IsInvalidArgument(alloc.Alloc(65, "b").status()));
  CHECK(absl::IsInvalidArgument(alloc.Alloc(0, "b").status()));
}

TEST_CASE("free rejects runs the caller does not hold and changes nothing") {
  BlockAllocator alloc({.block_size = 16, .num_blocks = 8, .default_num_blocks = 2});
  auto a = alloc.Alloc(32, "a");
  REQUIRE(a.ok());
  CHECK(absl::IsFailedPrecondition(alloc.Free(*a, "someone-else")));
  CHECK(absl::IsFailedPrecondition(alloc.Free({a->start_block, 1, 16}, "a")));
  CHECK(alloc.used_blocks() == 2);
  CHECK(alloc.Free(*a, "a").ok());
  CHECK(absl::IsFailedPrecondition(alloc.Free(*a, "a")));  // double free
}

TEST_CASE("freed neighbours coalesce so a fragmented pool serves a large run again") {
  BlockAllocator alloc({.block_size = 1, .num_blocks = 8, .default_num_blocks = 1});
  std::vector<BlockAllocation> runs;
  for (int i = 0; i < 8; ++i) runs.push_back(*alloc.Alloc(1, "r"));
  for (int i = 0; i < 8; i += 2) REQUIRE(alloc.Free(runs[i], "r").ok());
  CHECK(alloc.free_blocks() == 4);
  CHECK(alloc.largest_free_run() == 1);
  CHECK(absl::IsResourceExhausted(alloc.Alloc(2, "big").status()));  // fragmented
  for (int i = 1; i < 8; i += 2) REQUIRE(alloc.Free(runs[i], "r").ok());
  CHECK(alloc.num_free_runs() == 1);
  CHECK(alloc.largest_free_run() == 8);
  CHECK(alloc.Alloc(8, "big").ok());
}

TEST_CASE("random alloc/free never overlaps, never leaks, and coalesces back to one run") {
  std::mt19937 rng(12345);
  for (int round = 0; round < 20; ++round) {
    const uint32_t num_blocks = 1 + rng() % 64;
    BlockAllocator alloc({.block_size = 8, .num_blocks = num_blocks, .default_num_blocks = 1});
    std::vector<BlockAllocation> live;
    for (int op = 0; op < 500; ++op) {
      if (live.empty() || rng() % 2 == 0) {
        uint32_t tokens = 1 + rng() % (8 * std::min<uint32_t>(num_blocks, 12));
        auto a = alloc.Alloc(tokens, "r");
        if (!a.ok()) {
          REQUIRE(absl::IsResourceExhausted(a.status()));
          REQUIRE(alloc.largest_free_run() < alloc.BlocksFor(tokens));
          continue;
        }
        REQUIRE(a->num_blocks == alloc.BlocksFor(tokens));
        REQUIRE(a->start_block + a->num_blocks <= num_blocks);
        for (const BlockAllocation& b : live) {
          bool disjoint = a->start_block + a->num_blocks <= b.start_block ||
                          b.start_block + b.num_blocks <= a->start_block;
          REQUIRE(disjoint);
        }
        live.push_back(*a);
      } else {
        size_t i = rng() % live.size();
        REQUIRE(alloc.Free(live[i], "r").ok());
        live.erase(live.begin() + i);
      }
      uint32_t used = 0;
      for (const BlockAllocation& b : live) used += b.num_blocks;
      REQUIRE(alloc.used_blocks() == used);
      REQUIRE(alloc.num_allocations() == live.size());
    }
    for (const BlockAllocation& b : live) REQUIRE(alloc.Free(b, "r").ok());
    CHECK(alloc.used_blocks() == 0);
    CHECK(alloc.num_free_runs() == 1);
    CHECK(alloc.largest_free_run() == num_blocks);
  }
}

TEST_CASE("AllocWait waits for a free instead of failing, and times out when none comes") {
  BlockAllocator alloc({.block_size = 4, .num_blocks = 4, .default_num_blocks = 1});
  auto all = alloc.Alloc(16, "holder");
  REQUIRE(all.ok());
  CHECK(absl::IsDeadlineExceeded(
      alloc.AllocWait(4, "waiter", Deadline::After(absl::Milliseconds(20))).status()));
  std::thread freer([&] {
    absl::SleepFor(absl::Milliseconds(20));  // the waiter is blocked by then, or soon
    REQUIRE(alloc.Free(*all, "holder").ok());
  });
  auto got = alloc.AllocWait(8, "waiter", Deadline::After(absl::Seconds(10)));
  freer.join();
  REQUIRE(got.ok());
  CHECK(got->num_blocks == 2);
}

TEST_CASE("a lease frees its blocks when it goes away") {
  BlockAllocator alloc({.block_size = 4, .num_blocks = 4, .default_num_blocks = 1});
  {
    BlockLease lease(alloc, *alloc.Alloc(8, "r"), "r");
    CHECK(alloc.used_blocks() == 2);
  }
  CHECK(alloc.used_blocks() == 0);
}

}  // namespace
}  // namespace mmserve::transfer
