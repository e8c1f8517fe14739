// language: the language service process, role `both` (colocated prefill and
// decode), `prefill` or `decode` (--role; KV hand-off over UCX). Loads only the language model,
// receives image embeddings from encoder services over UCX, and streams tokens to the router.
//
//   bazel run --config=opt //language_service:language --
//       --model_dir=models/shapes-demo --port=50071 --router=localhost:50052
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
#include "common/flag_aliases.h"
#include "common/grpc_server.h"
#include "common/internal_plane_flags.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "common/service_process.h"
#include "common/status_macros.h"
#include "language_service/language_core.h"
#include "language_service/language_service.h"
#include "model/cpu/cpu_isa.h"
#include "model/cpu/cpu_isa_flag.h"
#include "transfer/transfer_engine.h"
#include "worker/shm_file.h"

ABSL_FLAG(std::string, role, "both",
          "both; or prefill (runs prompts to the first token and hands the KV to the decode "
          "instance the router names) or decode (takes hand-offs and streams the rest) or elastic "
          "(role both, registered for elastic sequence parallelism; --tp=1); "
          "prefill and decode: text and image prompts, any --tp on either (each decode rank "
          "receives its own KV heads from the prefill rank(s) holding them)");
ABSL_FLAG(int, kv_commit_timeout_ms, 60000,
          "role decode: how long a KV reservation waits for the prefill side's commit (a "
          "layer-wise hand-off allocates when the forward of the prompt's last chunk starts, so "
          "this must cover that forward: up to --max_num_batched_tokens rows); role prefill: how "
          "long a layer-wise hand-off waits for the forward");
ABSL_FLAG(int, handoff_layer_group, 4,
          "role prefill: layers per group of the layer-wise KV hand-off (the decode instance's "
          "blocks are allocated when the forward of the prompt's last chunk starts, and each group "
          "is written to them as soon as that forward has computed it, while the next layers "
          "compute); 0: the whole prompt's KV is sent after its forward. Not yet measured "
          "against other sizes (bench:pd_bench's sweep)");
ABSL_FLAG(int, handoff_layerwise_min_tokens, 8192,
          "role prefill: prompts shorter than this many tokens hand their KV off whole after "
          "their forward (AllocateKv, the writes and CommitKv then, as with "
          "--handoff_layer_group=0). bench:pd_bench at Qwen2-0.5B dims, one thread per instance "
          "(load average 25-36 on 2 cores): whole hand-offs gave 0.91-1.08x role both's TTFT at "
          "512-4096 tokens, layer-wise ones 1.19-2.3x, and the whole hand-off's exposed time was "
          "0.3-1.3% of TTFT; layer-wise above the lengths measured only");
ABSL_FLAG(int, test_kv_handoff_delay_ms, 0,
          "TEST ONLY (fault tests): role prefill waits this long between AllocateKv and the "
          "KV puts of every hand-off (layer-wise: after its first layer group), so that a kill "
          "lands mid-hand-off; 0 in production");
ABSL_FLAG(int, elastic_span_idle_s, 30,
          "role elastic: a span kept for another instance's decode that no span query reached for "
          "this long is freed (mmserve_language_elastic_spans_expired_total counts them)");
ABSL_FLAG(int, elastic_max_prompt_tokens, 0,
          "role elastic: the longest prompt a group prefill may bring (the K/V exchange board "
          "holds 2 layers of its K and V); 0: the model's context; longer ones are refused with "
          "RESOURCE_EXHAUSTED");
ABSL_FLAG(int, elastic_layer_timeout_ms, 2000,
          "role elastic: one layer's K/V exchange of a group prefill, and one span query of a "
          "decode step");
ABSL_FLAG(int, elastic_join_timeout_ms, 10000,
          "role elastic: how long the members of a group prefill wait for each other to join");
