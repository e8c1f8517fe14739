// language: the language service process, role `both` (colocated prefill and
// decode), `prefill` or `decode` (--role; KV hand-off over UCX). Loads only the language model,
// receives image embeddings from encoder services over UCX, and streams tokens to the router.
//
//   bazel run --config=opt //language_service:language -- \
//       --model_dir=models/shapes-demo --port=50071 --router=localhost:50051
//
// SIGTERM/SIGINT: stops accepting, lets running requests finish (up to
// --drain_seconds), ends the rest with UNAVAILABLE, frees every block.
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/file.h"
#include "common/grpc_server.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "common/metrics_http.h"
#include "common/registry_client.h"
#include "language_service/language_core.h"
#include "language_service/language_service.h"
#include "transfer/transfer_engine.h"
#include "worker/shm_file.h"

ABSL_FLAG(std::string, role, "both",
          "both; or prefill (runs prompts to the first token and hands the KV to the decode "
          "instance the router names) or decode (takes hand-offs and streams the rest); "
          "prefill and decode: text and image prompts; prefill --tp=1, decode any --tp (each "
          "rank receives its own KV heads)");
ABSL_FLAG(int, kv_commit_timeout_ms, 10000,
          "role decode: how long a KV reservation waits for the prefill side's commit");
ABSL_FLAG(int, test_kv_handoff_delay_ms, 0,
          "TEST ONLY (fault tests): role prefill waits this long between AllocateKv and the "
          "KV puts of every hand-off, so that a kill lands mid-hand-off; 0 in production");
ABSL_FLAG(std::string, model_dir, "", "Hugging Face model directory (Qwen2 / Qwen2-VL)");
ABSL_FLAG(std::string, host, "127.0.0.1", "address to listen on");
ABSL_FLAG(int, port, 50071, "gRPC port (0: pick one; the chosen port is printed)");
ABSL_FLAG(int, metrics_port, 0, "Prometheus /metrics port (0: pick one; -1: off)");
ABSL_FLAG(std::string, advertise, "", "host:port the router should call (default host:port)");
ABSL_FLAG(std::string, instance_id, "language-0", "unique instance id");
ABSL_FLAG(std::string, router, "", "router's host:port to register with (empty: do not)");
ABSL_FLAG(std::string, profile, "shm", "UCX transport profile: shm (same host) or tcp");
ABSL_FLAG(uint32_t, embedding_block_size, 128, "embedding receive buffer: tokens per block");
ABSL_FLAG(uint32_t, embedding_blocks, 256, "embedding receive buffer: blocks");
ABSL_FLAG(uint32_t, default_blocks, 1,
          "blocks a receive takes when the router could not pre-size the image");
ABSL_FLAG(int, kv_cache_mb, 256, "KV cache size in MiB (0: a share of free memory)");
ABSL_FLAG(int, max_num_seqs, 64, "most running sequences");
ABSL_FLAG(int, max_num_batched_tokens, 2048, "token budget per step");
ABSL_FLAG(int, max_prefill_tokens, 0,
          "seed 003: prefill tokens per step at most, below max_num_batched_tokens (0: no cap)");
ABSL_FLAG(bool, enable_chunked_prefill, true,
          "split prompts into chunks that fit a step's budget (off: a prompt is prefilled in "
          "one step; one larger than the budget runs as the step's only prefill)");
ABSL_FLAG(int, max_model_len, 0, "longest prompt + completion (0: the model's, capped at 8192)");
ABSL_FLAG(int, threads, 0, "compute threads (0: one per core)");
ABSL_FLAG(std::string, quantize, "", "quantize language weights at load: int8 or int8_g32");
ABSL_FLAG(int, transfer_timeout_ms, 30000, "one image's embedding transfer");
ABSL_FLAG(int, tp, 1,
          "tensor-parallel ranks of this instance: this process is rank 0 and starts ranks "
          "1..tp-1 from --tp_shard_binary on this host");
