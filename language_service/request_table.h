// The requests a language instance holds: their records (LiveRequest), the one
// place a request's phase changes (Advance), and the table of live ids.
//
//   RETURN_IF_ERROR(table.Claim(id, [&] { return loop.Post(install); }));
//   // on the loop thread:
//   table.Insert(std::move(request));
//   if (LiveRequest* r = table.Find(id)) Advance(*r, RequestEvent::kImagesArrived);
//   std::unique_ptr<LiveRequest> gone = table.Take(id);  // the id is free again
//
// Ids are claimed from any thread (Submit refuses a duplicate); the records
// are the loop thread's. Claim, RunUnlessKnown, size and Close are
// thread-safe; the rest is loop thread only.
#ifndef MMSERVE_LANGUAGE_SERVICE_REQUEST_TABLE_H_
#define MMSERVE_LANGUAGE_SERVICE_REQUEST_TABLE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "proto/language.pb.h"
#include "transfer/transfer_engine.h"
#include "worker/engine.h"

namespace mmserve::language {

namespace v1 = ::mmserve::internal::v1;

// A request's outputs, called on the loop thread. on_batch for every batch
// (tokens, or lost images); on_end exactly once: OK after the batch that
// carried finish_reason, or the error that ended the request.
struct RequestSink {
  std::function<void(v1::TokenBatch)> on_batch;
  std::function<void(absl::Status)> on_end;
};

// A request's phase on this instance. Every change goes through Advance,
// which checks it against this table; a request leaves every phase by the
// core's End (removed, sink's on_end once).
//
//   from              to            event
//   (Submit)          kGathering    the request is queued; images on their way
//   (RegisterDecode)  kRegistered   role decode: the Decode stream is held
//   kGathering        kInEngine     kImagesArrived: the engine took it
//   kRegistered       kAwaitingKv   kKvReserved: AllocateKv reserved its blocks
//   kAwaitingKv       kInEngine     kKvCommitted: CommitKv checked the blocks
//   kInEngine         kHandingOff   kPromptDone: role prefill, the prompt's KV
//                                   goes to the decode instance
//   kAwaitingKv,      kAborting     kAbortAsked: the engine's final event for
//   kInEngine                       it ends the request
enum class RequestPhase : uint8_t {
  kGathering,
  kRegistered,
  kAwaitingKv,
  kInEngine,
  kHandingOff,
  kAborting
};
enum class RequestEvent : uint8_t {
  kImagesArrived,
  kKvReserved,
  kKvCommitted,
  kPromptDone,
  kAbortAsked
};

// The engine holds the request (its KV, or a reservation of it).
inline bool InEngine(RequestPhase p) { return p >= RequestPhase::kAwaitingKv; }
const char* RequestPhaseName(RequestPhase p);

struct LiveRequest {
  std::string id;
  worker::EngineRequest engine_request;  // prompt, sampling; embeddings filled on arrival
  RequestSink sink;
  enum class MediaState { kConnecting, kReceiving, kArrived, kLost };
  struct Image {
    v1::PromptImage meta;
    MediaState state = MediaState::kConnecting;
    Stopwatch started;
    // Control round trips its arrival waited for: a Connect to the encoder,
    // then one per chunk (init or resume, answered by the chunk).
    int round_trips = 0;
    worker::MediaEmbedding embedding;
    // MmHandoff::kAsync: the blocks embedding.shared_values points into,
    // held until the request ends.
    std::optional<transfer::ReceivedMedia> held;
  };
  std::vector<Image> images;
  RequestPhase phase = RequestPhase::kGathering;
  bool include_usage = true;
  uint32_t image_tokens = 0;
  Stopwatch since_submit;
  double multimodal_ms = 0;
  double admitted_at_s = -1;
  double last_token_at_s = -1;
  double first_token_at_s = -1;
  std::optional<Deadline> lost_deadline;
  // The prompt's last prefix key and the share it covers (prefix_digest.h);
  // 0 once recorded, or when the prompt has none.
  uint64_t prefix_key = 0;
  double prefix_covered = 0;
  // Made from a Prefill call (role both or prefill; an elastic member's
  // too): its prompt's KV is computed here or found in the prefix cache.
  bool prefills = false;
  // Role prefill: where the KV goes, and the last token sampled.
  v1::DecodeTarget decode;
  int32_t last_token = -1;
  // Role decode: the reserved blocks (after AllocateKv) and the prompt's
  // M-RoPE delta, which the KvCommit must repeat.
  std::vector<int32_t> kv_blocks;
  int32_t mrope_position_delta = 0;
  // Role elastic: the group plan of an ElasticPrefill and this member's index.
  std::unique_ptr<v1::ElasticPlan> elastic_plan;
  int elastic_member = 0;

  const std::string& TransferId(size_t k) const {
    return images[k].meta.transfer_id().empty() ? id : images[k].meta.transfer_id();
  }
};

// The one place a request's phase changes: CHECK-fails on an event the
// table above does not allow from the request's phase.
void Advance(LiveRequest& r, RequestEvent event);

class RequestTable {
 public:
  // Claims `id` and, under the same lock, runs `post` (which queues the
  // request's installation on the loop): a caller that sees the id
  // (size) and then posts finds the request installed. AlreadyExists while
  // a request of that id lives; Unavailable once closed or when `post`
  // fails (the id is free again).
  [[nodiscard]] absl::Status Claim(const std::string& id, absl::FunctionRef<bool()> post);
  // Runs `f` under the table's lock when no request of `id` lives; whether
  // it ran. (What `f` keeps for the id is seen by the request's
  // installation, which follows its Claim.)
  bool RunUnlessKnown(const std::string& id, absl::FunctionRef<void()> f);
  // Live ids (claimed, not yet taken).
  size_t size() const;
  // No Claim succeeds from here on; true the first time.
  bool Close();

  // Loop thread only.
  void Insert(std::unique_ptr<LiveRequest> r);
  LiveRequest* Find(const std::string& id);
  // Removes the record and frees its id; null for an unknown id.
  std::unique_ptr<LiveRequest> Take(const std::string& id);
  // The ids of the records that `keep` selects (all, without it).
  std::vector<std::string> Ids(const std::function<bool(const LiveRequest&)>& keep =
                                   [](const LiveRequest&) { return true; }) const;
  const std::map<std::string, std::unique_ptr<LiveRequest>>& records() const { return records_; }

 private:
  mutable absl::Mutex mu_;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  std::set<std::string> ids_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::unique_ptr<LiveRequest>> records_;  // loop thread
};

}  // namespace mmserve::language

#endif  // MMSERVE_LANGUAGE_SERVICE_REQUEST_TABLE_H_
