#include "common/event_loop.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace mmserve {

EventLoop::EventLoop(EventLoopOptions options)
    : name_(std::move(options.name)),
      step_(std::move(options.step)),
      on_fatal_(std::move(options.on_fatal)),
      sleeper_(std::move(options.sleeper)),
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
  if (sleeper_ != nullptr) sleeper_->Wake();
  return true;
}

bool EventLoop::PostAt(Deadline when, Task task) {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return false;
    timers_.emplace(when, std::move(task));
    timer_added_ = true;
  }
  // The loop may sleep past `when`: it recomputes its wake-up time.
  if (sleeper_ != nullptr) sleeper_->Wake();
  return true;
}

void EventLoop::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (sleeper_ != nullptr) sleeper_->Wake();
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
    timer_added_ = false;  // `next` takes every timer so far into account
    if (Ready()) return;
    if (!timers_.empty()) next = std::min(next, timers_.begin()->first);
    if (next.Expired()) return;
    if (sleeper_ == nullptr) {
      // Post and Stop change what Ready() reads under mu_, which re-evaluates
      // the condition: no separate wake-up.
      mu_.AwaitWithTimeout(absl::Condition(this, &EventLoop::Ready), next.Remaining());
      return;
    }
  }
  // A Post between the check above and this Sleep has called Wake, which
  // makes the Sleep return.
  sleeper_->Sleep(next);
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
