#include "model/cpu/thread_pool.h"

#include <atomic>
#include <catch2/catch.hpp>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

namespace mmserve::model::cpu {
namespace {

TEST_CASE("parallel-for covers every index exactly once in chunks of at most grain",
          "[thread_pool]") {
  ThreadPool pool(3);
  REQUIRE(pool.num_threads() == 3);
  for (int64_t n : {1, 7, 64, 1000}) {
    for (int64_t grain : {1, 3, 16}) {
      std::vector<std::atomic<int>> hits(n);
      std::atomic<bool> chunk_too_long{false};
      pool.ParallelFor(n, grain, [&](int64_t b, int64_t e) {
        if (e - b > grain || b >= e) chunk_too_long = true;
        for (int64_t i = b; i < e; ++i) hits[i].fetch_add(1);
      });
      CHECK_FALSE(chunk_too_long.load());
      for (int64_t i = 0; i < n; ++i) REQUIRE(hits[i].load() == 1);
    }
  }
}

TEST_CASE("parallel-for spreads work over more than one thread", "[thread_pool]") {
  ThreadPool pool(2);
  std::mutex mu;
  std::set<std::thread::id> ids;
  // Retry: on a loaded machine one thread may take every chunk of a loop.
  for (int attempt = 0; attempt < 200 && ids.size() < 2; ++attempt) {
    pool.ParallelFor(64, 1, [&](int64_t, int64_t) {
      volatile double x = 0;
      for (int i = 0; i < 20000; ++i) x = x + i;
      std::lock_guard<std::mutex> lock(mu);
      ids.insert(std::this_thread::get_id());
    });
  }
  CHECK(ids.size() == 2);
}

TEST_CASE("a one-thread pool runs the loop on the caller", "[thread_pool]") {
  ThreadPool pool(1);
  std::thread::id caller = std::this_thread::get_id();
  bool other = false;
  int64_t total = 0;
  pool.ParallelFor(10, 2, [&](int64_t b, int64_t e) {
    other |= std::this_thread::get_id() != caller;
    total += e - b;
  });
  CHECK_FALSE(other);
  CHECK(total == 10);
}

TEST_CASE("many short loops in a row all complete (workers sleep and wake)", "[thread_pool]") {
  ThreadPool pool(2);
  int64_t sum = 0;
  for (int round = 0; round < 2000; ++round) {
    std::atomic<int64_t> s{0};
    pool.ParallelFor(4, 1, [&](int64_t b, int64_t e) { s += e - b; });
    sum += s.load();
    if (round % 500 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  CHECK(sum == 8000);
}

}  // namespace
}  // namespace mmserve::model::cpu