// The names these flags had before the feature was called elastic everywhere.
ABSL_FLAG(int, esp_span_idle_s, 30, "deprecated: use --elastic_span_idle_s");
ABSL_FLAG(int, esp_max_prompt_tokens, 0, "deprecated: use --elastic_max_prompt_tokens");
ABSL_FLAG(int, esp_layer_timeout_ms, 2000, "deprecated: use --elastic_layer_timeout_ms");
ABSL_FLAG(int, esp_join_timeout_ms, 10000, "deprecated: use --elastic_join_timeout_ms");
ABSL_FLAG(
    int, test_elastic_step_delay_ms, 0,
    "TEST ONLY (fault tests): each layer of a group prefill and each decode step of an elastic "
    "master waits this long first, so that a kill lands mid-exchange or mid-decode; 0 in "
    "production");
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
ABSL_FLAG(int, priority_aging_steps, 128,
          "starvation bound of request priorities: a waiting request counts one priority "
          "better for every this many scheduler steps it has waited (down to the best waiting)");
ABSL_FLAG(int, max_num_batched_tokens, 2048, "token budget per step");
ABSL_FLAG(int, max_prefill_tokens, 0,
          "prefill tokens per step at most, below max_num_batched_tokens (0: no cap)");
ABSL_FLAG(bool, enable_chunked_prefill, true,
          "split prompts into chunks that fit a step's budget (off: a prompt is prefilled in "
          "one step; one larger than the budget runs as the step's only prefill)");
ABSL_FLAG(int, max_model_len, 0, "longest prompt + completion (0: the model's, capped at 8192)");
ABSL_FLAG(int, threads, 0, "compute threads (0: one per core)");
ABSL_FLAG(std::string, quantize, "",
          "quantize language weights at load: int8, int8_g32, or 4-bit int4_g32, int4_g128, "
          "int4_g32_zp, int4_g128_zp (groups of 32 or 128 columns, _zp with zero points; "
          "int8 activations; a vision tower in this process stays as stored)");
ABSL_FLAG(std::string, activation_dtype, "",
          "linear layers' activations: f32 (empty), bf16 (rounded to bf16 at each bf16 layer, "
          "fp32 accumulation; not with --quantize or --tp > 1) or int8 (int8 layers quantize "
          "their input to int8, one scale per 32 columns; needs --quantize)");
ABSL_FLAG(int, transfer_timeout_ms, 30000, "one image's embedding transfer");
ABSL_FLAG(int, tp, 1,
          "tensor-parallel ranks of this instance: this process is rank 0 and starts ranks "
          "1..tp-1 from --tp_shard_binary on this host");
ABSL_FLAG(std::string, tp_shard_binary, "",
          "the //worker:tp_shard binary (default: beside this binary in bazel-bin or its "
          "runfiles)");
