// A fixed pool of compute threads for the CPU kernels, with one blocking
// parallel-for.
//
//   ThreadPool pool(ThreadPool::DefaultThreads());
//   pool.ParallelFor(num_rows, /*grain=*/4, [&](int64_t begin, int64_t end) {
//     for (int64_t r = begin; r < end; ++r) Normalize(r);
//   });
//
// The calling thread works too, so a pool of N threads starts N - 1 workers.
// Work is handed out in chunks of `grain` items from a shared counter, so a
// core slowed by a neighbour takes fewer chunks. Kernels must make each
// item's result independent of which thread runs it (they do: see linear.h).
//
// Idle workers spin briefly (a decode step issues hundreds of short loops)
// and then sleep on a condition variable.
//
// Thread-safety: ParallelFor may be called by one thread at a time (the
// owner of the pool); it is not reentrant (fn must not call ParallelFor on
// the same pool).
#ifndef MMSERVE_MODEL_CPU_THREAD_POOL_H_
#define MMSERVE_MODEL_CPU_THREAD_POOL_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace mmserve::model::cpu {

class ThreadPool {
 public:
  // Every online core (std::thread::hardware_concurrency), at least 1.
  static int DefaultThreads();

  // num_threads >= 1 counts the caller.
  explicit ThreadPool(int num_threads);
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;
  ~ThreadPool();

  int num_threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls fn(begin, end) over disjoint chunks covering [0, n), each at most
  // `grain` long, and returns when every chunk has finished.
  void ParallelFor(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

 private:
  void WorkerLoop();
  void RunChunks();

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable wake_;
  bool stop_ = false;                    // guarded by mu_
  std::atomic<uint64_t> generation_{0};  // bumped per ParallelFor
  // The current loop; written by the caller before bumping generation_.
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
  int64_t n_ = 0;
  int64_t grain_ = 1;
  std::atomic<int64_t> next_{0};
  std::atomic<int> busy_{0};  // workers still inside the current loop
};

}  // namespace mmserve::model::cpu

#endif  // MMSERVE_MODEL_CPU_THREAD_POOL_H_
