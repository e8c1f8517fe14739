#include "transfer/checksum_worker.h"

#include <utility>

#include "common/crc32c.h"

namespace mmserve::transfer {

ChecksumWorker::ChecksumWorker() : thread_([this] { Loop(); }) {}

ChecksumWorker::~ChecksumWorker() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

void ChecksumWorker::Submit(const uint8_t* data, size_t size,
                            std::function<void(uint32_t crc)> done, uint8_t* copy_to) {
  absl::MutexLock lock(&mu_);
  jobs_.push_back({data, size, std::move(done), copy_to});
}

void ChecksumWorker::Loop() {
  for (;;) {
    Job job;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](ChecksumWorker* w)
               ABSL_NO_THREAD_SAFETY_ANALYSIS { return w->stop_ || !w->jobs_.empty(); },
          this));
      if (jobs_.empty()) return;  // stop_, and everything queued ran
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    job.done(job.copy_to != nullptr ? Crc32cCopy(job.copy_to, job.data, job.size)
                                    : Crc32c(job.data, job.size));
  }
}

}  // namespace mmserve::transfer
