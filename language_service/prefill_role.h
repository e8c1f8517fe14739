// Role prefill (role.h): runs prompts to their first token and hands
// the prompt's KV to the decode instance each request names: AllocateKv on
// it, one set of UCX puts per decode rank (its slice of the KV heads,
// transfer/kv_handoff), CommitKv with each rank's CRC32C.
//
// Tensor parallelism (--tp=N): each shard rank's KV cache lies in a file
// this process maps (worker/tp_kv_files.h), and one sender per rank writes
// that rank's heads to the decode rank(s) holding them
// (transfer/kv_handoff_pairs.h): N -> N rank by rank, 2 -> 1 both ranks
// into the one decode rank at their heads' offsets, 1 -> 2 as before. A
// decode rank written by several prefill ranks gets the CRC32C of its heads
// in its own order (KvGatheredCrc). The writes of one hand-off are all
// started before any is waited for, so they move at once; one that fails
// fails the hand-off (UNAVAILABLE when a peer is lost). CommitKv goes once
// every write landed, and not at all once a rank of this instance is gone
// (UNAVAILABLE).
//
// A hand-off never blocks the loop: at the prompt's end the engine keeps
// the request's blocks held (a span of its id) and the hand-off runs on a
// hand-off thread; the loop steps other requests meanwhile. Its result
// comes back to the loop (RoleHost::RunOnLoop), which frees the blocks and
// ends the request: its last batch (kv_handed_off) or the hand-off's error.
// A request aborted meanwhile ends at once; its blocks are freed when the
// hand-off thread is done with them (no CommitKv is sent after the abort).
//
// Layer-wise (RoleOptions::handoff_layer_group, prompts of at least
// handoff_layerwise_min_tokens; prefill_role_layers.cc): during the
// forward that computes the prompt's last rows, AllocateKv goes out after
// its first layer and each group of layers is written to every decode rank
// (KvHandoffSender::SendLayers) on a hand-off thread as soon as the forward
// is past it. The groups' CRC32Cs, joined per rank, are the whole prompt's
// that CommitKv checks; CommitKv goes once the last group is written and
// the first token is sampled, and that token is streamed only after it.
// Methods are the loop thread's unless said otherwise.
#ifndef MMSERVE_LANGUAGE_SERVICE_PREFILL_ROLE_H_
#define MMSERVE_LANGUAGE_SERVICE_PREFILL_ROLE_H_

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/worker_pool.h"
#include "language_service/role.h"
#include "proto/language.grpc.pb.h"
#include "transfer/kv_handoff.h"
#include "transfer/kv_handoff_pairs.h"
#include "transfer/wire_bytes.h"
#include "worker/tp_kv_files.h"

namespace mmserve::language {

// What a prefill instance hands over: the request's prompt as the engine
// expanded it, its KV blocks (held by the engine until the hand-off is
// over), and the first token it sampled.
struct HandOffRequest {
  std::string request_id;
  v1::DecodeTarget decode;  // where the request decodes
  int max_tokens = 0;
  uint64_t seed = 0;
  int32_t first_token = -1;
  std::vector<int32_t> kv_blocks;
  worker::HandoffPrompt prompt;
};

// The AllocateKv of a hand-off.
v1::KvAllocateRequest AllocateRequest(const HandOffRequest& r);

// What a hand-off waited for and how its bytes moved.
struct HandOffResult {
  // Control round trips, one after another: AllocateKv, the writes' landed
  // replies or flushes, waited for together (one; none when every write
  // copied into a decode cache mapped here), CommitKv. Layer-wise, each
  // group's writes are waited for in turn.
  int round_trips = 0;
  // One per write: each pair of a rank here and a decode rank that share
  // KV heads (one per decode rank without tensor parallelism here).
  std::vector<transfer::KvHandoffPath> paths;
  int layer_groups = 0;  // layer-wise: writes of one layer group by one rank to one rank
};

class PrefillRole final : public Role {
 public:
  // `bytes` counts the KV handed off (sent).
  PrefillRole(const RoleOptions& options, std::string instance_id, transfer::WireBytes bytes)
      : options_(options), instance_id_(std::move(instance_id)), bytes_(bytes), self_(this) {}
  // Stops the layer-wise hand-offs under way (their threads finish).
  ~PrefillRole() override;

