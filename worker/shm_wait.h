// Waiting between the rank processes of one instance on words in shared
// memory (the communicator's barrier, the step ring's sequence): futexes
// without FUTEX_PRIVATE_FLAG (the word is shared between processes), and the
// check that a peer process is still alive.
// Thread-safety: all functions are thread-safe.
#ifndef MMSERVE_WORKER_SHM_WAIT_H_
#define MMSERVE_WORKER_SHM_WAIT_H_

#include <atomic>
#include <cstdint>

#include "absl/time/time.h"

namespace mmserve::worker {

// Sleeps while *word == expected, at most `timeout` (spurious wake-ups are
// possible: re-check the condition).
void FutexWait(std::atomic<uint32_t>* word, uint32_t expected, absl::Duration timeout);

// Wakes every process sleeping on word.
void FutexWakeAll(std::atomic<uint32_t>* word);

// A pause instruction for spin loops.
void CpuRelax();

// False once pid is gone or a zombie (killed but not yet reaped by its
// parent); true for pid <= 0 (a rank not arrived yet).
bool ProcessAlive(int32_t pid);

}  // namespace mmserve::worker

#endif  // MMSERVE_WORKER_SHM_WAIT_H_
