// Helpers for gRPC's callback API on the server side.
//
// QueuedWriteReactor: a server-streaming reactor that any thread may feed.
// Messages leave one write at a time, in order; End() finishes the stream
// once the queue has drained. The reactor lives until both gRPC is done with
// it (OnDone) and the producer has called End(), whichever comes last, so the
// producer may keep a raw pointer until it calls End().
//
//   class MyStream final : public QueuedWriteReactor<Reply> {
//     void OnCancel() override { job.Cancel(); }        // client cancel, deadline
//     void OnClientGone() override { job.Cancel(); }    // a write failed
//   };
//   auto* s = new MyStream;  job.Start([s](Reply r) { s->Push(std::move(r)); },
//                                      [s](absl::Status st) { s->End(st); });
//   return s;
//
// FinishUnary: a unary reactor finished at once with `status`.
// Thread-safe.
#ifndef MMSERVE_COMMON_SERVER_STREAM_H_
#define MMSERVE_COMMON_SERVER_STREAM_H_

#include <deque>
#include <optional>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/grpc_status.h"
#include "grpcpp/grpcpp.h"

namespace mmserve {

inline grpc::ServerUnaryReactor* FinishUnary(grpc::CallbackServerContext* ctx,
                                             const grpc::Status& status) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(status);
  return reactor;
}

template <typename T>
class QueuedWriteReactor : public grpc::ServerWriteReactor<T> {
 public:
  // Queues `message`; dropped once the client is gone or the stream finished.
  void Push(T message) {
    {
      absl::MutexLock lock(&mu_);
      if (gone_ || finished_) return;
      if (writing_) {
        queue_.push_back(std::move(message));
        return;
      }
      writing_ = true;
    }
    Write(std::move(message));
  }

  // The producer is done: finish with `status` after the queued writes, and
  // drop the producer's reference. Call exactly once.
  void End(const absl::Status& status) {
    bool finish_now = false;
    {
      absl::MutexLock lock(&mu_);
      final_ = status;
      if (!writing_ && !finished_) {
        finished_ = true;
        finish_now = true;
      }
    }
    if (finish_now) this->Finish(ToGrpcStatus(status));
    Unref();
  }

  void OnWriteDone(bool ok) final {
    std::optional<T> next;
    std::optional<absl::Status> finish;
    bool gone_now = false;
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      if (!ok && !gone_) gone_ = gone_now = true;
      if (!gone_ && !queue_.empty()) {
        next = std::move(queue_.front());
        queue_.pop_front();
        writing_ = true;
      } else if (final_ && !finished_) {
        finish = final_;
        finished_ = true;
      }
    }
    if (gone_now) OnClientGone();
    if (next) Write(std::move(*next));
    if (finish) this->Finish(ToGrpcStatus(*finish));
  }

  void OnDone() final { Unref(); }

 protected:
  ~QueuedWriteReactor() override = default;
  // A write failed: the client is gone. The producer should stop and End().
  virtual void OnClientGone() {}

 private:
  void Write(T message) {
    current_ = std::move(message);
    this->StartWrite(&current_);
  }

  void Unref() {
    bool last;
    {
      absl::MutexLock lock(&mu_);
      last = --refs_ == 0;
    }
    if (last) delete this;
  }

  T current_;  // the write in flight
  absl::Mutex mu_;
  std::deque<T> queue_ ABSL_GUARDED_BY(mu_);
  std::optional<absl::Status> final_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool gone_ ABSL_GUARDED_BY(mu_) = false;
  int refs_ ABSL_GUARDED_BY(mu_) = 2;  // gRPC's (OnDone) and the producer's (End)
};

}  // namespace mmserve

#endif  // MMSERVE_COMMON_SERVER_STREAM_H_
