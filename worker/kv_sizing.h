// How many KV blocks the engine allocates: what it can use at most
// (max_num_seqs sequences of max_model_len tokens, rounded up to blocks),
// capped by a share of the memory available; or exactly the bytes asked for.
//
//   KvSizingInputs in{.block_size = 16, .max_num_seqs = 32, .max_model_len = 4096, ...};
//   ASSIGN_OR_RETURN(KvSizing s, DecideKvBlocks(in));
//   LOG(INFO) << s.Describe();
//
// Pure functions; thread-safe.
#ifndef MMSERVE_WORKER_KV_SIZING_H_
#define MMSERVE_WORKER_KV_SIZING_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace mmserve::worker {

struct KvSizingInputs {
  int block_size = 16;
  int max_num_seqs = 32;
  int max_model_len = 0;
  size_t block_bytes = 0;        // one block over all layers, K and V
  size_t requested_bytes = 0;    // 0: automatic
  int64_t available_bytes = 0;   // MemAvailable after loading and warm-up
  double memory_fraction = 0.3;  // share of available_bytes the cache may take
};

struct KvSizing {
  int num_blocks = 0;
  int64_t wanted_blocks = 0;  // max_num_seqs x ceil(max_model_len / block_size)
  int64_t cap_blocks = 0;     // what the memory share (or the request) holds
  bool requested = false;     // sized by requested_bytes
  size_t block_bytes = 0;
  std::string Describe() const;
};

// ResourceExhausted when fewer than 2 blocks fit; InvalidArgument for
// non-positive sizes.
[[nodiscard]] absl::StatusOr<KvSizing> DecideKvBlocks(const KvSizingInputs& in);

}  // namespace mmserve::worker

#endif  // MMSERVE_WORKER_KV_SIZING_H_
