// vision_bench's optional peer: transformers' Qwen2-VL vision tower in
// PyTorch on the same patch grids, threads and depth, run as a child process
// (tools/torch_vision_peer.py under the tools virtualenv's Python). Nothing
// here needs PyTorch to build or run: when the interpreter, the script or
// PyTorch is missing, the result says why and the bench goes on without it.
//
//   TorchVisionPeerRequest req{python, script, {{1, 32, 32}}, /*depth=*/32,
//                              /*threads=*/2, "bfloat16", /*iters=*/1};
//   TorchVisionPeerResult peer = RunTorchVisionPeer(req);
//   if (peer.ran) ratio = peer.seconds[0] / our_seconds;  // > 1: we are faster
//
// Blocks until the child exits. Thread-safety: no shared state.
#ifndef MMSERVE_BENCH_TORCH_VISION_PEER_H_
#define MMSERVE_BENCH_TORCH_VISION_PEER_H_

#include <string>
#include <vector>

#include "model/image_tokens.h"

namespace mmserve::bench {

struct TorchVisionPeerRequest {
  std::string python;  // interpreter with torch + transformers
  std::string script;  // tools/torch_vision_peer.py
  std::vector<model::MediaGrid> grids;
  int depth = 32;
  int threads = 1;
  std::string dtype;  // "float32" or "bfloat16"
  int iters = 1;
};

struct TorchVisionPeerResult {
  bool ran = false;
  std::string skipped_reason;   // when !ran
  std::vector<double> seconds;  // per grid, in order
  std::string torch_version;
};

TorchVisionPeerResult RunTorchVisionPeer(const TorchVisionPeerRequest& request);

// The script's default place: $BUILD_WORKSPACE_DIRECTORY/tools/... under
// `bazel run`, else tools/... relative to the working directory.
std::string DefaultTorchVisionPeerScript();

}  // namespace mmserve::bench

#endif  // MMSERVE_BENCH_TORCH_VISION_PEER_H_
