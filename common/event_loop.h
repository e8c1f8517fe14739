// One thread that owns some state, fed by a queue: the loop every process
// shares (after llama.cpp's server queue: post, defer, start_loop).
//
//   EventLoop loop({.name = "core", .on_fatal = [](absl::Status s) { ... }});
//   loop.Post([&] { table.Insert(x); });                    // any thread
//   loop.PostAfter(absl::Seconds(1), [&] { table.Expire(); });
//   absl::StatusOr<int> n = loop.RunAndWait([&]() -> absl::StatusOr<int> {
//     return table.size();                                   // on the loop thread
//   });
//   DCHECK(loop.IsInLoopThread());                           // in state accessors
//
// A typed inbox: the owner names its messages and handles them in one place.
//
//   struct Submit { Request r; };
//   struct Count { Reply<absl::StatusOr<int>> reply; };
//   using Message = std::variant<Submit, Count>;
//   MessageLoop<Message> inbox([this](Message& m) { Handle(m); }, {.name = "core"});
//   inbox.Post(Submit{std::move(r)});
//   absl::StatusOr<int> n = inbox.Call<absl::StatusOr<int>>(
//       [](Reply<absl::StatusOr<int>> reply) { return Message(Count{std::move(reply)}); });
//
// A round of the loop runs the messages queued when it began, in order, then
// the timers that are due (by deadline, ties in posting order), then the
// owner's `step` hook, which returns when it wants to run next: an owner
// that drives an engine returns "now" while it has work and Never() when it
// has none; the loop then sleeps until a message, the next timer or that
// deadline. Messages and timers run one at a time on the loop thread and must
// not block on the loop itself (RunAndWait from the loop runs inline).
//
// Stopping: Stop() refuses new messages (Post returns false, RunAndWait and
// Call return Unavailable), then, per `on_stop`, runs (kDrain) or destroys
// (kDrop) what was queued; timers not yet due are destroyed either way. A
// Reply destroyed unanswered answers Unavailable, so no caller waits forever.
// Stop from the loop thread returns at once (the loop ends after the current
// message; the destructor or a later Stop joins). Destroying the loop from
// its own thread is a programmer error.
//
// A fatal error (the owner can no longer serve, e.g. a lost tensor-parallel
// rank) goes to ReportFatal: the first call runs `on_fatal`, given by main,
// which decides how the process ends (instead of the loop signalling its own
// process). Later calls only log.
//
// Thread-safety: every public method is thread-safe. The step hook, messages
// and timers run on the loop thread only.
#ifndef MMSERVE_COMMON_EVENT_LOOP_H_
#define MMSERVE_COMMON_EVENT_LOOP_H_

#include <atomic>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/clock.h"

namespace mmserve {

// How the loop thread sleeps when idle and how other threads wake it. The
// default waits on a mutex; a loop that must also wake on a file descriptor
// (UCX's event fd) supplies its own.
class LoopSleeper {
 public:
  virtual ~LoopSleeper() = default;
  // Any thread: makes the current Sleep, or the next one if none is under
  // way, return promptly.
  virtual void Wake() = 0;
  // Loop thread: returns by `until`, or soon after a Wake.
  virtual void Sleep(Deadline until) = 0;
};

struct EventLoopOptions {
  std::string name = "loop";
  // Loop thread, after every round; `worked` says whether the round ran any
  // message or timer. Returns when to call it again at the latest: an
  // expired deadline (Deadline::After(absl::ZeroDuration())) for right away,
  // Deadline::Never() to wait only for messages and timers. Optional.
  std::function<Deadline(bool worked)> step;
  // What ReportFatal calls the first time (on the reporting thread); it must
  // not destroy the loop. Optional: without it the status is logged.
  std::function<void(absl::Status)> on_fatal;
  // Optional; see LoopSleeper.
  std::unique_ptr<LoopSleeper> sleeper;
  enum class OnStop { kDrain, kDrop };
  OnStop on_stop = OnStop::kDrain;
};

// A one-shot answer to a caller blocked in RunAndWait or Call. Move-only;
// destroyed unanswered, it answers Unavailable. T must be constructible
// from absl::Status (absl::Status, absl::StatusOr<U>).
template <typename T>
class Reply {
 public:
  Reply() = default;
  Reply(Reply&&) = default;
  Reply& operator=(Reply&& other) {
    Abandon();
    state_ = std::move(other.state_);
    return *this;
  }
  ~Reply() { Abandon(); }

  // Answers the caller; later calls do nothing.
  void Send(T value) {
    if (state_ == nullptr) return;
    state_->value.emplace(std::move(value));
    state_->done.Notify();
    state_.reset();
  }

 private:
  template <typename>
  friend class ReplyWaiter;
  struct State {
    std::optional<T> value;  // written once, before done.Notify()
    absl::Notification done;
  };
  explicit Reply(std::shared_ptr<State> state) : state_(std::move(state)) {}
  void Abandon() {
    if (state_ != nullptr) Send(T(absl::UnavailableError("the request was dropped unanswered")));
  }
  std::shared_ptr<State> state_;
};

// The caller's end of a Reply.
template <typename T>
class ReplyWaiter {
 public:
  ReplyWaiter() : state_(std::make_shared<typename Reply<T>::State>()) {}
  Reply<T> MakeReply() { return Reply<T>(state_); }
  T Wait() {
    state_->done.WaitForNotification();
    return std::move(*state_->value);
  }

