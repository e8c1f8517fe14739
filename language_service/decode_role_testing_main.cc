// Test-only: a role-decode language instance in a process of its own, as
// roles_testing.h's Instance builds one (the tiny test model, shm), so that
// a test can kill the decode side mid-hand-off. Prints its gRPC port on a
// line of its own once it serves, then runs until killed.
//
//   decode_role_testing_main <model_dir>
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <string>

#include "common/grpc_server.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "language_service/language_core.h"
#include "language_service/language_service.h"
#include "model/model_config.h"
#include "transfer/transfer_engine.h"

namespace mmserve::language {
namespace {

absl::Status Serve(const std::string& model_dir) {
  auto config = model::LoadModelConfig(model_dir);
  if (!config.ok()) return config.status();
  transfer::TransferEngineOptions topts;
  topts.instance_id = "decode";
  topts.layout.block_size = 16;
  topts.layout.num_blocks = 8;
  topts.layout.hidden_size = static_cast<uint32_t>(config->text.hidden_size);
  topts.layout.dtype_bytes = sizeof(float);
  auto transfer = transfer::TransferEngine::Create(topts);
  if (!transfer.ok()) return transfer.status();
  LanguageCoreOptions o;
  o.instance_id = "decode";
  o.role.kind = LanguageRole::kDecode;
  o.engine.model_dir = model_dir;
  o.engine.block_size = 4;
  o.engine.kv_cache_bytes = 8 << 20;
  o.engine.max_num_seqs = 8;
  o.engine.max_num_batched_tokens = 64;
  o.engine.num_threads = 1;
  metrics::Registry registry;
  auto core = LanguageCore::Create(o, **transfer, registry);
  if (!core.ok()) return core.status();
  LanguageService service(**core, **transfer, registry);
  auto server = StartGrpcServer("127.0.0.1:0", {&service});
  if (!server.ok()) return server.status();
  (*server)->SetServing(true);
  std::printf("%d\n", (*server)->port());
  std::fflush(stdout);
  for (;;) pause();
}

}  // namespace
}  // namespace mmserve::language

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <model_dir>\n", argv[0]);
    return 2;
  }
  const absl::Status s = mmserve::language::Serve(argv[1]);
  std::fprintf(stderr, "%s\n", s.ToString().c_str());
  return 1;
}
