// An elastic instance's part in elastic-sequence-parallelism groups
// (role elastic): its elastic endpoint (transfer/elastic_endpoint.h), a member's
// share of a group prefill, the spans it holds for other masters' decodes
// and the requests it masters.
//
//   ASSIGN_OR_RETURN(auto elastic, ElasticGroups::Create(options, engine, metrics, emit, moved));
//   registration.set_elastic_endpoint(elastic->endpoint());
//   // loop thread:
//   ASSIGN_OR_RETURN(ElasticGroups::Prefilled p, elastic->Prefill(plan, member,
//   std::move(request))); engine.Step();  // decodes the requests mastered here with the others
//   elastic->Step();    // moves on those whose range is done
//   elastic->Resume(id, state);  // ElasticMoveMaster: a waiting next master takes over
//   elastic->Release(id);     // Abort: frees its span and state
//   elastic->ExpireIdle();    // the idle lease
//
// A member that fails tells the others (an abort word on their boards,
// carrying its error's code: their calls end with that code at once, a
// refusal before its part began included); one that never comes leaves them to
// their join or layer timeout. The router must not place an instance in two
// groups at once: a second one waits (below), and its join notices may
// land on the board the first still uses (that one may then end at its
// layer timeout; the data itself is never written before the join).
//
// One group prefill at a time: it runs on the engine's (loop) thread and
// blocks it for its duration (LoongServe pauses the instance's batch for it
// too); a second ElasticPrefill waits on the loop behind it, bounded by its
// group's join timeout. A request mastered here is a request of the
// engine's batch (LlmEngine::StartMastering): each engine step decodes it
// beside the others, this object giving the step the span client aimed at
// its holders (MasterPeers: the requests of one set of holders a step).
// Holders answer the masters' span queries on the span server's thread,
// reading only held blocks, with their own one-thread pool.
//
// A holder keeps its span (the blocks of its `keep` range) until Release
// (the router's Abort), until no master queried it for span_idle (the
// idle lease; mmserve_language_elastic_spans_expired_total counts those), or
// until one of its request's masters' processes is gone (a master on this
// host and pid namespace, checked every transfer::kLivenessInterval: a
// killed master's spans go even without the router's Abort;
// mmserve_language_elastic_spans_orphaned_total). Waits on a peer end
// UNAVAILABLE once it is gone, over shm too (ucx_notice_board.h). The
// master holds its span plus room for the KV of max_tokens - 1 new tokens
// (the manager plans the whole future KV), or, with the plan's
// decode_window, room for a window of them, taking the next window
// whenever its span is full (Step: out of blocks, the request ends
// RESOURCE_EXHAUSTED); it frees its span when the request ends.
//
// Master moves: a plan whose members have decode ranges (ElasticMember.decode)
// names a chain of masters. Each holds its span plus its range; the first
// decodes while its range has room, then hands its state (generated
// tokens, the sampler's seed and draws, the M-RoPE delta) on through its
// stream (`moved`, the router passes it to the next with ElasticMoveMaster)
// and keeps its KV as an ordinary held span: no KV moves. The next master
// waits after its prefill part (its stream open) until Resume; it then
// queries every holder, the earlier masters among them, and the last one
// takes whatever max_tokens leaves (mmserve_language_elastic_master_moves_total
// counts the moves away from this instance).
// mmserve_language_kv_bytes_moved_total (kv_bytes_moved.h) counts the K/V
// exchanged (elastic_prefill) and the span queries and partials (elastic_decode).
// Thread-safety: every method but endpoint() on the loop thread.
#ifndef MMSERVE_LANGUAGE_SERVICE_ELASTIC_GROUPS_H_
#define MMSERVE_LANGUAGE_SERVICE_ELASTIC_GROUPS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/metrics.h"
#include "model/cpu/thread_pool.h"
#include "proto/language.pb.h"
#include "transfer/elastic_endpoint.h"
#include "transfer/peer_liveness.h"
#include "transfer/wire_bytes.h"
#include "worker/engine.h"

