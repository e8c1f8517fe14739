// health_probe: asks a server's grpc.health.v1.Health/Check, for docker
// healthchecks and launch scripts.
//
//   health_probe --address=localhost:50051                # the whole server
//   health_probe --address=localhost:50051 --service=mmserve.v1.Inference
//
// Prints the status (SERVING, NOT_SERVING, ...) and exits 0 only when it is
// SERVING; 1 for any other status; on an RPC error (server down, unknown
// service, deadline) prints the gRPC code and message and exits 2.
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>

#include <iostream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/time/time.h"
#include "client/grpc_calls.h"

ABSL_FLAG(std::string, address, "localhost:50051", "the server's gRPC address, host:port");
ABSL_FLAG(std::string, service, "", "service to ask about; empty = the whole server");
ABSL_FLAG(int64_t, timeout_ms, 2000, "give up after this many milliseconds");

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  auto channel =
      grpc::CreateChannel(absl::GetFlag(FLAGS_address), grpc::InsecureChannelCredentials());
  auto status = mmserve::client::CheckHealth(channel, absl::GetFlag(FLAGS_service),
                                             absl::Milliseconds(absl::GetFlag(FLAGS_timeout_ms)));
  if (!status.ok()) {
    std::cerr << "health_probe: " << absl::StatusCodeToString(status.status().code()) << ": "
              << status.status().message() << "\n";
    return 2;
  }
  std::cout << grpc::health::v1::HealthCheckResponse::ServingStatus_Name(*status) << "\n";
  return *status == grpc::health::v1::HealthCheckResponse::SERVING ? 0 : 1;
}
