#include "common/event_loop.h"

#include <atomic>
#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"

namespace mmserve {
namespace {

// Records what ran, in order; readable from the test thread.
class Log {
 public:
  void Add(int v) {
    absl::MutexLock lock(&mu_);
    seen_.push_back(v);
  }
  // Waits until `n` entries are in.
  std::vector<int> WaitFor(size_t n) {
    absl::MutexLock lock(&mu_);
    n_ = n;
    mu_.Await(absl::Condition(this, &Log::Enough));
    return seen_;
  }

 private:
  bool Enough() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return seen_.size() >= n_; }
  absl::Mutex mu_;
  std::vector<int> seen_ ABSL_GUARDED_BY(mu_);
  size_t n_ ABSL_GUARDED_BY(mu_) = 0;
};

// A sleeper that counts its wake-ups and says when the loop first sleeps,
// as UCX's would poll an fd.
class CountingSleeper : public LoopSleeper {
 public:
  explicit CountingSleeper(std::atomic<int>* wakes, absl::Notification* slept = nullptr)
      : wakes_(wakes), slept_(slept) {}
  void Wake() override {
    ++*wakes_;
    absl::MutexLock lock(&mu_);
    woken_ = true;
  }
  void Sleep(Deadline until) override {
    absl::MutexLock lock(&mu_);
    if (slept_ != nullptr && !slept_->HasBeenNotified()) slept_->Notify();
    mu_.AwaitWithTimeout(absl::Condition(&woken_), until.Remaining());
    woken_ = false;
  }

 private:
  std::atomic<int>* wakes_;
  absl::Notification* slept_;
  absl::Mutex mu_;
  bool woken_ ABSL_GUARDED_BY(mu_) = false;
};

TEST_CASE("posted tasks run in posting order on the loop thread") {
  EventLoop loop({.name = "test"});
  Log log;
  std::atomic<bool> on_loop{true};
  for (int i = 0; i < 100; ++i) {
    REQUIRE(loop.Post([&, i] {
      if (!loop.IsInLoopThread()) on_loop = false;
      log.Add(i);
    }));
  }
  std::vector<int> seen = log.WaitFor(100);
  for (int i = 0; i < 100; ++i) CHECK(seen[i] == i);
  CHECK(on_loop);
  CHECK_FALSE(loop.IsInLoopThread());
}

TEST_CASE("tasks posted from many threads all run, each thread's in order") {
  EventLoop loop({.name = "test"});
  Log log;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) loop.Post([&log, t, i] { log.Add(t * 1000 + i); });
    });
  }
  for (std::thread& t : threads) t.join();
  std::vector<int> seen = log.WaitFor(800);
  std::vector<int> next(4, 0);
  for (int v : seen) {
    CHECK(v % 1000 == next[v / 1000]);
    ++next[v / 1000];
  }
}

TEST_CASE("RunAndWait returns the function's result, inline on the loop thread") {
  EventLoop loop({.name = "test"});
  int state = 41;  // loop thread only
  absl::StatusOr<int> r = loop.RunAndWait([&]() -> absl::StatusOr<int> { return ++state; });
  REQUIRE(r.ok());
  CHECK(*r == 42);
  // From a task: no deadlock, runs inline.
  absl::StatusOr<int> nested = loop.RunAndWait([&]() -> absl::StatusOr<int> {
    absl::StatusOr<int> inner = loop.RunAndWait([&]() -> absl::StatusOr<int> { return ++state; });
    return inner.ok() ? *inner * 10 : -1;
  });
  REQUIRE(nested.ok());
  CHECK(*nested == 430);
  absl::Status s = loop.RunAndWait([] { return absl::InvalidArgumentError("no"); });
  CHECK(absl::IsInvalidArgument(s));
}

TEST_CASE("after Stop, Post is refused and RunAndWait answers Unavailable") {
  EventLoop loop({.name = "test"});
  loop.Stop();
  CHECK(loop.stopping());
  bool ran = false;
  CHECK_FALSE(loop.Post([&] { ran = true; }));
  CHECK_FALSE(loop.PostAfter(absl::ZeroDuration(), [&] { ran = true; }));
  absl::Status s = loop.RunAndWait([] { return absl::OkStatus(); });
  CHECK(absl::IsUnavailable(s));
  CHECK_FALSE(ran);
  loop.Stop();  // idempotent
}