namespace mmserve::language {

namespace v1 = ::mmserve::internal::v1;

struct ElasticGroupsOptions {
  std::string name;  // the instance id
  transfer::TransportProfile profile = transfer::TransportProfile::kShm;
  // The longest prompt a group may bring (the exchange board holds 2 layers
  // of its K and V: 16 x kv_width bytes a token). 0: the model's context.
  uint32_t max_prompt_tokens = 0;
  // One layer's exchange, the first token's notice and one span query.
  absl::Duration layer_timeout = absl::Seconds(2);
  // How long members wait for each other to join a group.
  absl::Duration join_timeout = absl::Seconds(10);
  // A held span nobody queried for this long is freed.
  absl::Duration span_idle = absl::Seconds(30);
  // TEST ONLY: each layer of a group prefill and each decode step waits
  // this long first (fault tests kill a member mid-exchange or mid-decode).
  absl::Duration test_step_delay = absl::ZeroDuration();
};

class ElasticGroups : public worker::MasterPeers {
 public:
  using Emit = std::function<void(const worker::StreamEvent&)>;
  using Moved =
      std::function<void(const std::string& id, const worker::ElasticRequest::MasterState&)>;
  // `engine` must outlive the object; it is the engine's MasterPeers until
  // then (destruction aborts the requests mastered here, without events). The events of the
  // requests mastered here go to `emit` (a request whose holders fail ends with finish_reason
  // kAbort and the error); `moved` gets the state of one whose range is done (Step).
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<ElasticGroups>> Create(
      const ElasticGroupsOptions& options, worker::LlmEngine& engine, metrics::Registry& metrics,
      Emit emit, Moved moved);
  ~ElasticGroups() override;

  // The registration's InstanceInfo.elastic_endpoint.
  const std::string& endpoint() const { return elastic_->endpoint(); }

  // What a member's part produced.
  struct Prefilled {
    // The sampler's first-token event (its stream's batch); also the
    // master's when the first token ended the request (no tokens then).
    std::optional<worker::StreamEvent> event;
    bool decodes = false;  // the master goes on: Step emits the rest
    // A later master of the chain: it waits for Resume (its stream stays
    // open), then Step emits its tokens.
    bool awaits_move = false;
  };
  // Member `member`'s part of `plan` for `request`: checks, holds the span,
  // runs its rows through every layer exchanging K/V with the others, keeps
  // its range, samples (the sampler) and hands the request to the engine
  // (the master: StartMastering). On error nothing stays held.
  // InvalidArgument for a bad plan or endpoint, ResourceExhausted for a
  // prompt past the board or a full KV pool,
  // Unavailable / DeadlineExceeded when a member fails or does not come.
  // `on_joined` runs (on this thread) once every member joined, the span
  // held: the caller's load report can show it during the prefill.
  [[nodiscard]] absl::StatusOr<Prefilled> Prefill(const v1::ElasticPlan& plan, int member,
                                                  std::unique_ptr<worker::ElasticRequest> request,
                                                  const std::function<void()>& on_joined = {});
  // Member `member` of `plan` refuses request `id`'s group before its part
  // began (its request failed its checks here): the others' waits for it
  // end at once with `why`'s code instead of at their join timeout (best
  // effort; a plan naming no such member tells nobody). Prefill does this
  // itself for what it refuses.
  void Refuse(const v1::ElasticPlan& plan, int member, const std::string& id,
              const absl::Status& why);

