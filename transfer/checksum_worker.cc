#include "transfer/checksum_worker.h"

#include <utility>

#include "common/crc32c.h"
#include "common/logging.h"

namespace mmserve::transfer {

ChecksumWorker::ChecksumWorker() : loop_({.name = "checksum worker"}) {}

void ChecksumWorker::Submit(const uint8_t* data, size_t size,
                            std::function<void(uint32_t crc)> done, uint8_t* copy_to) {
  const bool queued = loop_.Post([data, size, done = std::move(done), copy_to] {
    done(copy_to != nullptr ? Crc32cCopy(copy_to, data, size) : Crc32c(data, size));
  });
  // Only the destructor stops the loop.
  CHECK(queued) << "ChecksumWorker::Submit during destruction";
}

void ChecksumWorker::Run(std::function<void()> job) {
  const bool queued = loop_.Post(std::move(job));
  CHECK(queued) << "ChecksumWorker::Run during destruction";
}

}  // namespace mmserve::transfer
