// The NCCL backend on real GPUs, ranks as forked processes (each initialises
// CUDA after the fork). World 1 on one device; world 2 when two exist.
#include "worker/nccl/nccl_communicator.h"

#include <cuda_runtime.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <vector>

#include "worker/fork_ranks.h"

namespace mmserve::worker {
namespace {

// Devices, counted in a child so that this process never initialises CUDA.
int DeviceCount() {
  return WaitChild(ForkChild([] {
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
  }));
}

// Rank `rank` of `world`: all-reduce, all-gather, gather, broadcast and a
// barrier on device memory, checked against the host arithmetic. 0 if all
// match.
int Collectives(const std::string& id, int rank, int world) {
  auto comm = NcclCommunicator::Join({id, rank, world});
  if (!comm.ok()) return 10;
  constexpr size_t kN = 16 * 896;
  std::vector<float> host(kN);
  for (size_t i = 0; i < kN; ++i) host[i] = static_cast<float>((i % 97) * (rank + 1));
  float *data = nullptr, *out = nullptr;
  if (cudaMalloc(&data, kN * sizeof(float)) != cudaSuccess) return 11;
  if (cudaMalloc(&out, world * kN * sizeof(float)) != cudaSuccess) return 11;
  cudaMemcpy(data, host.data(), kN * sizeof(float), cudaMemcpyHostToDevice);
  if (!(*comm)->AllReduceSum(absl::MakeSpan(data, kN)).ok()) return 12;
  std::vector<float> got(kN);
  cudaMemcpy(got.data(), data, kN * sizeof(float), cudaMemcpyDeviceToHost);
  for (size_t i = 0; i < kN; ++i) {
    float want = 0;
    for (int r = 0; r < world; ++r) want += static_cast<float>((i % 97) * (r + 1));
    if (got[i] != want) return 13;
  }
  cudaMemcpy(data, host.data(), kN * sizeof(float), cudaMemcpyHostToDevice);
  if (!(*comm)->AllGather(absl::MakeConstSpan(data, kN), absl::MakeSpan(out, world * kN)).ok()) {
    return 14;
  }
  std::vector<float> all(world * kN);
  cudaMemcpy(all.data(), out, all.size() * sizeof(float), cudaMemcpyDeviceToHost);
  for (int r = 0; r < world; ++r) {
    for (size_t i = 0; i < kN; ++i) {
      if (all[r * kN + i] != static_cast<float>((i % 97) * (r + 1))) return 15;
    }
  }
  if (!(*comm)->Gather(absl::MakeConstSpan(data, kN), absl::MakeSpan(out, world * kN)).ok()) {
    return 16;
  }
  if (!(*comm)->Broadcast(absl::MakeSpan(data, kN)).ok()) return 17;
  cudaMemcpy(got.data(), data, kN * sizeof(float), cudaMemcpyDeviceToHost);
  for (size_t i = 0; i < kN; ++i) {
    if (got[i] != static_cast<float>(i % 97)) return 18;  // rank 0's values
  }
  if (!(*comm)->Barrier().ok()) return 19;
  cudaFree(data);
  cudaFree(out);
  return 0;
}

TEST_CASE("NCCL collectives on device memory give the host arithmetic's results", "[nccl]") {
  const int devices = DeviceCount();
  REQUIRE(devices >= 1);  // this test is meant for machines with a GPU
  for (int world : {1, 2}) {
    if (world > devices) continue;
    INFO("world " << world);
    const std::string id = UniqueInstanceId("nccl");
    // Every rank in a child: CUDA is initialised after the fork.
    std::vector<pid_t> ranks;
    for (int r = 0; r < world; ++r) {
      ranks.push_back(ForkChild([&, r] { return Collectives(id, r, world); }));
    }
    for (pid_t pid : ranks) CHECK(WaitChild(pid) == 0);
  }
}

}  // namespace
}  // namespace mmserve::worker