  // Each request mastered here whose range is full and that has a next
  // master moves on: the engine stops decoding it, its span stays held for
  // the next master's queries, `moved` gets its state.
  void Step();
  // MasterPeers: the span client aimed at the holders of `ids` (one set).
  [[nodiscard]] absl::StatusOr<model::SpanAttentionPeers*> ForStep(
      absl::Span<const std::string> ids) override;
  // A waiting next master of request `id` takes over from `state`.
  // NotFound when none waits here; InvalidArgument when the state does not
  // continue its range (tokens out of the vocabulary or not starting with
  // its own, the wrong count, an M-RoPE delta not its own). The random
  // stream becomes the state's (seed and draws). The caller ends the
  // request on error.
  [[nodiscard]] absl::Status Resume(const std::string& id,
                                    const worker::ElasticRequest::MasterState& state);
  bool has_decodes() const { return !decodes_.empty(); }
  size_t num_decodes() const { return decodes_.size(); }
  // Frees request `id`'s span and state here; whether it had any.
  bool Release(const std::string& id);
  // Frees spans idle past span_idle, and those whose master's process is
  // gone.
  void ExpireIdle();
  // Spans held for other masters (tests and the load report).
  size_t num_held_spans() const;

 private:
  struct Span;
  struct Decode;
  struct Group;
  ElasticGroups(const ElasticGroupsOptions& options, worker::LlmEngine& engine, Emit emit,
                Moved moved);

  // The span server's handler (its thread).
  absl::Status AnswerQuery(int layer, absl::Span<const uint64_t> tags, const float* q, int64_t rows,
                           float* out, float* lse);
  // Prefill's parts (elastic_groups_prefill.cc).
  absl::Status Check(Group& g) const;
  static void PlanChain(Group& g);
  absl::Status Join(Group& g);
  absl::Status OpenLanes(Group& g);
  void ForgetLanes(const std::string& id);
  absl::Status RunRows(Group& g);
  absl::Status Finish(Group& g, Prefilled* out);
  absl::Status FinishMember(Group& g, const worker::StreamEvent& first, int32_t token,
                            Prefilled* out);
  void AddSpan(Group& g);
  // The master's decode record, its request handed to the engine (waiting:
  // a later master of the chain, until Resume).
  absl::Status StartDecode(Group& g, bool waiting);
  void Drop(Group& g);
  // The engine's callback of a request mastered here.
  worker::StreamCallback MasterCallback();
  // Hands request `id` on to its next master (its range is full).
  void MoveOn(const std::string& id);
  // Grows the span of `d` by its window, or ends its request
  // RESOURCE_EXHAUSTED when the pool has no room.
  void Grow(Decode& d);
  int64_t SlotsEnd(const Decode& d) const;

  const ElasticGroupsOptions options_;
  worker::LlmEngine& engine_;
  const Emit emit_;
  const Moved moved_;
  bool closing_ = false;  // in ~ElasticGroups: the engine's events go nowhere
  std::unique_ptr<transfer::UcxContext> context_;
  model::cpu::ThreadPool server_pool_{1};  // the span server's
  float scale_ = 0;
  metrics::Counter* expired_ = nullptr;
  metrics::Counter* moves_ = nullptr;
  metrics::Counter* orphaned_ = nullptr;
  transfer::WireBytes prefill_bytes_;  // kv_bytes_moved.h's elastic_prefill

  mutable absl::Mutex mu_;  // the span server thread reads spans_
  std::map<uint64_t, std::unique_ptr<Span>> spans_ ABSL_GUARDED_BY(mu_);  // by tag

  // Loop thread only.
  std::map<std::string, std::unique_ptr<Decode>> decodes_;
  std::map<std::string, std::unique_ptr<Decode>> waiting_;  // later masters, until Resume
  // The span server's lanes in use: the master each serves and the
  // requests (spans here, masters' chains) that need it.
  struct Lane {
    std::string master;  // its span-reply worker address
    std::set<std::string> ids;
  };
  std::map<int, Lane> lanes_;
  // The holders' set (Decode::holder_set) the span client is aimed at
  // (reset when a request starts mastering: its holders' lanes are new).
  std::optional<uint64_t> client_set_;
  Deadline masters_check_ = Deadline::After(transfer::kLivenessInterval);  // the next one
  std::unique_ptr<transfer::ElasticInstance> elastic_;  // last: its server thread stops first
};

// A request's tag in span queries: the same on every member.
uint64_t ElasticSpanTag(const std::string& request_id);

}  // namespace mmserve::language

#endif  // MMSERVE_LANGUAGE_SERVICE_ELASTIC_GROUPS_H_
