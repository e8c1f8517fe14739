#include "common/event_loop.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace mmserve {
namespace {

// The default: a flag under a mutex.
class MutexSleeper : public LoopSleeper {
 public:
  void Wake() override {
    absl::MutexLock lock(&mu_);
    woken_ = true;
  }
  void Sleep(Deadline until) override {
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(&woken_), until.Remaining());
    woken_ = false;
  }

 private:
  absl::Mutex mu_;
  bool woken_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace

EventLoop::EventLoop(EventLoopOptions options)
    : name_(std::move(options.name)),
      step_(std::move(options.step)),
      on_fatal_(std::move(options.on_fatal)),
      sleeper_(options.sleeper != nullptr ? std::move(options.sleeper)
                                          : std::make_unique<MutexSleeper>()),
      on_stop_(options.on_stop) {
  absl::MutexLock lock(&join_mu_);
  thread_ = std::thread([this] { Run(); });
  loop_thread_.store(thread_.get_id());
}

EventLoop::~EventLoop() {
  CHECK(!IsInLoopThread()) << "event loop " << name_ << " destroyed from its own thread";
  Stop();
}

bool EventLoop::Post(Task task) {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return false;
    tasks_.push_back(std::move(task));
  }
  sleeper_->Wake();
  return true;
}

bool EventLoop::PostAt(Deadline when, Task task) {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return false;
    timers_.emplace(when, std::move(task));
  }
  // The loop may be sleeping past `when`: it recomputes its wake-up time.
  sleeper_->Wake();
  return true;
}

void EventLoop::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  sleeper_->Wake();
  if (IsInLoopThread()) return;
  absl::MutexLock lock(&join_mu_);
  if (thread_.joinable()) thread_.join();
}

bool EventLoop::stopping() const {
  absl::MutexLock lock(&mu_);
  return stopping_;
}

absl::Status EventLoop::StoppingError() const {
  return absl::UnavailableError(absl::StrCat(name_, " is shutting down"));
}

void EventLoop::ReportFatal(absl::Status status) {
  if (fatal_reported_.exchange(true)) {
    LOG(ERROR) << name_ << ": fatal error after the first: " << status;
    return;
  }
  LOG(ERROR) << name_ << ": fatal error: " << status;
  if (on_fatal_) on_fatal_(std::move(status));
}

bool EventLoop::TakeRound(std::deque<Task>& tasks, std::deque<Task>& due) {
  absl::MutexLock lock(&mu_);
  if (stopping_) return false;
  tasks.swap(tasks_);
  while (!timers_.empty() && timers_.begin()->first.Expired()) {
    due.push_back(std::move(timers_.begin()->second));
    timers_.erase(timers_.begin());
  }
  return true;
}

void EventLoop::Idle(Deadline next) {
  if (next.Expired()) return;  // the step hook has more to do: no lock taken
  {
    absl::MutexLock lock(&mu_);
    if (Ready()) return;
    if (!timers_.empty()) next = std::min(next, timers_.begin()->first);
  }
  // A Post, PostAt or Stop after the check above has called Wake, which makes
  // this Sleep return at once.
  if (!next.Expired()) sleeper_->Sleep(next);
}

void EventLoop::Run() {
  loop_thread_.store(std::this_thread::get_id());
  for (;;) {
    bool worked = false;
    {
      // Scoped: what the tasks hold (replies, buffers) goes before the sleep.
      std::deque<Task> tasks;
      std::deque<Task> due;
      if (!TakeRound(tasks, due)) break;
      for (Task& t : tasks) t();
      for (Task& t : due) t();
      worked = !tasks.empty() || !due.empty();
    }
    Idle(step_ ? step_(worked) : Deadline::Never());
  }
  RunStopped();
}

void EventLoop::RunStopped() {
  std::deque<Task> tasks;
  std::multimap<Deadline, Task> timers;
  {
    absl::MutexLock lock(&mu_);
    tasks.swap(tasks_);
    timers.swap(timers_);
  }
  timers.clear();
  if (on_stop_ == EventLoopOptions::OnStop::kDrain) {
    for (Task& t : tasks) t();
  }
}

}  // namespace mmserve