  // With tp_size > 1, the shard ranks' KV caches in files this process
  // maps (worker/tp_kv_files.h).
  absl::Status AdjustEngineOptions(worker::EngineOptions& options) const override;
  // With layer groups, a connector that feeds the layer-wise hand-off.
  std::unique_ptr<worker::KvConnector> MakeConnector() const override;
  absl::Status Attach(RoleHost& host) override;
  absl::Status CheckPrefill(const v1::PrefillRequest& request) const override;
  // Token ids now: they travel in AllocateKv and KvCommit.
  absl::Status PreparePrefill(const v1::PrefillRequest& request, const model::Tokenizer& tokenizer,
                              worker::EngineRequest& engine_request) const override;
  // The prompt's end (kHandoff): its KV goes to the decode instance, and
  // the stream's last batch says so (kv_handed_off), or the request ends
  // with the hand-off's error.
  bool TakeEvent(LiveRequest& r, const worker::StreamEvent& e, v1::TokenBatch& batch) override;

  // Requests whose hand-off is under way end here (Abort, shutdown).
  bool Owns(const LiveRequest& r) const override { return handing_off_.count(r.id) > 0; }
  void Release(const std::string& id, const absl::Status& status) override;

  // Hands a request's KV to its decode instance; CancelledError, before
  // AllocateKv or CommitKv, once `cancelled` is set. Thread-safe (the
  // hand-off threads run it).
  [[nodiscard]] absl::StatusOr<HandOffResult> HandOff(const HandOffRequest& request,
                                                      const std::atomic<bool>& cancelled);

  // Hand-offs that may be under way at once; more wait for a thread.
  static constexpr int kHandOffThreads = 8;

  // The layer-wise hooks (the connector's, on the loop thread, which is the
  // engine's; prefill_role_layers.cc). A prompt-only request is queued: it
  // takes the layer-wise path (AllocateKv once its last forward starts).
  void OnPromptQueued(const std::string& id, const worker::HandoffPrompt& prompt);
  // Inside the forward: starts or feeds the sends of those prompts.
  void OnLayersWritten(const worker::KvLayersWritten& written);
  // The request left the engine; unless it is handed off (TakeEvent comes
  // next) its layer-wise hand-off stops, and this returns once the hand-off
  // thread no longer reads its blocks (at most one group's write).
  void OnPromptEnded(const std::string& id, bool handed_off);