TEST_CASE("Stop drains queued tasks by default and drops them with kDrop") {
  for (EventLoopOptions::OnStop mode :
       {EventLoopOptions::OnStop::kDrain, EventLoopOptions::OnStop::kDrop}) {
    std::atomic<int> ran{0};
    absl::Notification release;
    absl::Notification blocked;
    EventLoopOptions options{.name = "test"};
    options.on_stop = mode;
    EventLoop loop(std::move(options));
    loop.Post([&] {
      blocked.Notify();
      release.WaitForNotification();
    });
    blocked.WaitForNotification();
    for (int i = 0; i < 5; ++i) loop.Post([&] { ++ran; });
    // A caller waiting on a task that a kDrop stop destroys gets Unavailable.
    ReplyWaiter<absl::Status> waiter;
    loop.Post([reply = waiter.MakeReply()]() mutable { reply.Send(absl::OkStatus()); });
    std::thread stopper([&] { loop.Stop(); });  // returns once the loop thread ended
    // Release the blocked task only once Stop has marked the loop stopping.
    while (!loop.stopping()) std::this_thread::yield();
    release.Notify();
    stopper.join();
    const absl::Status waited = waiter.Wait();
    if (mode == EventLoopOptions::OnStop::kDrain) {
      CHECK(ran == 5);
      CHECK(waited.ok());
    } else {
      CHECK(ran == 0);
      CHECK(absl::IsUnavailable(waited));
    }
  }
}

TEST_CASE("timers fire in deadline order, ties in posting order") {
  EventLoop loop({.name = "test"});
  Log log;
  loop.PostAfter(absl::Milliseconds(30), [&] { log.Add(3); });
  loop.PostAfter(absl::Milliseconds(10), [&] { log.Add(1); });
  const Deadline tie = Deadline::After(absl::Milliseconds(20));
  loop.PostAt(tie, [&] { log.Add(2); });
  loop.PostAt(tie, [&] { log.Add(22); });
  loop.PostAfter(absl::ZeroDuration(), [&] { log.Add(0); });
  std::vector<int> seen = log.WaitFor(5);
  CHECK(seen == std::vector<int>{0, 1, 2, 22, 3});
}

TEST_CASE("a timer posted while the loop sleeps wakes it") {
  std::atomic<int> wakes{0};
  absl::Notification slept;
  EventLoopOptions options{.name = "test"};
  options.sleeper = std::make_unique<CountingSleeper>(&wakes, &slept);
  EventLoop loop(std::move(options));
  slept.WaitForNotification();  // asleep with nothing to wait for
  absl::Notification fired;
  loop.PostAfter(absl::Milliseconds(1), [&] { fired.Notify(); });
  fired.WaitForNotification();
  CHECK(wakes >= 1);
}

TEST_CASE("a timer runs no earlier than its deadline") {
  EventLoop loop({.name = "test"});
  const Deadline at = Deadline::After(absl::Milliseconds(5));
  absl::Notification fired;
  bool early = true;
  loop.PostAt(at, [&] {
    early = !at.Expired();
    fired.Notify();
  });
  fired.WaitForNotification();
  CHECK_FALSE(early);
}

TEST_CASE("the step hook runs while it has work, then the loop sleeps until a message") {
  std::atomic<int> steps{0};
  std::atomic<int> work{3};  // the step hook's own backlog
  absl::Notification drained;
  EventLoopOptions options{.name = "test"};
  options.step = [&](bool) {
    ++steps;
    if (work > 0 && --work == 0) drained.Notify();
    return work > 0 ? Deadline::After(absl::ZeroDuration()) : Deadline::Never();
  };
  EventLoop loop(std::move(options));
  drained.WaitForNotification();
  // A message wakes the idle loop: one more round, one more step.
  const int before = loop.RunAndWait([&]() -> absl::StatusOr<int> { return steps.load(); }).value();
  CHECK(before >= 3);
  absl::Status s = loop.RunAndWait([] { return absl::OkStatus(); });
  CHECK(s.ok());
  CHECK(steps.load() >= before + 1);
  CHECK(work == 0);
}

