#include "transfer/ucx_worker.h"

#include <poll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>

#include "absl/time/clock.h"
#include "absl/time/time.h"
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
  // Opening the tcp transport's interfaces can fail for a moment on a busy
  // machine (UCS_ERR_NO_DEVICE: no interface could be opened); a few tries
  // over about a second tell that from a machine that has none.
  ucs_status_t created = UCS_ERR_NO_DEVICE;
  for (int attempt = 0; attempt < 4; ++attempt) {
    if (attempt > 0) {
      LOG(WARNING) << "ucp_worker_create: " << ucs_status_string(created) << "; trying again";
      absl::SleepFor(absl::Milliseconds(100 << attempt));
    }
    created = ucp_worker_create(context.get(), &params, &worker);
    if (created != UCS_ERR_NO_DEVICE) break;
  }
  RETURN_IF_ERROR(UCX_CALL(created));

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

// The progress thread sleeps in poll() on UCX's event fd (armed first) and
// an eventfd that Post writes to.
class UcxWorker::Sleeper : public LoopSleeper {
 public:
  Sleeper(ucp_worker_h worker, int wake_fd, int ucx_fd)
      : worker_(worker), wake_fd_(wake_fd), ucx_fd_(ucx_fd) {}

  void Wake() override {
    uint64_t one = 1;
    (void)!write(wake_fd_, &one, sizeof(one));
  }

  void Sleep(Deadline until) override {
    // Arm only when UCX has nothing pending; UCS_ERR_BUSY means "progress again".
    if (ucp_worker_arm(worker_) == UCS_ERR_BUSY) return;
    struct pollfd fds[2] = {{wake_fd_, POLLIN, 0}, {ucx_fd_, POLLIN, 0}};
    const absl::Duration left = until.Remaining();
    int timeout_ms = -1;
    if (left != absl::InfiniteDuration()) {
      timeout_ms = std::max<int>(1, static_cast<int>(absl::ToInt64Milliseconds(left)));
    }
    if (poll(fds, 2, timeout_ms) > 0 && (fds[0].revents & POLLIN)) {
      uint64_t count;
      (void)!read(wake_fd_, &count, sizeof(count));
    }
  }

 private:
  const ucp_worker_h worker_;
  const int wake_fd_;
  const int ucx_fd_;
};

UcxWorker::UcxWorker(UcxContext& context, const UcxWorkerOptions& options, ucp_worker_h worker,
                     std::string address, int wake_fd, int ucx_fd)
    : context_(context),
      options_(options),
      worker_(worker),
      address_(std::move(address)),
      wake_fd_(wake_fd),
      ucx_fd_(ucx_fd) {}

void UcxWorker::Stop() {
  if (loop_ == nullptr) return;
  CHECK(!InProgressThread()) << "UcxWorker::Stop from its own progress thread";
  loop_->Stop();
}

UcxWorker::~UcxWorker() {
  Stop();
  // Tasks still queued (e.g. messages that arrived during shutdown) were
  // dropped: their owners are going away.
  loop_.reset();
  ucp_worker_destroy(worker_);
  close(wake_fd_);
}

void UcxWorker::Start(std::function<void()> ticker, std::function<bool()> active) {
  CHECK(loop_ == nullptr) << "UcxWorker::Start called twice";
  ticker_ = std::move(ticker);
  active_ = std::move(active);
  last_activity_ = MonotonicNanos();
  last_tick_ = last_activity_;
  EventLoopOptions loop_options{.name = options_.name};
  loop_options.step = [this](bool worked) { return Step(worked); };
  loop_options.sleeper = std::make_unique<Sleeper>(worker_, wake_fd_, ucx_fd_);
  loop_options.on_stop = EventLoopOptions::OnStop::kDrop;
  loop_ = std::make_unique<EventLoop>(std::move(loop_options));
}

void UcxWorker::Post(std::function<void()> task) {
  // Refused (dropped) only once stopping, like the tasks queued then.
  (void)loop_->Post(std::move(task));
}

absl::Status UcxWorker::RunSync(std::function<absl::Status()> task) {
  return loop_->RunAndWait(std::move(task));
}

bool UcxWorker::InProgressThread() const { return loop_ != nullptr && loop_->IsInLoopThread(); }

unsigned UcxWorker::Progress() { return ucp_worker_progress(worker_); }

Deadline UcxWorker::Step(bool worked) {
  bool busy = worked;
  while (ucp_worker_progress(worker_) != 0) busy = true;
  const int64_t now = MonotonicNanos();
  if (ticker_ && now - last_tick_ >= absl::ToInt64Nanoseconds(options_.tick)) {
    last_tick_ = now;
    ticker_();
  }
  const Deadline again = Deadline::After(absl::ZeroDuration());
  if (busy) {
    last_activity_ = now;
    return again;
  }
  if (active_ && active_()) {
    // A transfer is in flight: its data may need this side's progress
    // without waking the event fd (shm RMA in UCX 1.13), so never sleep;
    // yield the core to other runnable threads instead.
    last_activity_ = now;
    sched_yield();
    return again;
  }
  if (now - last_activity_ <= absl::ToInt64Nanoseconds(options_.spin)) return again;
  // Keeps sleeping each round (at most a tick, for the ticker) until
  // something happens.
  return Deadline::After(options_.tick);
}

}  // namespace mmserve::transfer
