// A shard rank of a tensor-parallel language instance, started by
// rank 0's TpGroup: joins the instance's communicator and step ring, loads
// its slices of the weights, and runs the steps rank 0 sends until kStop.
// In a decode instance (--kv_handoff_profile) the rank also registers its KV
// cache with UCX, so the prefill instance writes its KV heads straight into
// it (worker/tp_kv_receiver.h); in a prefill instance (--kv_fd) its cache
// lies in a file rank 0 maps and hands off from (worker/tp_kv_files.h).
// Exit status 0 after kStop; 1 on any error (logged), e.g. UNAVAILABLE when
// rank 0 died.
#include <memory>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "model/cpu/thread_pool.h"
#include "model/model_config.h"
#include "model/qwen2_model.h"
#include "model/qwen2_weights.h"
#include "model/safetensors.h"
#include "transfer/ucx_context.h"
#include "worker/shm_communicator.h"
#include "worker/shm_file.h"
#include "worker/step_ring.h"
#include "worker/tp_kv_files.h"
#include "worker/tp_kv_receiver.h"
#include "worker/tp_step_loop.h"

ABSL_FLAG(std::string, model_dir, "", "Hugging Face model directory");
ABSL_FLAG(std::string, instance_id, "", "the instance's id (as rank 0's)");
ABSL_FLAG(int, rank, 1, "this rank, 1..tp-1");
ABSL_FLAG(int, tp, 2, "ranks in the instance");
ABSL_FLAG(int, threads, 1, "compute threads of this rank");
ABSL_FLAG(int, timeout_s, 120, "collective and join timeout, seconds");
ABSL_FLAG(int, shared_input_fd, -1,
          "inherited descriptor of the instance's shared receive buffer, or -1");
ABSL_FLAG(uint64_t, shared_input_bytes, 0, "bytes of the shared receive buffer");
ABSL_FLAG(int64_t, ring_slot_bytes, int64_t{1} << 20, "step ring slot size (as rank 0's)");
ABSL_FLAG(std::string, kv_handoff_profile, "",
          "role decode: the UCX profile (shm or tcp) of the KV hand-off into this rank's "
          "cache; empty: none");
ABSL_FLAG(int, kv_fd, -1,
          "role prefill: inherited descriptor of the file this rank's KV cache lies in (rank 0 "
          "hands its heads off from there), or -1");

namespace mmserve::worker {
namespace {

absl::Status Run() {
  const int rank = absl::GetFlag(FLAGS_rank), tp = absl::GetFlag(FLAGS_tp);
  if (rank < 1 || rank >= tp) {
    return absl::InvalidArgumentError(absl::StrCat("--rank ", rank, " outside [1, ", tp, ")"));
  }
  const absl::Duration timeout = absl::Seconds(absl::GetFlag(FLAGS_timeout_s));
  // Mapped before joining: once rank 0's join returns, every rank reads
  // the receive buffer.
  std::unique_ptr<ShmFile> shared_input;
  if (absl::GetFlag(FLAGS_shared_input_fd) >= 0) {
    ASSIGN_OR_RETURN(shared_input, ShmFile::MapInherited(absl::GetFlag(FLAGS_shared_input_fd),
                                                         absl::GetFlag(FLAGS_shared_input_bytes)));
  }
  ShmCommunicatorOptions co;
  co.instance_id = absl::GetFlag(FLAGS_instance_id);
  co.rank = rank;
  co.world_size = tp;
  co.timeout = timeout;
  ASSIGN_OR_RETURN(std::unique_ptr<ShmCommunicator> comm, ShmCommunicator::Join(co));
  StepRingOptions ro;
  ro.instance_id = co.instance_id;
  ro.rank = rank;
  ro.world_size = tp;
  ro.timeout = timeout;
  ro.slot_bytes = absl::GetFlag(FLAGS_ring_slot_bytes);
  ASSIGN_OR_RETURN(std::unique_ptr<StepRing> ring, StepRing::Join(ro));
  const std::string dir = absl::GetFlag(FLAGS_model_dir);
  ASSIGN_OR_RETURN(model::ModelConfig cfg, model::LoadModelConfig(dir));
  ASSIGN_OR_RETURN(auto ckpt, model::SafetensorsCheckpoint::Open(dir));
  model::Qwen2WeightsOptions wo;
  wo.shard = {rank, tp};
  ASSIGN_OR_RETURN(auto weights, model::Qwen2Weights::Load(*ckpt, cfg.text, wo));
  model::cpu::ThreadPool pool(std::max(1, absl::GetFlag(FLAGS_threads)));
  model::Qwen2Model qwen(cfg.text, *weights, pool, {model::cpu::LinearKernel::kDot, comm.get()});
  absl::Span<const uint8_t> input;
  if (shared_input != nullptr) input = {shared_input->data(), shared_input->size()};
  const std::string profile = absl::GetFlag(FLAGS_kv_handoff_profile);
  if (absl::GetFlag(FLAGS_kv_fd) >= 0) {
    ShardKvFile kv_file(absl::GetFlag(FLAGS_kv_fd));
    return RunShardSteps(*ring, qwen, input, &kv_file);
  }
  if (profile.empty()) return RunShardSteps(*ring, qwen, input);
  ASSIGN_OR_RETURN(transfer::TransportProfile p, transfer::ParseTransportProfile(profile));
  ASSIGN_OR_RETURN(std::unique_ptr<transfer::UcxContext> ucx, transfer::UcxContext::Create(p));
  ShardKvReceiver kv_hooks(*ucx, *comm, {.name = absl::StrCat(co.instance_id, "-kv-rank", rank)});
  return RunShardSteps(*ring, qwen, input, &kv_hooks);
}

}  // namespace
}  // namespace mmserve::worker

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  absl::Status s = mmserve::worker::Run();
  if (!s.ok()) {
    LOG(ERROR) << "tp shard rank " << absl::GetFlag(FLAGS_rank) << ": " << s;
    return 1;
  }
  return 0;
}
