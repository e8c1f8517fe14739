// The K/V all-gather of an elastic prefill group over UCX (the
// model side is model/elastic.h): each member exposes an exchange buffer, and per
// layer every member puts its rows' K and V into every other member's buffer
// at their global indices, flushes the endpoint (every byte remotely
// complete), then puts a notice {layer, CRC32C of what it sent} and flushes
// again. A member proceeds once every peer's notice for the layer is there;
// it checks each peer's CRC over the rows the plan says that peer sent.
//
//   UcxElasticExchange::Plan plan{.rows = {rows_of_0, rows_of_1}, .prompt_len = L,
//                             .kv_width = kv_heads * head_dim};
//   ASSIGN_OR_RETURN(auto ex, UcxElasticExchange::Create(*ctx, plan, /*self=*/0, {.name =
//   "elastic-0"},
//                                                    absl::Seconds(2)));
//   // exchange ex->target() among the members (the router's plan, gRPC)
//   RETURN_IF_ERROR(ex->Connect(targets));  // member order, own entry ignored
//   RETURN_IF_ERROR(model.ForwardElasticPrefill(batch, kv, *ex, &logits));
//
// Buffer: two slots (layer % 2) of [prompt_len][kv_width] keys and values,
// then a notice per slot and member. Two slots suffice: a member writes
// layer l + 2 only after every peer's notice for l + 1, which each peer sends
// after its attention over layer l is done. A notice is a sequence number
// (layer + 1, or kAbort) and the CRC in one 8-byte word; the receiver polls
// it on its progress thread (where UCX's emulated puts land), so what that
// poll saw is ordered before the member thread's reads of the data.
//
// On an instance's board (CreateOn, served groups): the board
// outlives the exchange and serves one group after another. Sequence
// numbers then start at a base the members derive from the request id
// (stale words of an earlier group never match) and aborts are that
// group's own word; Join first tells every peer this member is in the
// group and waits for theirs, so no peer puts into a board still busy with
// an earlier group; Finish clears the board's notices for the next.
//
// Errors: every wait has the layer timeout (DEADLINE_EXCEEDED); a peer's
// Abort(code) gives its code (Abort(): UNAVAILABLE), a put that fails UNAVAILABLE, and so does a
// lost peer (UCX's report over tcp; over shm its process gone, ucx_notice_board.h); a CRC mismatch
// DATA_LOSS. Thread-safety: one member thread calls AllGather; Abort from any thread.
#ifndef MMSERVE_TRANSFER_ELASTIC_KV_EXCHANGE_H_
#define MMSERVE_TRANSFER_ELASTIC_KV_EXCHANGE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "model/elastic.h"
#include "transfer/ucx_context.h"
#include "transfer/ucx_notice_board.h"
#include "transfer/ucx_worker.h"
#include "transfer/wire_bytes.h"

namespace mmserve::transfer {

// What a member needs to write into another member's exchange buffer.
using ElasticExchangeTarget = NoticeBoardTarget;

class UcxElasticExchange : public model::KvExchange {
 public:
  struct Plan {
    std::vector<std::vector<int64_t>> rows;  // per member, ascending global indices
    int64_t prompt_len = 0;
    int64_t kv_width = 0;  // floats of one token's K (or V)
  };