ABSL_FLAG(std::string, mm_handoff, "async",
          "async (image embeddings are read where UCX wrote them, in a receive "
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

// The role flag, checked against --tp.
absl::StatusOr<LanguageRole> RoleFromFlags() {
  const std::string role = absl::GetFlag(FLAGS_role);
  if (role == "both") return LanguageRole::kBoth;
  if (role == "decode") return LanguageRole::kDecode;
  if (role == "elastic") {
    if (absl::GetFlag(FLAGS_tp) != 1) {
      return absl::InvalidArgumentError(
          "--role=elastic needs --tp=1: a group's K/V exchange and span queries run between "
          "single-rank instances (see docs/elastic.md)");
    }
    return LanguageRole::kElastic;
  }
  if (role != "prefill") {
    return absl::InvalidArgumentError(
        absl::StrCat("--role must be both, prefill, decode or elastic, not ", role));
  }
  return LanguageRole::kPrefill;
}

v1::InstanceRole RegistryRole(LanguageRole role) {
  switch (role) {
    case LanguageRole::kPrefill:
      return v1::INSTANCE_ROLE_PREFILL;
    case LanguageRole::kDecode:
      return v1::INSTANCE_ROLE_DECODE;
    case LanguageRole::kElastic:
      return v1::INSTANCE_ROLE_ELASTIC;
    case LanguageRole::kBoth:
      break;
  }
  return v1::INSTANCE_ROLE_BOTH;
}

// Flag errors a user can fix (exit 2), before anything is loaded.
absl::Status CheckUsage() {
  if (absl::GetFlag(FLAGS_model_dir).empty()) {
    return absl::InvalidArgumentError("--model_dir is required");
  }
  if (absl::GetFlag(FLAGS_threads) < 0) {
    return absl::InvalidArgumentError("--threads must be >= 0");
  }
  if (absl::GetFlag(FLAGS_priority_aging_steps) < 1) {
    return absl::InvalidArgumentError("--priority_aging_steps must be >= 1");
  }
  const std::string handoff = absl::GetFlag(FLAGS_mm_handoff);
  if (handoff != "async" && handoff != "blocking") {
    return absl::InvalidArgumentError(
        absl::StrCat("--mm_handoff must be async or blocking, not ", handoff));
  }
  return RoleFromFlags().status();
}

transfer::TransferEngineOptions TransferOptions(const std::string& id,
                                                transfer::TransportProfile profile,
                                                const model::ModelConfig& config) {
  transfer::TransferEngineOptions topts;
  topts.instance_id = id;
  topts.profile = profile;
  topts.layout.block_size = absl::GetFlag(FLAGS_embedding_block_size);
  topts.layout.num_blocks = absl::GetFlag(FLAGS_embedding_blocks);
  topts.layout.hidden_size = static_cast<uint32_t>(config.EmbeddingRowWidth());
  topts.layout.dtype_bytes = sizeof(float);
  topts.default_num_blocks = absl::GetFlag(FLAGS_default_blocks);
  return topts;
}

absl::StatusOr<worker::EngineOptions> EngineOptionsFromFlags(const std::string& id,
                                                             const worker::ShmFile* shared_input) {
  worker::EngineOptions e;
  e.model_dir = absl::GetFlag(FLAGS_model_dir);
  e.kv_cache_bytes = int64_t{absl::GetFlag(FLAGS_kv_cache_mb)} << 20;
  e.max_num_seqs = absl::GetFlag(FLAGS_max_num_seqs);
  e.priority_aging_steps = absl::GetFlag(FLAGS_priority_aging_steps);
  e.max_num_batched_tokens = absl::GetFlag(FLAGS_max_num_batched_tokens);
  if (absl::GetFlag(FLAGS_max_prefill_tokens) < 0) {
    return absl::InvalidArgumentError("--max_prefill_tokens must be >= 0 (0: no cap)");
  }
  if (absl::GetFlag(FLAGS_max_prefill_tokens) > 0) {
    e.max_prefill_tokens = absl::GetFlag(FLAGS_max_prefill_tokens);
  }
  e.enable_chunked_prefill = absl::GetFlag(FLAGS_enable_chunked_prefill);
  e.max_model_len = absl::GetFlag(FLAGS_max_model_len);
  e.num_threads = absl::GetFlag(FLAGS_threads);
  e.quantize = absl::GetFlag(FLAGS_quantize);
  e.activation_dtype = absl::GetFlag(FLAGS_activation_dtype);
  e.tp_size = absl::GetFlag(FLAGS_tp);
  if (e.tp_size > 1) {
    e.tp_shard_binary = absl::GetFlag(FLAGS_tp_shard_binary).empty()
                            ? DefaultShardBinary()
                            : absl::GetFlag(FLAGS_tp_shard_binary);
    e.tp_instance_id = absl::StrCat(id, "-", getpid());
    if (shared_input != nullptr) {
      e.shared_input_fd = shared_input->fd();
      e.shared_input = shared_input->data();
      e.shared_input_bytes = shared_input->size();
    }
  }
  return e;
}

absl::StatusOr<LanguageCoreOptions> CoreOptionsFromFlags(const std::string& id,
                                                         transfer::TransportProfile profile,
                                                         const worker::ShmFile* shared_input) {
  LanguageCoreOptions copts;
  copts.instance_id = id;
  ASSIGN_OR_RETURN(copts.role.kind, RoleFromFlags());
  copts.role.kv_profile = profile;
  copts.role.kv_commit_timeout = absl::Milliseconds(absl::GetFlag(FLAGS_kv_commit_timeout_ms));
  if (absl::GetFlag(FLAGS_test_kv_handoff_delay_ms) < 0) {
    return absl::InvalidArgumentError("--test_kv_handoff_delay_ms must be >= 0");
  }
  copts.role.test_kv_handoff_delay =
      absl::Milliseconds(absl::GetFlag(FLAGS_test_kv_handoff_delay_ms));
  if (absl::GetFlag(FLAGS_handoff_layer_group) < 0) {
    return absl::InvalidArgumentError("--handoff_layer_group must be >= 0 (0: whole hand-offs)");
  }
  if (absl::GetFlag(FLAGS_handoff_layerwise_min_tokens) < 0) {
    return absl::InvalidArgumentError("--handoff_layerwise_min_tokens must be >= 0");
  }
  copts.role.handoff_layer_group = absl::GetFlag(FLAGS_handoff_layer_group);
  copts.role.handoff_layerwise_min_tokens = absl::GetFlag(FLAGS_handoff_layerwise_min_tokens);
  ASSIGN_OR_RETURN(copts.engine, EngineOptionsFromFlags(id, shared_input));
  copts.mm_handoff =
      absl::GetFlag(FLAGS_mm_handoff) == "async" ? MmHandoff::kAsync : MmHandoff::kBlocking;
  copts.transfer_timeout = absl::Milliseconds(absl::GetFlag(FLAGS_transfer_timeout_ms));
  if (absl::GetFlag(FLAGS_elastic_span_idle_s) <= 0 ||
      absl::GetFlag(FLAGS_elastic_max_prompt_tokens) < 0 ||
      absl::GetFlag(FLAGS_elastic_layer_timeout_ms) <= 0 ||
      absl::GetFlag(FLAGS_elastic_join_timeout_ms) <= 0 ||
      absl::GetFlag(FLAGS_test_elastic_step_delay_ms) < 0) {
    return absl::InvalidArgumentError(
        "--elastic_span_idle_s, --elastic_layer_timeout_ms and --elastic_join_timeout_ms must be > "
        "0, "
        "--elastic_max_prompt_tokens and --test_elastic_step_delay_ms >= 0");
  }
  copts.elastic.span_idle = absl::Seconds(absl::GetFlag(FLAGS_elastic_span_idle_s));
  copts.elastic.max_prompt_tokens =
      static_cast<uint32_t>(absl::GetFlag(FLAGS_elastic_max_prompt_tokens));
  copts.elastic.layer_timeout = absl::Milliseconds(absl::GetFlag(FLAGS_elastic_layer_timeout_ms));
  copts.elastic.join_timeout = absl::Milliseconds(absl::GetFlag(FLAGS_elastic_join_timeout_ms));
  copts.elastic.test_step_delay =
      absl::Milliseconds(absl::GetFlag(FLAGS_test_elastic_step_delay_ms));
  return copts;
}

void AddGauges(metrics::Registry& registry, LanguageCore& c, transfer::TransferEngine& eng) {
  registry
      .GetGauge("mmserve_language_cpu_isa_info", "The CPU kernels' instruction set (label isa).",
                {{"isa", model::cpu::IsaName()}})
      .Set(1);
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
}

v1::InstanceInfo RegistryInfo(const LanguageCoreOptions& copts, LanguageCore& c,
                              const transfer::TransferEngine& eng) {
  v1::InstanceInfo info;
  info.set_instance_id(copts.instance_id);
  info.set_role(RegistryRole(copts.role.kind));
  info.set_model_id(ModelIdFromDir(absl::GetFlag(FLAGS_model_dir)));
  *info.mutable_ucx() = eng.local_info().ucx();
  info.set_tp_size(static_cast<uint32_t>(copts.engine.tp_size));
  *info.mutable_capacity() = c.Capacity();
  info.mutable_capacity()->set_max_num_seqs(static_cast<uint32_t>(copts.engine.max_num_seqs));
  info.mutable_capacity()->set_max_num_batched_tokens(
      static_cast<uint32_t>(copts.engine.max_num_batched_tokens));
  c.role().Describe(info);  // role elastic: its elastic endpoint
  return info;
}

// Serves until SIGTERM/SIGINT, then drains: running requests get
// --drain_seconds, the rest end with UNAVAILABLE.
int Serve(const LanguageCoreOptions& copts, LanguageCore& c, transfer::TransferEngine& eng,
          metrics::Registry& registry, const StopRequest& stop) {
  LanguageService service(c, eng, registry);
  auto process = ServiceProcess::Start({.name = "language",
                                        .instance_id = copts.instance_id,
                                        .host = absl::GetFlag(FLAGS_host),
                                        .port = absl::GetFlag(FLAGS_port),
                                        .metrics_port = absl::GetFlag(FLAGS_metrics_port),
                                        .advertise = absl::GetFlag(FLAGS_advertise),
                                        .stop = &stop,
                                        .grpc_address = InternalAddressFlag()},
                                       {&service}, registry);
  if (!process.ok()) return ExitWithError("language", process.status());
  ServiceProcess& p = **process;
  p.Register(absl::GetFlag(FLAGS_router), RegistryInfo(copts, c, eng), [&c] { return c.Load(); });
  p.Ready();

  p.WaitForTerminationSignal();
  service.SetAccepting(false);
  p.Deregister();
  const Deadline drain = Deadline::After(absl::Seconds(absl::GetFlag(FLAGS_drain_seconds)));
  while (c.num_requests() > 0 && !drain.Expired()) absl::SleepFor(absl::Milliseconds(20));
  c.Shutdown();
  p.server().Shutdown(absl::Seconds(1));
  return 0;
}

int Main() {
  BlockTerminationSignals();
  if (absl::Status s = ConfigureInternalPlaneFromFlags(); !s.ok()) {
    return ExitWithUsage("language", s.message());
  }
  // The CPU kernels' instruction set (--cpu_isa, else the widest this CPU
  // has), logged and exported as a metric label.
  if (absl::Status isa = model::cpu::ApplyCpuIsaFlag(); !isa.ok()) {
    return ExitWithUsage("language", isa.message());
  }
  if (absl::Status usage = CheckUsage(); !usage.ok()) {
    return ExitWithUsage("language", usage.message());
  }
  auto profile = transfer::ParseTransportProfile(absl::GetFlag(FLAGS_profile));
  if (!profile.ok()) return ExitWithError("language", profile.status());
  auto config = model::LoadModelConfig(absl::GetFlag(FLAGS_model_dir));
  if (!config.ok()) return ExitWithError("language", config.status());
  const std::string id = absl::GetFlag(FLAGS_instance_id);
  transfer::TransferEngineOptions topts = TransferOptions(id, *profile, *config);
  // Seed 000: the receive buffer in memory the shard ranks inherit and map
  // (no name in /dev/shm, so nothing to unlink on any exit path). Declared
  // before the transfer engine and the core, which use it until they go.
  std::unique_ptr<worker::ShmFile> shared_input;
  if (absl::GetFlag(FLAGS_mm_handoff) == "async" && absl::GetFlag(FLAGS_tp) > 1) {
    auto f = worker::ShmFile::Create(absl::StrCat(id, "-recv"), topts.layout.total_bytes());
    if (!f.ok()) return ExitWithError("language", f.status());
    shared_input = *std::move(f);
    topts.buffer_memory = shared_input->data();
  }
  auto transfer = transfer::TransferEngine::Create(topts);
  if (!transfer.ok()) return ExitWithError("language", transfer.status());
  auto copts = CoreOptionsFromFlags(id, *profile, shared_input.get());
  if (!copts.ok()) return ExitWithError("language", copts.status());
  // A lost tensor-parallel rank stops the instance as SIGTERM does (it
  // leaves the router; its supervisor restarts it).
  StopRequest stop;
  copts->on_fatal = [&stop](const absl::Status& why) { stop.Request(why); };
  metrics::Registry registry;
  auto core = LanguageCore::Create(*copts, **transfer, registry);
  if (!core.ok()) return ExitWithError("language", core.status());
  AddGauges(registry, **core, **transfer);
  const int rc = Serve(*copts, **core, **transfer, registry, stop);
  core->reset();
  transfer->reset();
  LOG(INFO) << "language " << id << ": stopped";
  return rc;
}

}  // namespace
}  // namespace mmserve::language

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (absl::Status s =
          mmserve::ApplyFlagAliases({{"esp_span_idle_s", "elastic_span_idle_s"},
                                     {"esp_max_prompt_tokens", "elastic_max_prompt_tokens"},
                                     {"esp_layer_timeout_ms", "elastic_layer_timeout_ms"},
                                     {"esp_join_timeout_ms", "elastic_join_timeout_ms"}});
      !s.ok()) {
    return mmserve::ExitWithError("language", s);
  }
  return mmserve::language::Main();
}
