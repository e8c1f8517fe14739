// Threads that take tasks from one shared queue: the EventLoop's variant for
// stages whose tasks are independent and may run side by side (the
// encoder's image decode), where one owner thread would be the bottleneck.
//
//   WorkerPool pool({.name = "decode", .threads = 4});
//   pool.Post([image] { Decode(image); });  // any idle thread runs it
//
// Tasks start in posting order but may finish in any order; nothing is
// owned by one thread (use an EventLoop for that). Stop() refuses new tasks,
// drops the queued ones (destroys them unrun) and joins; tasks already
// running finish first. Thread-safe; Stop and the destructor must not run on
// a pool thread.
#ifndef MMSERVE_COMMON_WORKER_POOL_H_
#define MMSERVE_COMMON_WORKER_POOL_H_

#include <deque>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/synchronization/mutex.h"

namespace mmserve {

struct WorkerPoolOptions {
  std::string name = "pool";
  int threads = 1;  // at least one runs
};

class WorkerPool {
 public:
  using Task = absl::AnyInvocable<void()>;

  // Starts the threads.
  explicit WorkerPool(const WorkerPoolOptions& options);
  ~WorkerPool();  // Stop()
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  // Queues `task`; false (and `task` destroyed here) once stopping.
  bool Post(Task task);
  // Refuses new tasks, drops the queued ones and joins. Idempotent.
  void Stop();
  bool stopping() const;

 private:
  void Run();
  bool Ready() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || !tasks_.empty(); }

  mutable absl::Mutex mu_;
  std::deque<Task> tasks_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;

  absl::Mutex join_mu_;  // one joiner at a time; before mu_ in lock order
  std::vector<std::thread> threads_ ABSL_GUARDED_BY(join_mu_);
};

}  // namespace mmserve

#endif  // MMSERVE_COMMON_WORKER_POOL_H_
