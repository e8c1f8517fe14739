// Test helpers: the ranks of a tensor-parallel instance as real processes.
//
//   std::vector<int> codes = RunForkedRanks(2, [&](int rank) { return Work(rank) ? 0 : 1; });
//   // codes[r] == 0 for every rank that succeeded
//
// Ranks 1..N-1 are forked children that _exit with fn's result (no
// destructors, no test-framework state); rank 0 runs fn in the caller. Fork
// before creating threads (thread pools) in the caller: a child holds only
// the forking thread.
#ifndef MMSERVE_WORKER_FORK_RANKS_H_
#define MMSERVE_WORKER_FORK_RANKS_H_

#include <sys/types.h>

#include <functional>
#include <string>
#include <vector>

namespace mmserve::worker {

// Forks a child that runs fn and _exits with its result (1 if it throws).
pid_t ForkChild(const std::function<int()>& fn);

// Reaps the child: its exit code, or 128 + the signal that killed it.
int WaitChild(pid_t pid);

// Runs fn(rank) for every rank, rank 0 in the caller; each rank's result.
std::vector<int> RunForkedRanks(int world_size, const std::function<int(int rank)>& fn);

// prefix + pid + a counter: unique per call in this host's lifetime.
std::string UniqueInstanceId(const std::string& prefix);

}  // namespace mmserve::worker

#endif  // MMSERVE_WORKER_FORK_RANKS_H_
