// The `encoder` load target: Encode calls straight to one encoder service,
// each image's embeddings pulled over UCX into a sink that this process
// hosts - a real TransferEngine on the receiver side of the embedding
// transfer protocol, as a language instance runs it - and freed as soon as they land.
//
// Connect does what a language instance does on first contact: the
// encoder's Connect RPC with the sink's UCX address and buffer layout, then
// the engine's Connect with the encoder's answer (same transport profile and
// hidden size on both ends, else INVALID_ARGUMENT). Each Send then issues the
// Encode call and, at the same time, one Receive per image (the encoder
// starts sending once both are there), like the router and the language
// side do. A request's Record gets:
//   encoded_s:  the Encode call returned (encode latency);
//   end_s:      Encode returned and every image landed in the sink (E2E);
//   sink_bytes: the images' bytes received (tokens x bytes per token);
//   status:     Encode's error if it failed (the receives are then
//               cancelled), else the first receive's error.
//
//   ASSIGN_OR_RETURN(auto t, MakeEncoderTarget({.kind = "encoder", .address = a,
//                                               .hidden_size = 1536}, &clock));
//
// Thread-safe: Send may be called from any thread; `done` runs on a gRPC
// thread or the engine's progress thread.
#ifndef MMSERVE_BENCH_LOADGEN_ENCODER_TARGET_H_
#define MMSERVE_BENCH_LOADGEN_ENCODER_TARGET_H_

#include <memory>

#include "absl/status/statusor.h"
#include "bench/loadgen/target.h"
#include "common/clock.h"

namespace mmserve::loadgen {

// INVALID_ARGUMENT for a hidden size of 0, an unknown profile or a sink of
// no blocks; an engine that cannot start gives its own error.
absl::StatusOr<std::unique_ptr<Target>> MakeEncoderTarget(const TargetOptions& options,
                                                          const Stopwatch* clock);

}  // namespace mmserve::loadgen

#endif  // MMSERVE_BENCH_LOADGEN_ENCODER_TARGET_H_
