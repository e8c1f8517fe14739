// Where a load run sends its requests. Each target sends one WorkItem
// without blocking the caller and fills the request's Record as the
// responses arrive (times from the run's Stopwatch), then calls `done` once.
//
//   router   (gRPC): mmserve.v1.Inference/Generate, end to end;
//   language (gRPC): mmserve.v1.Language/Prefill on a role-both instance,
//                    text-only items (no encoder involved);
//   http:            the router's OpenAI /v1/chat/completions, streamed (SSE);
//                    one token per content chunk, the count from usage;
//   encoder (gRPC):  mmserve.internal.v1.Encoder/Encode on one encoder, the
//                    embeddings received over UCX into a sink this process
//                    hosts (encoder_target.h).
//
//   ASSIGN_OR_RETURN(auto target, MakeTarget("router", "127.0.0.1:50051", &clock));
//   target->Send(item, &record, [] { ... });
//
// Thread-safe: Send may be called from any thread; `done` runs on a gRPC or
// HTTP thread.
#ifndef MMSERVE_BENCH_LOADGEN_TARGET_H_
#define MMSERVE_BENCH_LOADGEN_TARGET_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "bench/loadgen/stats.h"
#include "bench/loadgen/workload.h"
#include "common/clock.h"

namespace mmserve::loadgen {

class Target {
 public:
  virtual ~Target() = default;
  // Waits until the connection is up, so that the run does not start with
  // the handshake (gRPC fails calls fast while a first connect is pending).
  // UNAVAILABLE when it is not up within `timeout`.
  [[nodiscard]] virtual absl::Status Connect(absl::Duration timeout) = 0;
  // `record->sent_s` is set by the caller; the target fills the rest.
  virtual void Send(const WorkItem& item, Record* record, std::function<void()> done) = 0;
  // After a run: whether what this process holds for the target (the
  // encoder sink's blocks and transfers) is all given back within `timeout`;
  // FAILED_PRECONDITION naming what is still held otherwise. Targets that
  // hold nothing answer OK.
  [[nodiscard]] virtual absl::Status Drained(absl::Duration timeout) { return absl::OkStatus(); }
};

struct TargetOptions {
  std::string kind = "router";  // router | language | http | encoder
  std::string address;          // host:port (http: the HTTP port's)
  absl::Duration timeout = absl::Seconds(60);
  // encoder: the sink's embedding buffer. hidden_size must be the model's
  // (the encoder refuses another); profile the encoder's (shm or tcp).
  uint32_t hidden_size = 0;
  std::string profile = "shm";
  uint32_t sink_blocks = 256;  // of 128 tokens
};

// INVALID_ARGUMENT for an unknown kind or a malformed address.
absl::StatusOr<std::unique_ptr<Target>> MakeTarget(const TargetOptions& options,
                                                   const Stopwatch* clock);

}  // namespace mmserve::loadgen

#endif  // MMSERVE_BENCH_LOADGEN_TARGET_H_
