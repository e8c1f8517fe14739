// Arbitrary GenerateRequest protos (the fuzz input parsed as the wire bytes
// the router's gRPC server receives) through the router's request checks,
// PrepareRequest. Properties (fuzz/router_request_check.h): never crashes;
// every refusal is INVALID_ARGUMENT with a message; results are idempotent
// and survive a wire round trip; presize only adds the header checks; an
// accepted request has one grid per image, and where the encoder's decode
// succeeds its preprocessing gives that same grid (header vs decode).
// Inputs that are not a valid GenerateRequest are skipped: the gRPC server
// refuses them before the router sees them.
#include <cstddef>
#include <cstdint>

#include "fuzz/fuzz_check.h"
#include "fuzz/router_request_check.h"
#include "google/protobuf/stubs/logging.h"
#include "proto/inference.pb.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Invalid UTF-8 in a string field fails the parse with a log line each
  // time; the verdict is what matters, the lines only slow the run.
  static const bool quiet = [] {
    google::protobuf::SetLogHandler(nullptr);
    return true;
  }();
  (void)quiet;
  mmserve::v1::GenerateRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return 0;
  mmserve::fuzz::CheckPrepareRequest(mmserve::fuzz::FuzzRouterOptions(), request).IgnoreError();
  return 0;
}
