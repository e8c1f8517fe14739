// Collective operations among the ranks of one tensor-parallel language
// instance: the model's row-parallel projections sum their
// partial outputs with AllReduceSum, lm_head's vocabulary slices are
// gathered with Gather or AllGather.
//
//   std::unique_ptr<Communicator> comm = ...;  // e.g. ShmCommunicator::Join
//   RETURN_IF_ERROR(comm->AllReduceSum(absl::MakeSpan(partial)));
//
// Every rank must issue the same sequence of calls with the same sizes (the
// model does: each rank runs the same step). A call that fails (a peer died
// or timed out) returns UNAVAILABLE and leaves the communicator broken: every
// later call fails fast with UNAVAILABLE too, on every rank that notices.
// Thread-safety: not thread-safe; one thread per rank issues the calls.
#ifndef MMSERVE_COMMON_COMMUNICATOR_H_
#define MMSERVE_COMMON_COMMUNICATOR_H_

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace mmserve {

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int world_size() const = 0;

  // data[i] = sum over ranks r of data_r[i], on every rank. The sum is taken
  // in rank order, ((d_0 + d_1) + d_2) + ..., so every rank gets bitwise the
  // same result. InvalidArgument if sizes differ between ranks (where the
  // backend can tell).
  [[nodiscard]] virtual absl::Status AllReduceSum(absl::Span<float> data) = 0;

  // Rank 0's out receives every rank's `in`, in rank order: out[r * n + i] =
  // in_r[i] with n = in.size() (the same on every rank). out must hold
  // world_size() * n floats on rank 0 and is ignored elsewhere.
  [[nodiscard]] virtual absl::Status Gather(absl::Span<const float> in, absl::Span<float> out) = 0;
  // As Gather, but every rank's out receives the result.
  [[nodiscard]] virtual absl::Status AllGather(absl::Span<const float> in,
                                               absl::Span<float> out) = 0;

  // data on every rank becomes rank 0's data.
  [[nodiscard]] virtual absl::Status Broadcast(absl::Span<float> data) = 0;

  // Returns once every rank has called Barrier.
  [[nodiscard]] virtual absl::Status Barrier() = 0;
};

}  // namespace mmserve

#endif  // MMSERVE_COMMON_COMMUNICATOR_H_
