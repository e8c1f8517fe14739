// The K/V all-gather of an elastic prefill group over UCX (issue 26; the
// model side is model/esp.h): each member exposes an exchange buffer, and per
// layer every member puts its rows' K and V into every other member's buffer
// at their global indices, flushes the endpoint (every byte remotely
// complete), then puts a notice {layer, CRC32C of what it sent} and flushes
// again. A member proceeds once every peer's notice for the layer is there;
// it checks each peer's CRC over the rows the plan says that peer sent.
//
//   UcxEspExchange::Plan plan{.rows = {rows_of_0, rows_of_1}, .prompt_len = L,
//                             .kv_width = kv_heads * head_dim};
//   ASSIGN_OR_RETURN(auto ex, UcxEspExchange::Create(*ctx, plan, /*self=*/0, {.name = "esp-0"},
//                                                    absl::Seconds(2)));
//   // exchange ex->target() among the members (the router's plan, gRPC)
//   RETURN_IF_ERROR(ex->Connect(targets));  // member order, own entry ignored
//   RETURN_IF_ERROR(model.ForwardEspPrefill(batch, kv, *ex, &logits));
//
// Buffer: two slots (layer % 2) of [prompt_len][kv_width] keys and values,
// then a notice per slot and member. Two slots suffice: a member writes
// layer l + 2 only after every peer's notice for l + 1, which each peer sends
// after its attention over layer l is done. A notice is a sequence number
// (layer + 1, or kAbort) and the CRC in one 8-byte word; the receiver polls
// it on its progress thread (where UCX's emulated puts land), so what that
// poll saw is ordered before the member thread's reads of the data.
//
// Errors: every wait has the layer timeout (DEADLINE_EXCEEDED); a peer's
// Abort() or a put that fails gives UNAVAILABLE; a CRC mismatch DATA_LOSS.
// Thread-safety: one member thread calls AllGather; Abort from any thread.
#ifndef MMSERVE_TRANSFER_ESP_KV_EXCHANGE_H_
#define MMSERVE_TRANSFER_ESP_KV_EXCHANGE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "model/esp.h"
#include "transfer/ucx_context.h"
#include "transfer/ucx_notice_board.h"
#include "transfer/ucx_worker.h"

namespace mmserve::transfer {

// What a member needs to write into another member's exchange buffer.
using EspExchangeTarget = NoticeBoardTarget;

class UcxEspExchange : public model::KvExchange {
 public:
  struct Plan {
    std::vector<std::vector<int64_t>> rows;  // per member, ascending global indices
    int64_t prompt_len = 0;
    int64_t kv_width = 0;  // floats of one token's K (or V)
  };

  // InvalidArgument unless the members' rows cover [0, prompt_len) exactly
  // once and self is a member.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<UcxEspExchange>> Create(
      UcxContext& context, Plan plan, int self, const UcxWorkerOptions& options,
      absl::Duration layer_timeout);
  ~UcxEspExchange() override;
  UcxEspExchange(const UcxEspExchange&) = delete;
  UcxEspExchange& operator=(const UcxEspExchange&) = delete;

  const EspExchangeTarget& target() const { return board_->target(); }
  // Endpoints to every other member; targets in member order.
  [[nodiscard]] absl::Status Connect(const std::vector<EspExchangeTarget>& targets);

  [[nodiscard]] absl::Status AllGather(int layer, absl::Span<const int64_t> rows, const float* k,
                                       const float* v, const float** k_all,
                                       const float** v_all) override;
  // Tells every peer (best effort) and ends this member's waits.
  void Abort() override;

 private:
  UcxEspExchange(Plan plan, int self, absl::Duration timeout);
  float* Plane(int slot, int kv) const;
  int Notice(int slot, int member) const {
    return slot * static_cast<int>(plan_.rows.size()) + member;
  }
  uint32_t RowsCrc(int slot, const std::vector<int64_t>& rows) const;
  absl::Status Exchange(int slot, uint32_t seq, Deadline deadline);

  const Plan plan_;
  const int self_;
  const absl::Duration timeout_;
  std::unique_ptr<UcxNoticeBoard> board_;
  std::vector<int> peers_;               // every member but self
  std::atomic<bool> aborted_{false};     // this member's waits end
  std::atomic<bool> abort_sent_{false};  // the peers were told
};

}  // namespace mmserve::transfer

#endif  // MMSERVE_TRANSFER_ESP_KV_EXCHANGE_H_
