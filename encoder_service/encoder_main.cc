// encoder: the encoder service process. Loads only the vision tower of a
// model directory, serves the Encoder gRPC service, and sends embeddings to
// language instances over UCX.
//
//   bazel run --config=opt //encoder_service:encoder --
//       --model_dir=models/shapes-demo --port=50061 --metrics_port=9161
//       --router=localhost:50052 --instance_id=encoder-0
//
// SIGTERM/SIGINT: stops accepting, finishes what is queued (up to
// --drain_seconds), deregisters, and frees every block before exiting.
#include <cstdio>
#include <memory>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "common/file.h"
#include "common/grpc_server.h"
#include "common/internal_plane_flags.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "common/service_process.h"
#include "common/status_macros.h"
#include "encoder_service/encoder_core.h"
#include "encoder_service/encoder_service.h"
#include "model/cpu/cpu_isa.h"
#include "model/cpu/cpu_isa_flag.h"
#include "transfer/transfer_engine.h"

ABSL_FLAG(std::string, model_dir, "", "Hugging Face model directory (Qwen2-VL)");
ABSL_FLAG(std::string, host, "127.0.0.1", "address to listen on");
ABSL_FLAG(int, port, 50061, "gRPC port (0: pick one; the chosen port is printed)");
ABSL_FLAG(int, metrics_port, 0, "Prometheus /metrics port (0: pick one; -1: off)");
ABSL_FLAG(std::string, advertise, "", "host:port the router should call (default host:port)");
ABSL_FLAG(std::string, instance_id, "encoder-0", "unique instance id");
ABSL_FLAG(std::string, router, "", "router's host:port to register with (empty: do not)");
ABSL_FLAG(std::string, profile, "shm", "UCX transport profile: shm (same host) or tcp");
ABSL_FLAG(uint32_t, block_size, 128, "embedding buffer: tokens per block");
ABSL_FLAG(uint32_t, num_blocks, 256, "embedding buffer: blocks in the send buffer");
ABSL_FLAG(int, cache_mb, 256, "embedding cache size in MiB (0: off)");
ABSL_FLAG(int, decode_threads, 1, "image decode and preprocessing threads");
ABSL_FLAG(std::string, quantize, "",
          "vision tower weights: as stored (empty), int8 (one scale per output row) or int8_g32 "
          "(one per 32 columns), quantized at load; the language model's int4 schemes are refused");
ABSL_FLAG(std::string, activation_dtype, "",
          "vision tower activations: f32 (empty), bf16 (rounded to bf16 at each bf16 linear "
          "layer, fp32 accumulation; not with --quantize) or int8 (int8 layers quantize their "
          "input to int8, one scale per 32 columns; needs --quantize)");
ABSL_FLAG(int64_t, max_batch_patches, 16384,
          "patches per vision tower batch (a longer video runs over several)");
ABSL_FLAG(int64_t, max_video_bytes, int64_t{64} << 20, "bytes per video file (as the router's)");
ABSL_FLAG(double, max_video_seconds, 600, "longest video, by its container header");
ABSL_FLAG(int64_t, max_video_frames, 36000, "most frames in a video's container or frame list");
ABSL_FLAG(int, test_only_publish_delay_ms, 0,
          "TEST ONLY: each image waits this long before it is published (a slow encoder, for "
          "tests); never set in production");
ABSL_FLAG(int, keep_for_seconds, 30, "how long a published image waits for its receiver");
ABSL_FLAG(int, drain_seconds, 10, "on SIGTERM, how long in-flight work may take");