 private:
  // A layer-wise hand-off, shared by the loop thread and the hand-off
  // thread that writes it (prefill_role_layers.cc).
  struct LayerStream;
  // A hand-off under way, by request id.
  struct Pending {
    std::shared_ptr<std::atomic<bool>> cancelled;
    bool ended = false;                   // the request ended meanwhile (Release)
    v1::TokenBatch last;                  // the stream's last batch, sent on success
    std::shared_ptr<LayerStream> stream;  // layer-wise: its state
    absl::Time first_token_at;            // kHandoff came (the exposed time's start)
  };
  // What one rank of this instance writes into one decode rank of an
  // allocation: the prompt's blocks, `heads` of each token.
  struct RankPut {
    transfer::KvHandoffTarget target;
    std::vector<int32_t> src, dst;
    int prefill_rank = 0;
    int decode_rank = 0;
    transfer::KvHeadSlice heads;
  };
  // The writes `puts` (RankPuts' order) of `layers`, all started, then all
  // waited for; each decode rank's CRC32C of what it received into crcs
  // (one per decode rank). The first write's error fails them all (every
  // started write is finished first).
  absl::Status SendPuts(const std::vector<RankPut>& puts, transfer::KvLayerRange layers,
                        Deadline deadline, std::vector<uint32_t>& crcs, HandOffResult& result);
  // UNAVAILABLE once a rank of this instance is gone (its KV is not all
  // there). Thread-safe.
  absl::Status RanksAlive() const;
  // The shard ranks' caches (tp_size > 1): the files, made in
  // AdjustEngineOptions, and their mappings, made in Attach.
  struct ShardKv {
    std::unique_ptr<worker::TpKvFiles> files;
    std::vector<std::unique_ptr<worker::TpKvView>> views;
  };
  // The hand-off of `id` is over: frees its blocks and ends the request
  // with `done` (the metrics mmserve_language_kv_handoff_round_trips and
  // _total{path} on success).
  void Finished(const std::string& id, const absl::StatusOr<HandOffResult>& done);
  v1::Language::Stub& DecodeStub(const std::string& address);
  // The writes to every decode rank of `alloc`; their CRC32Cs into
  // `commit`, how each moved into result.paths.
  absl::Status PutToRanks(const HandOffRequest& request, const v1::KvAllocation& alloc,
                          Deadline deadline, v1::KvCommit& commit, HandOffResult& result);
  absl::StatusOr<std::vector<RankPut>> RankPuts(const HandOffRequest& request,
                                                const v1::KvAllocation& alloc);
  // CommitKv of `request` (its first_token) with each rank's CRC32C in
  // `commit`; sets result.round_trips.
  absl::Status Commit(const HandOffRequest& request, v1::KvCommit& commit,
                      std::chrono::system_clock::time_point deadline, HandOffResult& result);
  // prefill_role_layers.cc, on a hand-off thread: the AllocateKv of a
  // layer-wise hand-off, and its layer groups and CommitKv.
  void Allocate(LayerStream& s);
  absl::StatusOr<HandOffResult> StreamLayers(LayerStream& s);
  // The groups that are ready, [from, *to), to every rank.
  absl::Status SendGroup(LayerStream& s, const std::vector<RankPut>& ranks, int from, int to,
                         Deadline deadline, std::vector<uint32_t>& crcs, HandOffResult& result);
  // Loop thread: posts the writes of `s` over the prompt's `blocks`; false
  // when shutting down.
  bool StartStream(const std::shared_ptr<LayerStream>& s, std::vector<int32_t> blocks);
  // Loop thread: the first token is out (kHandoff); every layer is written
  // here by now. Starts the writes if no layer hook did; false when
  // shutting down.
  bool Committable(const std::shared_ptr<LayerStream>& s, const std::vector<int32_t>& blocks,
                   int32_t first_token);
  // Stops `s` (no more writes, no CommitKv); with await_reads, waits until
  // its thread no longer reads the blocks. Thread-safe.
  static void Cancel(LayerStream& s, bool await_reads);

  const RoleOptions options_;
  const std::string instance_id_;
  const transfer::WireBytes bytes_;
  RoleHost* host_ = nullptr;
  worker::LlmEngine* engine_ = nullptr;
  // Before the senders: the shard ranks' caches are unmapped after the
  // senders that registered them are gone.
  const std::shared_ptr<ShardKv> shard_kv_ = std::make_shared<ShardKv>();
  std::unique_ptr<transfer::UcxContext> kv_context_;
  // One sender per rank of this instance, over its cache (rank 0's is the
  // engine's).
  std::vector<std::unique_ptr<transfer::KvHandoffSender>> kv_senders_;
  std::vector<const model::KvCache*> rank_caches_;
  worker::TpGroup* tp_group_ = nullptr;
  absl::Mutex stubs_mu_;
  std::map<std::string, std::unique_ptr<v1::Language::Stub>> decode_stubs_
      ABSL_GUARDED_BY(stubs_mu_);
  std::map<std::string, Pending> handing_off_;  // loop thread only
  // Layer-wise hand-offs of requests still in the engine (loop thread only).
  std::map<std::string, std::shared_ptr<LayerStream>> streams_;
  // The connector calls back into the role (MakeConnector is const).
  PrefillRole* const self_;
  // Last: its threads stop (running hand-offs finish) before what they use
  // goes.
  std::unique_ptr<WorkerPool> handoff_threads_;
};

}  // namespace mmserve::language

#endif  // MMSERVE_LANGUAGE_SERVICE_PREFILL_ROLE_H_