  // InvalidArgument unless the members' rows cover [0, prompt_len) exactly
  // once and self is a member.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<UcxElasticExchange>> Create(
      UcxContext& context, Plan plan, int self, const UcxWorkerOptions& options,
      absl::Duration layer_timeout);
  // The same over `board`, which must outlive the exchange and hold
  // BoardBytes(plan) of data and BoardNotices(members) notices. Sequence
  // numbers start at seq_base (SeqBase(request id)).
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<UcxElasticExchange>> CreateOn(
      UcxNoticeBoard& board, Plan plan, int self, uint32_t seq_base, absl::Duration layer_timeout);
  static uint64_t BoardBytes(int64_t prompt_len, int64_t kv_width) {
    return 4 * prompt_len * kv_width * sizeof(float);
  }
  static int BoardNotices(int members) { return 2 * members; }
  // A group's sequence base from its request id and the plan's group
  // (ElasticPlan.group, set anew for each placement): the same on every
  // member, never 0 and with room for every layer below the abort words.
  // A later group of the same request id (a retry) with another `group`
  // never matches a word an earlier one left on a board.
  static uint32_t SeqBase(std::string_view request_id, uint64_t group = 0);
  // A member that refuses its group before it has an exchange (a bad
  // request or plan, a full queue): connects `board` to `targets` (member
  // order; those without an address are skipped) and puts the group's abort
  // word, carrying `code`, where each peer waits for this member (best
  // effort, bounded): the peers end with `code` at once instead of at their
  // join timeout. The board must be idle (the caller's loop runs one group
  // at a time).
  static void Refuse(UcxNoticeBoard& board, const std::vector<ElasticExchangeTarget>& targets,
                     int self, uint32_t seq_base, absl::StatusCode code);
  ~UcxElasticExchange() override;
  UcxElasticExchange(const UcxElasticExchange&) = delete;
  UcxElasticExchange& operator=(const UcxElasticExchange&) = delete;

  const ElasticExchangeTarget& target() const { return board_->target(); }
  // Endpoints to every other member; targets in member order.
  [[nodiscard]] absl::Status Connect(const std::vector<ElasticExchangeTarget>& targets);

  // CreateOn's groups: tells every peer this member is in, then waits (up
  // to `timeout`) until every peer is. Call after Connect, before the first
  // AllGather.
  [[nodiscard]] absl::Status Join(absl::Duration timeout);
  // After the last layer (`num_layers` of them): the sampling member sends
  // the first token to member `to`, which awaits it from `from`.
  [[nodiscard]] absl::Status SendToken(int num_layers, int to, int32_t token);
  [[nodiscard]] absl::StatusOr<int32_t> AwaitToken(int num_layers, int from);
  // CreateOn's groups: the group is over here; clears the board's notices.
  void Finish();

  // Counts the K/V payload from now on: per layer, sent = this member's
  // rows x kv_width floats x 2 (K and V) x 4 bytes to each peer once
  // flushed; received = each peer's rows likewise once its notice and CRC
  // checked. Call before the first AllGather (one member thread).
  void CountBytes(const WireBytes& bytes) { bytes_ = bytes; }

  [[nodiscard]] absl::Status AllGather(int layer, absl::Span<const int64_t> rows, const float* k,
                                       const float* v, const float** k_all,
                                       const float** v_all) override;
  // Tells every peer (best effort) and ends this member's waits; the peers'
  // waits end with `code` (UNAVAILABLE for Abort()).
  void Abort() override { Abort(absl::StatusCode::kUnavailable); }
  void Abort(absl::StatusCode code);

 private:
  UcxElasticExchange(Plan plan, int self, absl::Duration timeout, uint32_t seq_base);
  uint32_t abort_seq() const { return seq_base_ == 0 ? kAbortSeq : seq_base_ - 1; }
  float* Plane(int slot, int kv) const;
  int Notice(int slot, int member) const {
    return slot * static_cast<int>(plan_.rows.size()) + member;
  }
  uint32_t RowsCrc(int slot, const std::vector<int64_t>& rows) const;
  absl::Status Exchange(int slot, uint32_t seq, Deadline deadline);

  const Plan plan_;
  const int self_;
  const absl::Duration timeout_;
  const uint32_t seq_base_;  // 0: an own board (layer l is sequence l + 1)
  std::unique_ptr<UcxNoticeBoard> own_board_;
  UcxNoticeBoard* board_ = nullptr;
  std::vector<int> peers_;               // every member but self
  WireBytes bytes_;                      // the member thread's
  std::atomic<bool> aborted_{false};     // this member's waits end
  std::atomic<bool> abort_sent_{false};  // the peers were told
};

}  // namespace mmserve::transfer

#endif  // MMSERVE_TRANSFER_ELASTIC_KV_EXCHANGE_H_