ABSL_FLAG(std::string, tp_shard_binary, "",
          "the //worker:tp_shard binary (default: beside this binary in bazel-bin or its "
          "runfiles)");
ABSL_FLAG(std::string, mm_handoff, "async",
          "seed 000: async (image embeddings are read where UCX wrote them, in a receive "
          "buffer every tensor-parallel rank maps; steps carry descriptors) or blocking (the "
          "loop copies each embedding out and rank 0 copies its rows into every step: the "
          "baseline, to measure against)");
ABSL_FLAG(int, drain_seconds, 10, "on SIGTERM, how long running requests may take");

namespace mmserve::language {
namespace {

// The tp_shard binary beside this one: in its runfiles, or in bazel-bin.
std::string DefaultShardBinary() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return "tp_shard";
  const std::string exe(buf, n);
  const std::string dir = exe.substr(0, exe.rfind('/'));
  for (const std::string& c : {exe + ".runfiles/mmserve/worker/tp_shard",
                               dir + "/../worker/tp_shard", dir + "/tp_shard"}) {
    if (access(c.c_str(), X_OK) == 0) return c;
  }
  return dir + "/../worker/tp_shard";
}

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "language: %s\n", s.ToString().c_str());
  return 1;
}

int Main() {
  BlockTerminationSignals();
  const std::string role_flag = absl::GetFlag(FLAGS_role);
  LanguageRole role = LanguageRole::kBoth;
  v1::InstanceRole registry_role = v1::INSTANCE_ROLE_BOTH;
  if (role_flag == "prefill") {
    role = LanguageRole::kPrefill;
    registry_role = v1::INSTANCE_ROLE_PREFILL;
  } else if (role_flag == "decode") {
    role = LanguageRole::kDecode;
    registry_role = v1::INSTANCE_ROLE_DECODE;
  } else if (role_flag != "both") {
    std::fprintf(stderr, "language: --role must be both, prefill or decode, not %s\n",
                 role_flag.c_str());
    return 2;
  }
  if (role == LanguageRole::kPrefill && absl::GetFlag(FLAGS_tp) != 1) {
    std::fprintf(stderr, "language: --role=prefill needs --tp=1 for now (decode takes --tp)\n");
    return 2;
  }
  if (absl::GetFlag(FLAGS_model_dir).empty()) {
    std::fprintf(stderr, "language: --model_dir is required\n");
    return 2;
  }
  if (absl::GetFlag(FLAGS_threads) < 0) {
    std::fprintf(stderr, "language: --threads must be >= 0\n");
    return 2;
  }
  auto profile = transfer::ParseTransportProfile(absl::GetFlag(FLAGS_profile));
  if (!profile.ok()) return Fail(profile.status());
  auto config = model::LoadModelConfig(absl::GetFlag(FLAGS_model_dir));
  if (!config.ok()) return Fail(config.status());
  const std::string id = absl::GetFlag(FLAGS_instance_id);

  transfer::TransferEngineOptions topts;
  topts.instance_id = id;
  topts.profile = *profile;
  topts.layout.block_size = absl::GetFlag(FLAGS_embedding_block_size);
  topts.layout.num_blocks = absl::GetFlag(FLAGS_embedding_blocks);
  topts.layout.hidden_size = static_cast<uint32_t>(config->text.hidden_size);
  topts.layout.dtype_bytes = sizeof(float);
  topts.default_num_blocks = absl::GetFlag(FLAGS_default_blocks);
  const std::string handoff_flag = absl::GetFlag(FLAGS_mm_handoff);
  if (handoff_flag != "async" && handoff_flag != "blocking") {
    std::fprintf(stderr, "language: --mm_handoff must be async or blocking, not %s\n",
                 handoff_flag.c_str());
    return 2;
  }
  const MmHandoff handoff = handoff_flag == "async" ? MmHandoff::kAsync : MmHandoff::kBlocking;
  // Seed 000: the receive buffer in memory the shard ranks inherit and map
  // (no name in /dev/shm, so nothing to unlink on any exit path). Declared
  // before the transfer engine and the core, which use it until they go.
  std::unique_ptr<worker::ShmFile> shared_input;
  if (handoff == MmHandoff::kAsync && absl::GetFlag(FLAGS_tp) > 1) {
    auto f = worker::ShmFile::Create(absl::StrCat(id, "-recv"), topts.layout.total_bytes());
    if (!f.ok()) return Fail(f.status());
    shared_input = *std::move(f);
    topts.buffer_memory = shared_input->data();
  }
  auto transfer = transfer::TransferEngine::Create(topts);
  if (!transfer.ok()) return Fail(transfer.status());

  metrics::Registry registry;
  LanguageCoreOptions copts;
  copts.instance_id = id;
  copts.role = role;
  copts.kv_profile = *profile;
  copts.kv_commit_timeout = absl::Milliseconds(absl::GetFlag(FLAGS_kv_commit_timeout_ms));
  if (absl::GetFlag(FLAGS_test_kv_handoff_delay_ms) < 0) {
    return Fail(absl::InvalidArgumentError("--test_kv_handoff_delay_ms must be >= 0"));
  }
  copts.test_kv_handoff_delay = absl::Milliseconds(absl::GetFlag(FLAGS_test_kv_handoff_delay_ms));
  copts.engine.model_dir = absl::GetFlag(FLAGS_model_dir);
  copts.engine.kv_cache_bytes = int64_t{absl::GetFlag(FLAGS_kv_cache_mb)} << 20;
  copts.engine.max_num_seqs = absl::GetFlag(FLAGS_max_num_seqs);
  copts.engine.max_num_batched_tokens = absl::GetFlag(FLAGS_max_num_batched_tokens);
  if (absl::GetFlag(FLAGS_max_prefill_tokens) < 0) {
    return Fail(absl::InvalidArgumentError("--max_prefill_tokens must be >= 0 (0: no cap)"));
  }
  if (absl::GetFlag(FLAGS_max_prefill_tokens) > 0) {
    copts.engine.max_prefill_tokens = absl::GetFlag(FLAGS_max_prefill_tokens);
  }
  copts.engine.enable_chunked_prefill = absl::GetFlag(FLAGS_enable_chunked_prefill);
  copts.engine.max_model_len = absl::GetFlag(FLAGS_max_model_len);
  copts.engine.num_threads = absl::GetFlag(FLAGS_threads);
  copts.engine.quantize = absl::GetFlag(FLAGS_quantize);
  copts.engine.tp_size = absl::GetFlag(FLAGS_tp);
  if (copts.engine.tp_size > 1) {
    copts.engine.tp_shard_binary = absl::GetFlag(FLAGS_tp_shard_binary).empty()
                                       ? DefaultShardBinary()
                                       : absl::GetFlag(FLAGS_tp_shard_binary);
    copts.engine.tp_instance_id = absl::StrCat(id, "-", getpid());
    if (shared_input != nullptr) {
      copts.engine.shared_input_fd = shared_input->fd();
      copts.engine.shared_input = shared_input->data();
      copts.engine.shared_input_bytes = shared_input->size();
    }
  }
  copts.mm_handoff = handoff;
  copts.transfer_timeout = absl::Milliseconds(absl::GetFlag(FLAGS_transfer_timeout_ms));
  auto core = LanguageCore::Create(copts, **transfer, registry);
  if (!core.ok()) return Fail(core.status());
  LanguageCore& c = **core;
  transfer::TransferEngine& eng = **transfer;
  registry.AddGaugeCallback("mmserve_language_embedding_blocks_used",
                            "Embedding receive buffer blocks in use.", {},
                            [&eng] { return eng.allocator().used_blocks(); });
  registry.AddGaugeCallback("mmserve_language_embedding_blocks_free",
                            "Embedding receive buffer blocks free.", {},
                            [&eng] { return eng.allocator().free_blocks(); });
  registry.AddGaugeCallback("mmserve_language_kv_blocks_free", "KV cache blocks free.", {},
                            [&c] { return c.Load().kv_blocks_free(); });
  registry.AddGaugeCallback("mmserve_language_kv_blocks_used", "KV cache blocks in use.", {}, [&c] {
    return static_cast<double>(c.Capacity().kv_blocks_total()) - c.Load().kv_blocks_free();
  });
  registry.AddGaugeCallback("mmserve_language_running", "Sequences in the running batch.", {},
                            [&c] { return c.Load().running(); });
  registry.AddGaugeCallback("mmserve_language_queue_length",
                            "Requests waiting (for embeddings or the scheduler).", {},
                            [&c] { return c.Load().waiting(); });
  registry.AddGaugeCallback("mmserve_language_requests_live", "Requests held by the instance.", {},
                            [&c] { return static_cast<double>(c.num_requests()); });

  LanguageService service(c, eng, registry);
  const std::string host = absl::GetFlag(FLAGS_host);
  auto server = StartGrpcServer(absl::StrCat(host, ":", absl::GetFlag(FLAGS_port)), {&service});
  if (!server.ok()) return Fail(server.status());
  std::unique_ptr<metrics::MetricsServer> metrics_server;
  if (absl::GetFlag(FLAGS_metrics_port) >= 0) {
    auto ms = metrics::MetricsServer::Start(registry, host, absl::GetFlag(FLAGS_metrics_port));
    if (!ms.ok()) return Fail(ms.status());
    metrics_server = std::move(*ms);
  }
  const std::string advertise = absl::GetFlag(FLAGS_advertise).empty()
                                    ? absl::StrCat(host, ":", (*server)->port())
                                    : absl::GetFlag(FLAGS_advertise);
  std::unique_ptr<RegistryClient> reg;
  if (!absl::GetFlag(FLAGS_router).empty()) {
    v1::InstanceInfo info;
    info.set_instance_id(id);
    info.set_role(registry_role);
    info.set_grpc_address(advertise);
    info.set_model_id(ModelIdFromDir(absl::GetFlag(FLAGS_model_dir)));
    *info.mutable_ucx() = eng.local_info().ucx();
    info.set_tp_size(static_cast<uint32_t>(copts.engine.tp_size));
    *info.mutable_capacity() = c.Capacity();
    info.mutable_capacity()->set_max_num_seqs(static_cast<uint32_t>(copts.engine.max_num_seqs));
    info.mutable_capacity()->set_max_num_batched_tokens(
        static_cast<uint32_t>(copts.engine.max_num_batched_tokens));
    reg = std::make_unique<RegistryClient>(RegistryClientOptions{
        .router = absl::GetFlag(FLAGS_router), .instance = info, .load = [&c] {
          return c.Load();
        }});
    reg->Start();
  }
  (*server)->SetServing(true);
  std::printf("READY language %s grpc=%s metrics=%d\n", id.c_str(), advertise.c_str(),
              metrics_server ? metrics_server->port() : -1);
  std::fflush(stdout);

  const int sig = WaitForTerminationSignal();
  LOG(INFO) << "language " << id << ": signal " << sig << ", draining";
  service.SetAccepting(false);
  if (reg) reg->Stop();
  // Let running requests finish, then end the rest.
  const Deadline drain = Deadline::After(absl::Seconds(absl::GetFlag(FLAGS_drain_seconds)));
  while (c.num_requests() > 0 && !drain.Expired()) absl::SleepFor(absl::Milliseconds(20));
  c.Shutdown();
  (*server)->Shutdown(absl::Seconds(1));
  core->reset();
  transfer->reset();
  LOG(INFO) << "language " << id << ": stopped";
  return 0;
}

}  // namespace
}  // namespace mmserve::language

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return mmserve::language::Main();
}
