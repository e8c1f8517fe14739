// One thread that computes CRC32C of byte ranges off the progress thread, or
// copies and checksums them in one pass: the second core of a kGet chunk
// read, which copies every other piece.
//
//   ChecksumWorker crc;
//   crc.Submit(data, size, [](uint32_t c) { /* runs on the worker thread */ });
//   crc.Submit(src, size, [](uint32_t c) { ... }, /*copy_to=*/dst);  // copy too
//   crc.Run([&] { /* any copy or checksum work, on the worker thread */ });
//
// Jobs run in submission order. Thread-safe. The destructor finishes queued
// jobs, then joins; the memory a job reads must stay valid until its `done`.
#ifndef MMSERVE_TRANSFER_CHECKSUM_WORKER_H_
#define MMSERVE_TRANSFER_CHECKSUM_WORKER_H_

#include <cstddef>
#include <cstdint>
#include <functional>

#include "common/event_loop.h"

namespace mmserve::transfer {

class ChecksumWorker {
 public:
  ChecksumWorker();
  ChecksumWorker(const ChecksumWorker&) = delete;
  ChecksumWorker& operator=(const ChecksumWorker&) = delete;

  // Checksums [data, data + size); with `copy_to`, also copies the bytes
  // there in the same pass (Crc32cCopy). `done` gets the CRC of the bytes.
  void Submit(const uint8_t* data, size_t size, std::function<void(uint32_t crc)> done,
              uint8_t* copy_to = nullptr);
  // Runs `job` on the worker thread, after the jobs submitted before it.
  void Run(std::function<void()> job);

 private:
  EventLoop loop_;  // kDrain: the destructor runs what was submitted
};

}  // namespace mmserve::transfer

#endif  // MMSERVE_TRANSFER_CHECKSUM_WORKER_H_
