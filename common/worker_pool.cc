#include "common/worker_pool.h"

#include <algorithm>
#include <utility>

namespace mmserve {

WorkerPool::WorkerPool(const WorkerPoolOptions& options) {
  absl::MutexLock lock(&join_mu_);
  for (int i = 0; i < std::max(1, options.threads); ++i) {
    threads_.emplace_back([this] { Run(); });
  }
}

WorkerPool::~WorkerPool() { Stop(); }

bool WorkerPool::Post(Task task) {
  absl::MutexLock lock(&mu_);
  if (stopping_) return false;
  tasks_.push_back(std::move(task));
  return true;
}

void WorkerPool::Stop() {
  absl::MutexLock join_lock(&join_mu_);
  std::deque<Task> dropped;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    dropped.swap(tasks_);
  }
  dropped.clear();  // outside mu_: a task's destructor may post elsewhere
  for (std::thread& t : threads_) t.join();
  threads_.clear();
}

bool WorkerPool::stopping() const {
  absl::MutexLock lock(&mu_);
  return stopping_;
}

void WorkerPool::Run() {
  for (;;) {
    Task task;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &WorkerPool::Ready));
      if (stopping_) return;
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    task();
  }
}

}  // namespace mmserve
