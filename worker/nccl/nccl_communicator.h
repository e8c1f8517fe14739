// The NCCL Communicator backend, for ranks that each drive one
// GPU. Built only with --config=cuda (//worker/nccl is incompatible
// otherwise).
//
//   NcclCommunicatorOptions o{.instance_id = "lang0-1234", .rank = r, .world_size = 2};
//   ASSIGN_OR_RETURN(auto comm, NcclCommunicator::Join(o));
//   RETURN_IF_ERROR(comm->AllReduceSum(absl::MakeSpan(device_ptr, n)));
//
// Every span passed to a collective must be memory of the rank's device
// (cudaMalloc or managed). Each call is enqueued on the communicator's own
// stream and waited for before it returns (the Communicator contract is
// blocking). Bootstrap: rank 0's ncclUniqueId travels to the others through
// a ShmSegment named "/mmserve-nccl-<instance_id>" (unlinked once all ranks
// mapped it), which also gives each rank its peers' pids.
// Failures: while waiting, a rank polls the stream, NCCL's asynchronous error
// and, every 50 ms, its peers' liveness and its deadline; on any failure it
// aborts the NCCL communicator (ncclCommAbort) and returns UNAVAILABLE, and
// every later call fails the same way. NCCL and CUDA return codes are turned
// into Status with the call's text and file:line.
// Thread-safety: as Communicator (one calling thread per rank).
#ifndef MMSERVE_WORKER_NCCL_NCCL_COMMUNICATOR_H_
#define MMSERVE_WORKER_NCCL_NCCL_COMMUNICATOR_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/communicator.h"
#include "worker/shm_segment.h"

namespace mmserve::worker {

struct NcclCommunicatorOptions {
  std::string instance_id;  // unique per launch (ValidateInstanceId)
  int rank = 0;
  int world_size = 1;
  int device = -1;  // CUDA device of this rank; -1: device `rank`
  absl::Duration timeout = absl::Seconds(120);
};

class NcclCommunicator final : public Communicator {
 public:
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<NcclCommunicator>> Join(
      const NcclCommunicatorOptions& options);
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return options_.rank; }
  int world_size() const override { return options_.world_size; }

  absl::Status AllReduceSum(absl::Span<float> data) override;
  absl::Status Gather(absl::Span<const float> in, absl::Span<float> out) override;
  absl::Status AllGather(absl::Span<const float> in, absl::Span<float> out) override;
  absl::Status Broadcast(absl::Span<float> data) override;
  absl::Status Barrier() override;

 private:
  struct Handles;  // ncclComm_t, cudaStream_t, scratch: kept out of this header
  NcclCommunicator(const NcclCommunicatorOptions& options, std::unique_ptr<ShmSegment> segment);
  // Waits for the work enqueued on the stream, with the failure rules above.
  absl::Status Wait(const char* what);
  absl::Status Fail(absl::Status why);

  NcclCommunicatorOptions options_;
  std::unique_ptr<ShmSegment> segment_;
  std::unique_ptr<Handles> h_;
  bool broken_ = false;
};

}  // namespace mmserve::worker

#endif  // MMSERVE_WORKER_NCCL_NCCL_COMMUNICATOR_H_
