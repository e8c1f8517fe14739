#include "common/worker_pool.h"

#include <atomic>
#include <catch2/catch.hpp>
#include <thread>

#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/notification.h"

namespace mmserve {
namespace {

TEST_CASE("every posted task runs once, on the pool's threads") {
  WorkerPool pool({.name = "test", .threads = 3});
  std::atomic<int> sum{0};
  absl::BlockingCounter done(100);
  const std::thread::id me = std::this_thread::get_id();
  std::atomic<bool> elsewhere{true};
  for (int i = 1; i <= 100; ++i) {
    REQUIRE(pool.Post([&, i] {
      if (std::this_thread::get_id() == me) elsewhere = false;
      sum += i;
      done.DecrementCount();
    }));
  }
  done.Wait();
  CHECK(sum == 5050);
  CHECK(elsewhere);
}

TEST_CASE("tasks run side by side on several threads") {
  WorkerPool pool({.name = "test", .threads = 2});
  // Each task waits for the other: only two threads at once get both done.
  absl::Notification a;
  absl::Notification b;
  absl::BlockingCounter done(2);
  pool.Post([&] {
    a.Notify();
    b.WaitForNotification();
    done.DecrementCount();
  });
  pool.Post([&] {
    b.Notify();
    a.WaitForNotification();
    done.DecrementCount();
  });
  done.Wait();
}

TEST_CASE("Stop drops queued tasks, lets running ones finish and refuses new ones") {
  WorkerPool pool({.name = "test", .threads = 1});
  absl::Notification running;
  absl::Notification release;
  std::atomic<bool> finished{false};
  std::atomic<int> queued_ran{0};
  pool.Post([&] {
    running.Notify();
    release.WaitForNotification();
    finished = true;
  });
  running.WaitForNotification();
  for (int i = 0; i < 3; ++i) pool.Post([&] { ++queued_ran; });
  std::thread stopper([&] { pool.Stop(); });  // returns once the threads ended
  // Release the running task only once the queue has been dropped.
  while (!pool.stopping()) std::this_thread::yield();
  release.Notify();
  stopper.join();
  CHECK(finished);
  CHECK(queued_ran == 0);
  CHECK_FALSE(pool.Post([&] { ++queued_ran; }));
  pool.Stop();  // idempotent
}

}  // namespace
}  // namespace mmserve