 private:
  std::shared_ptr<typename Reply<T>::State> state_;
};

class EventLoop {
 public:
  using Task = absl::AnyInvocable<void()>;

  // Starts the loop thread.
  explicit EventLoop(EventLoopOptions options = {});
  // Stop(), then joins. Not from the loop thread.
  ~EventLoop();
  EventLoop(const EventLoop&) = delete;
  EventLoop& operator=(const EventLoop&) = delete;

  // Queues `task`; false (and `task` destroyed here) once stopping.
  bool Post(Task task);
  // Runs `task` once `when` has passed (PostAfter: after `delay`); false
  // once stopping.
  bool PostAt(Deadline when, Task task);
  bool PostAfter(absl::Duration delay, Task task) {
    return PostAt(Deadline::After(delay), std::move(task));
  }

  // Runs `f` on the loop thread and returns its result: inline when called
  // there, else waits; Unavailable when stopping (or when a kDrop stop
  // dropped it). `f` returns absl::Status or absl::StatusOr<U>.
  template <typename F>
  std::invoke_result_t<F&> RunAndWait(F f) {
    using T = std::invoke_result_t<F&>;
    static_assert(std::is_constructible_v<T, absl::Status>,
                  "RunAndWait's function returns absl::Status or absl::StatusOr");
    if (IsInLoopThread()) return f();
    ReplyWaiter<T> waiter;
    if (!Post([f = std::move(f), reply = waiter.MakeReply()]() mutable { reply.Send(f()); })) {
      return T(StoppingError());
    }
    return waiter.Wait();
  }

  // Refuses new work, runs or drops what is queued (options.on_stop) and
  // joins the thread; from the loop thread, returns without joining.
  // Idempotent.
  void Stop();
  bool stopping() const;
  bool IsInLoopThread() const { return loop_thread_.load() == std::this_thread::get_id(); }

  // The owner can no longer serve: the first call runs options.on_fatal.
  void ReportFatal(absl::Status status);

  // The status RunAndWait and Call return once the loop is stopping.
  absl::Status StoppingError() const;

 private:
  void Run();
  // Takes the queued tasks and the due timers; false once stopping.
  bool TakeRound(std::deque<Task>& tasks, std::deque<Task>& due);
  void Idle(Deadline next);
  void RunStopped();
  bool Ready() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || !tasks_.empty(); }

  const std::string name_;
  const std::function<Deadline(bool)> step_;
  const std::function<void(absl::Status)> on_fatal_;
  // options.sleeper, or one on a mutex; woken by every Post, PostAt and Stop.
  const std::unique_ptr<LoopSleeper> sleeper_;
  const EventLoopOptions::OnStop on_stop_;
  std::atomic<bool> fatal_reported_{false};
  std::atomic<std::thread::id> loop_thread_{};

  mutable absl::Mutex mu_;
  std::deque<Task> tasks_ ABSL_GUARDED_BY(mu_);
  std::multimap<Deadline, Task> timers_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;

  absl::Mutex join_mu_;  // one joiner at a time; after mu_ in lock order
  std::thread thread_ ABSL_GUARDED_BY(join_mu_);
};

// An EventLoop whose inbox holds typed messages, all handled by one
// function (typically a std::visit over a std::variant).
template <typename Message>
class MessageLoop {
 public:
  using Handler = std::function<void(Message&)>;

  // `handler` runs on the loop thread for every message.
  MessageLoop(Handler handler, EventLoopOptions options = {})
      : handler_(std::move(handler)), loop_(std::move(options)) {}

  bool Post(Message message) { return loop_.Post(Wrap(std::move(message))); }
  bool PostAt(Deadline when, Message message) {
    return loop_.PostAt(when, Wrap(std::move(message)));
  }
  bool PostAfter(absl::Duration delay, Message message) {
    return loop_.PostAfter(delay, Wrap(std::move(message)));
  }

  // Posts make(reply) and waits for the handler to answer through `reply`;
  // Unavailable when stopping. From the loop thread the message is handled
  // inline.
  template <typename T, typename Make>
  T Call(Make make) {
    ReplyWaiter<T> waiter;
    Message message = make(waiter.MakeReply());
    if (loop_.IsInLoopThread()) {
      handler_(message);
    } else if (!Post(std::move(message))) {
      return T(loop_.StoppingError());
    }
    return waiter.Wait();
  }

  void Stop() { loop_.Stop(); }
  bool stopping() const { return loop_.stopping(); }
  bool IsInLoopThread() const { return loop_.IsInLoopThread(); }
  void ReportFatal(absl::Status status) { loop_.ReportFatal(std::move(status)); }

 private:
  EventLoop::Task Wrap(Message message) {
    return [this, m = std::move(message)]() mutable { handler_(m); };
  }

  const Handler handler_;
  EventLoop loop_;  // last: its thread stops before handler_ goes
};

}  // namespace mmserve

#endif  // MMSERVE_COMMON_EVENT_LOOP_H_