TEST_CASE("the step hook's deadline wakes the loop without any message") {
  std::atomic<int> calls{0};
  absl::Notification again;
  EventLoopOptions options{.name = "test"};
  options.step = [&](bool) {
    if (++calls == 2) again.Notify();
    return calls < 2 ? Deadline::After(absl::Milliseconds(2)) : Deadline::Never();
  };
  EventLoop loop(std::move(options));
  again.WaitForNotification();
  CHECK(calls >= 2);
}

TEST_CASE("Stop from inside the loop ends it after the current task") {
  EventLoop loop({.name = "test"});
  absl::Notification stopped;
  bool later = false;
  loop.Post([&] {
    loop.Stop();  // returns without joining itself
    stopped.Notify();
  });
  stopped.WaitForNotification();
  CHECK(loop.stopping());
  CHECK_FALSE(loop.Post([&] { later = true; }));
  loop.Stop();  // joins
  CHECK_FALSE(later);
}

TEST_CASE("ReportFatal calls the owner's callback once") {
  std::atomic<int> calls{0};
  absl::Status got;
  EventLoopOptions options{.name = "test"};
  options.on_fatal = [&](absl::Status s) {
    ++calls;
    got = s;
  };
  EventLoop loop(std::move(options));
  loop.RunAndWait([&] {
        loop.ReportFatal(absl::UnavailableError("rank lost"));
        loop.ReportFatal(absl::InternalError("again"));
        return absl::OkStatus();
      })
      .IgnoreError();
  CHECK(calls == 1);
  CHECK(absl::IsUnavailable(got));
  CHECK(got.message() == "rank lost");
}

TEST_CASE("a custom sleeper is woken by every post and by Stop") {
  std::atomic<int> wakes{0};
  Log log;
  {
    EventLoopOptions options{.name = "test"};
    options.sleeper = std::make_unique<CountingSleeper>(&wakes);
    EventLoop loop(std::move(options));
    for (int i = 0; i < 10; ++i) loop.Post([&, i] { log.Add(i); });
    CHECK(log.WaitFor(10).size() == 10);
    loop.PostAfter(absl::Milliseconds(1), [&] { log.Add(10); });
    CHECK(log.WaitFor(11).back() == 10);
  }
  CHECK(wakes >= 12);
}

struct Add {
  int value;
};
struct Sum {
  Reply<absl::StatusOr<int>> reply;
};
using Message = std::variant<Add, Sum>;

TEST_CASE("a message loop hands every message to one handler, and Call gets the reply") {
  int total = 0;  // the handler's state: loop thread only
  MessageLoop<Message> inbox(
      [&](Message& m) {
        if (auto* add = std::get_if<Add>(&m)) total += add->value;
        if (auto* sum = std::get_if<Sum>(&m)) sum->reply.Send(total);
      },
      {.name = "inbox"});
  for (int i = 1; i <= 10; ++i) REQUIRE(inbox.Post(Add{i}));
  absl::StatusOr<int> sum = inbox.Call<absl::StatusOr<int>>(
      [](Reply<absl::StatusOr<int>> r) { return Message(Sum{std::move(r)}); });
  REQUIRE(sum.ok());
  CHECK(*sum == 55);
  inbox.Stop();
  absl::StatusOr<int> late = inbox.Call<absl::StatusOr<int>>(
      [](Reply<absl::StatusOr<int>> r) { return Message(Sum{std::move(r)}); });
  CHECK(absl::IsUnavailable(late.status()));
}

TEST_CASE("a reply the handler never sends answers Unavailable") {
  MessageLoop<Message> inbox([](Message&) {}, {.name = "inbox"});
  absl::StatusOr<int> r = inbox.Call<absl::StatusOr<int>>(
      [](Reply<absl::StatusOr<int>> reply) { return Message(Sum{std::move(reply)}); });
  CHECK(absl::IsUnavailable(r.status()));
}

}  // namespace
}  // namespace mmserve