namespace mmserve::encoder {
namespace {

// The send buffer's transfer engine, shaped by the flags and the model.
absl::StatusOr<std::unique_ptr<transfer::TransferEngine>> CreateTransfer(
    const std::string& id, transfer::TransportProfile profile) {
  ASSIGN_OR_RETURN(model::ModelConfig config,
                   model::LoadModelConfig(absl::GetFlag(FLAGS_model_dir)));
  transfer::TransferEngineOptions topts;
  topts.instance_id = id;
  topts.profile = profile;
  topts.layout.block_size = absl::GetFlag(FLAGS_block_size);
  topts.layout.num_blocks = absl::GetFlag(FLAGS_num_blocks);
  topts.layout.hidden_size = static_cast<uint32_t>(config.EmbeddingRowWidth());
  topts.layout.dtype_bytes = sizeof(float);
  topts.default_num_blocks = 1;
  return transfer::TransferEngine::Create(topts);
}

EncoderCoreOptions CoreOptionsFromFlags() {
  EncoderCoreOptions copts;
  copts.model_dir = absl::GetFlag(FLAGS_model_dir);
  copts.quantize = absl::GetFlag(FLAGS_quantize);
  copts.activation_dtype = absl::GetFlag(FLAGS_activation_dtype);
  copts.decode_threads = absl::GetFlag(FLAGS_decode_threads);
  copts.max_batch_patches = absl::GetFlag(FLAGS_max_batch_patches);
  copts.video_limits.max_bytes = absl::GetFlag(FLAGS_max_video_bytes);
  copts.video_limits.max_duration_s = absl::GetFlag(FLAGS_max_video_seconds);
  copts.video_limits.max_frames = absl::GetFlag(FLAGS_max_video_frames);
  copts.cache_bytes = static_cast<size_t>(std::max(0, absl::GetFlag(FLAGS_cache_mb))) << 20;
  copts.keep_for = absl::Seconds(absl::GetFlag(FLAGS_keep_for_seconds));
  copts.test_only_publish_delay =
      absl::Milliseconds(absl::GetFlag(FLAGS_test_only_publish_delay_ms));
  return copts;
}

void AddGauges(metrics::Registry& registry, EncoderCore& core, transfer::TransferEngine& eng) {
  registry
      .GetGauge("mmserve_encoder_cpu_isa_info", "The CPU kernels' instruction set (label isa).",
                {{"isa", model::cpu::IsaName()}})
      .Set(1);
  registry.AddGaugeCallback("mmserve_encoder_embedding_blocks_used", "Send buffer blocks in use.",
                            {}, [&eng] { return eng.allocator().used_blocks(); });
  registry.AddGaugeCallback("mmserve_encoder_embedding_blocks_free", "Send buffer blocks free.", {},
                            [&eng] { return eng.allocator().free_blocks(); });
  registry.AddGaugeCallback("mmserve_encoder_queue_length", "Images queued or being encoded.", {},
                            [&core] { return static_cast<double>(core.num_pending()); });
  registry.AddGaugeCallback("mmserve_encoder_cache_entries", "Images in the embedding cache.", {},
                            [&core] { return core.cache_stats().entries; });
  registry.AddGaugeCallback("mmserve_encoder_transfers_active", "Sender transfers alive.", {},
                            [&eng] { return static_cast<double>(eng.counts().sending); });
}

internal::v1::InstanceInfo RegistryInfo(const std::string& id,
                                        const transfer::TransferEngine& eng) {
  internal::v1::InstanceInfo info;
  info.set_instance_id(id);
  info.set_role(internal::v1::INSTANCE_ROLE_ENCODER);
  info.set_model_id(ModelIdFromDir(absl::GetFlag(FLAGS_model_dir)));
  *info.mutable_ucx() = eng.local_info().ucx();
  info.set_tp_size(1);
  info.mutable_capacity()->set_embedding_blocks_total(absl::GetFlag(FLAGS_num_blocks));
  info.mutable_capacity()->set_embedding_block_size(absl::GetFlag(FLAGS_block_size));
  return info;
}

int Main() {
  BlockTerminationSignals();
  if (absl::Status s = ConfigureInternalPlaneFromFlags(); !s.ok()) {
    return ExitWithUsage("encoder", s.message());
  }
  // The CPU kernels' instruction set (--cpu_isa, else the widest this CPU
  // has), logged and exported as a metric label.
  if (absl::Status isa = model::cpu::ApplyCpuIsaFlag(); !isa.ok()) {
    return ExitWithUsage("encoder", isa.message());
  }
  if (absl::GetFlag(FLAGS_model_dir).empty()) {
    return ExitWithUsage("encoder", "--model_dir is required");
  }
  if (absl::GetFlag(FLAGS_test_only_publish_delay_ms) < 0) {
    return ExitWithUsage("encoder", "--test_only_publish_delay_ms must be >= 0");
  }
  auto profile = transfer::ParseTransportProfile(absl::GetFlag(FLAGS_profile));
  if (!profile.ok()) return ExitWithError("encoder", profile.status(), 2);
  const std::string id = absl::GetFlag(FLAGS_instance_id);
  auto engine = CreateTransfer(id, *profile);
  if (!engine.ok()) return ExitWithError("encoder", engine.status());
  transfer::TransferEngine& eng = **engine;
  metrics::Registry registry;
  auto core = EncoderCore::Create(CoreOptionsFromFlags(), eng, registry);
  if (!core.ok()) return ExitWithError("encoder", core.status());
  AddGauges(registry, **core, eng);

  EncoderService service(id, **core, eng, registry);
  auto process = ServiceProcess::Start({.name = "encoder",
                                        .instance_id = id,
                                        .host = absl::GetFlag(FLAGS_host),
                                        .port = absl::GetFlag(FLAGS_port),
                                        .metrics_port = absl::GetFlag(FLAGS_metrics_port),
                                        .advertise = absl::GetFlag(FLAGS_advertise),
                                        .grpc_address = InternalAddressFlag()},
                                       {&service}, registry);
  if (!process.ok()) return ExitWithError("encoder", process.status());
  ServiceProcess& p = **process;
  p.Register(absl::GetFlag(FLAGS_router), RegistryInfo(id, eng),
             [&service] { return service.Load(); });
  p.Ready();

  p.WaitForTerminationSignal();
  service.SetAccepting(false);
  p.Deregister();
  p.server().Shutdown(absl::Seconds(absl::GetFlag(FLAGS_drain_seconds)));
  (*core)->Shutdown();
  core->reset();
  engine->reset();  // fails what is left, frees every block
  LOG(INFO) << "encoder " << id << ": stopped";
  return 0;
}

}  // namespace
}  // namespace mmserve::encoder

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return mmserve::encoder::Main();
}
