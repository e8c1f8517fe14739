// DeferredActions: order, actions deferred by actions, and one runner at a
// time with many threads deferring and running at once (run under
// ThreadSanitizer by tools/tsan/run_tsan_tests.sh).
#include "router/deferred_actions.h"

#include <atomic>
#include <catch2/catch.hpp>
#include <thread>
#include <vector>

namespace mmserve::router {
namespace {

TEST_CASE("deferred actions run in the order deferred, only when Run is called") {
  DeferredActions deferred;
  std::vector<int> ran;
  deferred.Defer([&] { ran.push_back(1); });
  deferred.Defer([&] { ran.push_back(2); });
  CHECK(ran.empty());
  deferred.Run();
  CHECK(ran == std::vector<int>{1, 2});
  deferred.Run();  // nothing left
  CHECK(ran.size() == 2);
}

TEST_CASE("an action deferred by a running action runs in the same Run, after it") {
  DeferredActions deferred;
  std::vector<int> ran;
  deferred.Defer([&] {
    ran.push_back(1);
    deferred.Defer([&] { ran.push_back(3); });
    deferred.Run();  // nested: returns at once, the outer Run goes on
    ran.push_back(2);
  });
  deferred.Run();
  CHECK(ran == std::vector<int>{1, 2, 3});
}

TEST_CASE("with many threads deferring and running, one runs at a time and none is lost") {
  DeferredActions deferred;
  constexpr int kThreads = 4;
  constexpr int kPerThread = 2000;
  std::atomic<int> running{0};
  std::atomic<int> overlaps{0};
  int done = 0;  // touched only by the runner: a race here is what TSan reports
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kPerThread; ++i) {
        deferred.Defer([&] {
          if (running.fetch_add(1) != 0) ++overlaps;
          ++done;
          running.fetch_sub(1);
        });
        deferred.Run();
      }
    });
  }
  for (auto& t : threads) t.join();
  deferred.Run();
  CHECK(overlaps.load() == 0);
  CHECK(done == kThreads * kPerThread);
}

}  // namespace
}  // namespace mmserve::router
