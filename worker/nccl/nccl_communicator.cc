#include "worker/nccl/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace mmserve::worker {
namespace {

constexpr absl::Duration kPeerCheckEvery = absl::Milliseconds(50);

absl::Status NcclError(ncclResult_t r, const char* call, const char* file, int line) {
  return absl::InternalError(
      absl::StrCat(call, " failed at ", file, ":", line, ": ", ncclGetErrorString(r)));
}
absl::Status CudaError(cudaError_t e, const char* call, const char* file, int line) {
  return absl::InternalError(
      absl::StrCat(call, " failed at ", file, ":", line, ": ", cudaGetErrorString(e)));
}

#define MMSERVE_NCCL(call)                                               \
  do {                                                                   \
    const ncclResult_t mmserve_nccl_r = (call);                          \
    if (mmserve_nccl_r != ncclSuccess) {                                 \
      return Fail(NcclError(mmserve_nccl_r, #call, __FILE__, __LINE__)); \
    }                                                                    \
  } while (0)

#define MMSERVE_CUDA(call)                                               \
  do {                                                                   \
    const cudaError_t mmserve_cuda_e = (call);                           \
    if (mmserve_cuda_e != cudaSuccess) {                                 \
      return Fail(CudaError(mmserve_cuda_e, #call, __FILE__, __LINE__)); \
    }                                                                    \
  } while (0)

// The bootstrap area of the segment.
struct Bootstrap {
  std::atomic<uint32_t> ready;  // 1 once rank 0 wrote id
  ncclUniqueId id;
};

}  // namespace

struct NcclCommunicator::Handles {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  float* scratch = nullptr;  // one float on the device, for Barrier
  bool aborted = false;
};

NcclCommunicator::NcclCommunicator(const NcclCommunicatorOptions& options,
                                   std::unique_ptr<ShmSegment> segment)
    : options_(options), segment_(std::move(segment)), h_(std::make_unique<Handles>()) {}

NcclCommunicator::~NcclCommunicator() {
  if (h_->comm != nullptr) {
    if (h_->aborted) {
      // ncclCommAbort already freed it.
    } else {
      ncclCommDestroy(h_->comm);
    }
  }
  if (h_->scratch != nullptr) cudaFree(h_->scratch);
  if (h_->stream != nullptr) cudaStreamDestroy(h_->stream);
}

absl::Status NcclCommunicator::Fail(absl::Status why) {
  broken_ = true;
  if (h_->comm != nullptr && !h_->aborted) {
    ncclCommAbort(h_->comm);
    h_->aborted = true;
  }
  (void)segment_->Break(absl::UnavailableError(why.message()));
  return why;
}

absl::StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::Join(
    const NcclCommunicatorOptions& o) {
  if (absl::Status s = ValidateInstanceId(o.instance_id); !s.ok()) return s;
  ShmSegmentOptions so;
  so.name = absl::StrCat("/mmserve-nccl-", o.instance_id);
  so.rank = o.rank;
  so.world_size = o.world_size;
  so.user_bytes = sizeof(Bootstrap);
  so.timeout = o.timeout;
  auto segment = ShmSegment::Join(so);
  if (!segment.ok()) return segment.status();
  std::unique_ptr<NcclCommunicator> c(new NcclCommunicator(o, *std::move(segment)));
  auto* boot = static_cast<Bootstrap*>(c->segment_->data());
  const absl::Time deadline = absl::Now() + o.timeout;
  const int device = o.device >= 0 ? o.device : o.rank;
  {
    // The macros return through Fail, which needs the object: a lambda keeps
    // the StatusOr return type out of them.
    absl::Status s = [&]() -> absl::Status {
      NcclCommunicator* self = c.get();
      auto Fail = [self](absl::Status why) { return self->Fail(std::move(why)); };
      MMSERVE_CUDA(cudaSetDevice(device));
      if (o.rank == 0) {
        MMSERVE_NCCL(ncclGetUniqueId(&boot->id));
        boot->ready.store(1, std::memory_order_release);
      } else {
        while (boot->ready.load(std::memory_order_acquire) != 1) {
          absl::Status p = self->segment_->CheckPeers(deadline, "waiting for rank 0's NCCL id");
          if (!p.ok()) return p;
          absl::SleepFor(absl::Milliseconds(1));
        }
      }
      MMSERVE_CUDA(cudaStreamCreateWithFlags(&self->h_->stream, cudaStreamNonBlocking));
      MMSERVE_CUDA(cudaMalloc(&self->h_->scratch, sizeof(float)));
      MMSERVE_NCCL(ncclCommInitRank(&self->h_->comm, o.world_size, boot->id, o.rank));
      return absl::OkStatus();
    }();
    if (!s.ok()) return s;
  }
  return c;
}

absl::Status NcclCommunicator::Wait(const char* what) {
  const absl::Time deadline = absl::Now() + options_.timeout;
  absl::Time next_check = absl::Now() + kPeerCheckEvery;
  while (true) {
    const cudaError_t q = cudaStreamQuery(h_->stream);
    if (q == cudaSuccess) return absl::OkStatus();
    if (q != cudaErrorNotReady) {
      return Fail(absl::UnavailableError(
          absl::StrCat(what, ": the stream failed: ", cudaGetErrorString(q))));
    }
    ncclResult_t async = ncclSuccess;
    if (ncclCommGetAsyncError(h_->comm, &async) == ncclSuccess && async != ncclSuccess &&
        async != ncclInProgress) {
      return Fail(absl::UnavailableError(
          absl::StrCat(what, ": NCCL reported ", ncclGetErrorString(async))));
    }
    const absl::Time now = absl::Now();
    if (now >= next_check) {
      absl::Status s = segment_->CheckPeers(deadline, what);
      if (!s.ok()) return Fail(s);
      next_check = now + kPeerCheckEvery;
    }
    absl::SleepFor(absl::Microseconds(20));
  }
}

absl::Status NcclCommunicator::AllReduceSum(absl::Span<float> data) {
  if (broken_) return absl::UnavailableError("NCCL communicator is out of service");
  MMSERVE_NCCL(ncclAllReduce(data.data(), data.data(), data.size(), ncclFloat, ncclSum, h_->comm,
                             h_->stream));
  return Wait("all-reduce");
}

absl::Status NcclCommunicator::Gather(absl::Span<const float> in, absl::Span<float> out) {
  if (broken_) return absl::UnavailableError("NCCL communicator is out of service");
  const size_t n = in.size();
  const int world = options_.world_size;
  if (options_.rank == 0) {
    if (out.size() < world * n) {
      // The peers are already in the call: take them down too.
      return Fail(absl::InvalidArgumentError(
          absl::StrCat("gather output has ", out.size(), " floats; need ", world * n)));
    }
    MMSERVE_CUDA(cudaMemcpyAsync(out.data(), in.data(), n * sizeof(float), cudaMemcpyDeviceToDevice,
                                 h_->stream));
    MMSERVE_NCCL(ncclGroupStart());
    for (int r = 1; r < world; ++r) {
      MMSERVE_NCCL(ncclRecv(out.data() + r * n, n, ncclFloat, r, h_->comm, h_->stream));
    }
    MMSERVE_NCCL(ncclGroupEnd());
  } else {
    MMSERVE_NCCL(ncclSend(in.data(), n, ncclFloat, 0, h_->comm, h_->stream));
  }
  return Wait("gather");
}

absl::Status NcclCommunicator::AllGather(absl::Span<const float> in, absl::Span<float> out) {
  if (broken_) return absl::UnavailableError("NCCL communicator is out of service");
  if (out.size() < options_.world_size * in.size()) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        "all-gather output has ", out.size(), " floats; need ", options_.world_size * in.size())));
  }
  MMSERVE_NCCL(ncclAllGather(in.data(), out.data(), in.size(), ncclFloat, h_->comm, h_->stream));
  return Wait("all-gather");
}

absl::Status NcclCommunicator::Broadcast(absl::Span<float> data) {
  if (broken_) return absl::UnavailableError("NCCL communicator is out of service");
  MMSERVE_NCCL(
      ncclBroadcast(data.data(), data.data(), data.size(), ncclFloat, 0, h_->comm, h_->stream));
  return Wait("broadcast");
}

absl::Status NcclCommunicator::Barrier() {
  if (broken_) return absl::UnavailableError("NCCL communicator is out of service");
  MMSERVE_NCCL(
      ncclAllReduce(h_->scratch, h_->scratch, 1, ncclFloat, ncclSum, h_->comm, h_->stream));
  return Wait("barrier");
}

}  // namespace mmserve::worker
