// A UCX worker and the one progress thread that owns it.
//
// UCX 1.13 emulates RMA with active messages on tcp and shm, so both sides
// must keep progressing. Every ucp_* call on this worker (and on endpoints,
// rkeys and requests made from it) happens on the progress thread; other
// threads hand work to it with Post() or RunSync().
//
//   ASSIGN_OR_RETURN(auto worker, UcxWorker::Create(*ctx, {.name = "prefill-0"}));
//   worker->Post([&] { /* runs on the progress thread, may call ucp_* */ });
//   absl::Status s = worker->RunSync([&] { return DoUcxThing(worker->get()); });
//
// The loop is a common EventLoop (queued tasks dropped on Stop) whose step
// hook drives UCX and whose sleeper polls UCX's event fd: run queued tasks,
// call ucp_worker_progress until it returns 0, run the ticker about every
// `tick` (deadlines), and after `spin` of idleness arm the worker and sleep
// in poll() on its event fd and a wake-up eventfd (at most `tick`) - unless
// the owner's `active` predicate says a transfer is in flight: then it keeps
// polling and only sched_yield()s between rounds. (Measured: a 28 MiB shm
// put whose receiver sleeps takes ~850 ms instead of ~3.5 ms; UCX 1.13 does
// not wake the armed receiver for every step it needs.) Tasks and UCX
// callbacks must not block; a task may call Progress() to drive UCX while it
// waits for something it started.
//
// Thread-safety: Post, RunSync, address and InProgressThread are thread-safe;
// get() and Progress() only on the progress thread. Destruction stops the
// thread (see Stop); the owner closes endpoints first.
#ifndef MMSERVE_TRANSFER_UCX_WORKER_H_
#define MMSERVE_TRANSFER_UCX_WORKER_H_

#include <ucp/api/ucp.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/event_loop.h"
#include "transfer/ucx_context.h"

namespace mmserve::transfer {

struct UcxWorkerOptions {
  std::string name = "worker";
  // Busy-poll this long after the last activity before sleeping. A trade:
  // a sleeping thread is woken by the peer's signal onto the waker's core (a
  // sync wake-up; on these VMs the idle vCPU looks preempted), while spinning
  // threads take cores from work. Measured on the shm bench, 7 MiB images one
  // at a time: with kGet (the shm default; the receiver's two threads copy)
  // 200 us gave 0.86-1.20 of ucx_perftest and 2 ms 0.55-1.05; with kPut, 2 ms
  // halved the per-image p50 (1.2 -> 0.6 ms), since a sleeping sender woken
  // onto the receiver's core made it checksum late. tcp: no difference.
  absl::Duration spin = absl::Microseconds(200);
  // Ticker period and the longest sleep.
  absl::Duration tick = absl::Milliseconds(1);
};

class UcxWorker {
 public:
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<UcxWorker>> Create(
      UcxContext& context, const UcxWorkerOptions& options);
  ~UcxWorker();
  UcxWorker(const UcxWorker&) = delete;
  UcxWorker& operator=(const UcxWorker&) = delete;

  // Starts the progress thread; `ticker` (may be empty) then runs on it about
  // every options.tick, and `active` (may be empty) is asked, on it, whenever
  // a round found nothing to do: true keeps the loop from sleeping. Call
  // once, before Post.
  void Start(std::function<void()> ticker, std::function<bool()> active = nullptr);

  // Stops and joins the progress thread; queued tasks never run (a RunSync
  // waiting on one returns Unavailable). Call from another thread, after the
  // owner's last RunSync.
  void Stop();

  // Queues `task` for the progress thread. Thread-safe.
  void Post(std::function<void()> task);
  // Runs `task` on the progress thread and returns its status; inline when
  // called there. Thread-safe.
  [[nodiscard]] absl::Status RunSync(std::function<absl::Status()> task);

  bool InProgressThread() const;
  // The packed worker address peers create endpoints from.
  const std::string& address() const { return address_; }
  UcxContext& context() const { return context_; }

  // Progress thread only.
  ucp_worker_h get() const { return worker_; }
  // Drives UCX once; returns the number of events processed.
  unsigned Progress();

 private:
  class Sleeper;
  UcxWorker(UcxContext& context, const UcxWorkerOptions& options, ucp_worker_h worker,
            std::string address, int wake_fd, int ucx_fd);
  // The loop's step hook: progress, the ticker, and whether to spin or sleep.
  Deadline Step(bool worked);

  UcxContext& context_;
  const UcxWorkerOptions options_;
  ucp_worker_h worker_;
  const std::string address_;
  const int wake_fd_;  // eventfd other threads write to wake the loop
  const int ucx_fd_;   // ucp_worker_get_efd
  // Set by Start, before the loop exists; then read on the progress thread.
  std::function<void()> ticker_;
  std::function<bool()> active_;
  int64_t last_activity_ = 0;        // progress thread only
  int64_t last_tick_ = 0;            // progress thread only
  std::unique_ptr<EventLoop> loop_;  // set by Start
};

}  // namespace mmserve::transfer

#endif  // MMSERVE_TRANSFER_UCX_WORKER_H_
