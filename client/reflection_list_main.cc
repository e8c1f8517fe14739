// reflection_list: lists the services a gRPC server exposes through server
// reflection, like `grpcurl -plaintext host:port list` (grpcurl is not
// packaged in Debian).
//
//   reflection_list --address=localhost:50051
//   grpc.health.v1.Health
//   grpc.reflection.v1alpha.ServerReflection
//   mmserve.v1.Inference
//
// Exits 0 after printing one name per line; on an error prints the gRPC code
// and message and exits 1.
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>

#include <iostream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/time/time.h"
#include "client/grpc_calls.h"

ABSL_FLAG(std::string, address, "localhost:50051", "the server's gRPC address, host:port");
ABSL_FLAG(int64_t, timeout_ms, 5000, "give up after this many milliseconds");

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  auto channel =
      grpc::CreateChannel(absl::GetFlag(FLAGS_address), grpc::InsecureChannelCredentials());
  auto services =
      mmserve::client::ListServices(channel, absl::Milliseconds(absl::GetFlag(FLAGS_timeout_ms)));
  if (!services.ok()) {
    std::cerr << "reflection_list: " << absl::StatusCodeToString(services.status().code()) << ": "
              << services.status().message() << "\n";
    return 1;
  }
  for (const std::string& name : *services) std::cout << name << "\n";
  return 0;
}
