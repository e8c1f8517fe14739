#include "transfer/ucx_worker.h"

#include <poll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "absl/synchronization/notification.h"
#include "common/clock.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "transfer/ucx_status.h"

namespace mmserve::transfer {

absl::StatusOr<std::unique_ptr<UcxWorker>> UcxWorker::Create(UcxContext& context,
                                                             const UcxWorkerOptions& options) {
  ucp_worker_params_t params = {};
  params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE | UCP_WORKER_PARAM_FIELD_NAME;
  // Only the progress thread touches the worker.
  params.thread_mode = UCS_THREAD_MODE_SINGLE;
  params.name = options.name.c_str();
  ucp_worker_h worker = nullptr;
  RETURN_IF_ERROR(UCX_CALL(ucp_worker_create(context.get(), &params, &worker)));

  ucp_address_t* addr = nullptr;
  size_t addr_len = 0;
  absl::Status s = UCX_CALL(ucp_worker_get_address(worker, &addr, &addr_len));
  if (!s.ok()) {
    ucp_worker_destroy(worker);
    return s;
  }
  std::string address(reinterpret_cast<const char*>(addr), addr_len);
  ucp_worker_release_address(worker, addr);

  int ucx_fd = -1;
  s = UCX_CALL(ucp_worker_get_efd(worker, &ucx_fd));
  int wake_fd = s.ok() ? eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC) : -1;
  if (s.ok() && wake_fd < 0) s = absl::InternalError("eventfd failed");
  if (!s.ok()) {
    ucp_worker_destroy(worker);
    return s;
  }
  return std::unique_ptr<UcxWorker>(
      new UcxWorker(context, options, worker, std::move(address), wake_fd, ucx_fd));
}

UcxWorker::UcxWorker(UcxContext& context, const UcxWorkerOptions& options, ucp_worker_h worker,
                     std::string address, int wake_fd, int ucx_fd)
    : context_(context),
      options_(options),
      worker_(worker),
      address_(std::move(address)),
      wake_fd_(wake_fd),
      ucx_fd_(ucx_fd) {}

void UcxWorker::Stop() {
  if (!thread_.joinable()) return;
  CHECK(!InProgressThread()) << "UcxWorker::Stop from its own progress thread";
  stop_.store(true);
  uint64_t one = 1;
  (void)!write(wake_fd_, &one, sizeof(one));
  thread_.join();
}

UcxWorker::~UcxWorker() {
  Stop();
  // Tasks still queued (e.g. messages that arrived during shutdown) are
  // dropped: their owners are going away.
  {
    absl::MutexLock lock(&mu_);
    tasks_.clear();
  }
  ucp_worker_destroy(worker_);
  close(wake_fd_);
}

void UcxWorker::Start(std::function<void()> ticker, std::function<bool()> active) {
  CHECK(!thread_.joinable()) << "UcxWorker::Start called twice";
  ticker_ = std::move(ticker);
  active_ = std::move(active);
  thread_ = std::thread([this] { Loop(); });
}

void UcxWorker::Post(std::function<void()> task) {
  {
    absl::MutexLock lock(&mu_);
    tasks_.push_back(std::move(task));
  }
  uint64_t one = 1;
  (void)!write(wake_fd_, &one, sizeof(one));
}

absl::Status UcxWorker::RunSync(std::function<absl::Status()> task) {
  if (InProgressThread()) return task();
  absl::Status status;
  absl::Notification done;
  Post([&] {
    status = task();
    done.Notify();
  });
  done.WaitForNotification();
  return status;
}

bool UcxWorker::InProgressThread() const { return thread_.get_id() == std::this_thread::get_id(); }

unsigned UcxWorker::Progress() { return ucp_worker_progress(worker_); }

bool UcxWorker::RunTasks() {
  std::deque<std::function<void()>> tasks;
  {
    absl::MutexLock lock(&mu_);
    tasks.swap(tasks_);
  }
  for (auto& task : tasks) task();
  return !tasks.empty();
}

void UcxWorker::Sleep() {
  // Arm only when UCX has nothing pending; UCS_ERR_BUSY means "progress again".
  if (ucp_worker_arm(worker_) == UCS_ERR_BUSY) return;
  struct pollfd fds[2] = {{wake_fd_, POLLIN, 0}, {ucx_fd_, POLLIN, 0}};
  int timeout_ms = static_cast<int>(absl::ToInt64Milliseconds(options_.tick));
  if (poll(fds, 2, timeout_ms < 1 ? 1 : timeout_ms) > 0 && (fds[0].revents & POLLIN)) {
    uint64_t count;
    (void)!read(wake_fd_, &count, sizeof(count));
  }
}

void UcxWorker::Loop() {
  const int64_t spin_ns = absl::ToInt64Nanoseconds(options_.spin);
  const int64_t tick_ns = absl::ToInt64Nanoseconds(options_.tick);
  int64_t last_activity = MonotonicNanos();
  int64_t last_tick = last_activity;
  while (!stop_.load(std::memory_order_relaxed)) {
    bool busy = RunTasks();
    while (ucp_worker_progress(worker_) != 0) busy = true;
    int64_t now = MonotonicNanos();
    if (ticker_ && now - last_tick >= tick_ns) {
      last_tick = now;
      ticker_();
    }
    if (busy) {
      last_activity = now;
    } else if (active_ && active_()) {
      // A transfer is in flight: its data may need this side's progress
      // without waking the event fd (shm RMA in UCX 1.13), so never sleep;
      // yield the core to other runnable threads instead.
      last_activity = now;
      sched_yield();
    } else if (now - last_activity > spin_ns) {
      Sleep();  // keeps sleeping each round until something happens
    }
  }
}

}  // namespace mmserve::transfer
