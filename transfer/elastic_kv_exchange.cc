#include "transfer/elastic_kv_exchange.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "common/status_macros.h"

namespace mmserve::transfer {
namespace {

// Runs of consecutive global indices: (first, length).
std::vector<std::pair<int64_t, int64_t>> Runs(const std::vector<int64_t>& rows) {
  std::vector<std::pair<int64_t, int64_t>> runs;
  for (int64_t g : rows) {
    if (!runs.empty() && runs.back().first + runs.back().second == g) {
      ++runs.back().second;
    } else {
      runs.push_back({g, 1});
    }
  }
  return runs;
}

absl::Status CheckPlan(const UcxElasticExchange::Plan& plan, int self) {
  if (self < 0 || self >= static_cast<int>(plan.rows.size()) || plan.kv_width <= 0 ||
      plan.prompt_len <= 0) {
    return absl::InvalidArgumentError("elastic exchange: bad plan");
  }
  std::vector<bool> seen(plan.prompt_len, false);
  int64_t count = 0;
  for (const std::vector<int64_t>& rows : plan.rows) {
    for (size_t i = 0; i < rows.size(); ++i) {
      if (rows[i] < 0 || rows[i] >= plan.prompt_len || seen[rows[i]] ||
          (i > 0 && rows[i] <= rows[i - 1])) {
        return absl::InvalidArgumentError("elastic exchange: rows must cover the prompt once");
      }
      seen[rows[i]] = true;
      ++count;
    }
  }
  if (count != plan.prompt_len) {
    return absl::InvalidArgumentError("elastic exchange: rows must cover the prompt once");
  }
  return absl::OkStatus();
}

}  // namespace

UcxElasticExchange::UcxElasticExchange(Plan plan, int self, absl::Duration timeout,
                                       uint32_t seq_base)
    : plan_(std::move(plan)), self_(self), timeout_(timeout), seq_base_(seq_base) {
  for (int m = 0; m < static_cast<int>(plan_.rows.size()); ++m) {
    if (m != self_) peers_.push_back(m);
  }
}

absl::StatusOr<std::unique_ptr<UcxElasticExchange>> UcxElasticExchange::Create(
    UcxContext& context, Plan plan, int self, const UcxWorkerOptions& options,
    absl::Duration layer_timeout) {
  RETURN_IF_ERROR(CheckPlan(plan, self));
  std::unique_ptr<UcxElasticExchange> ex(
      new UcxElasticExchange(std::move(plan), self, layer_timeout, 0));
  ASSIGN_OR_RETURN(
      ex->own_board_,
      UcxNoticeBoard::Create(context, BoardBytes(ex->plan_.prompt_len, ex->plan_.kv_width),
                             BoardNotices(static_cast<int>(ex->plan_.rows.size())), options));
  ex->board_ = ex->own_board_.get();
  return ex;
}

absl::StatusOr<std::unique_ptr<UcxElasticExchange>> UcxElasticExchange::CreateOn(
    UcxNoticeBoard& board, Plan plan, int self, uint32_t seq_base, absl::Duration layer_timeout) {
  RETURN_IF_ERROR(CheckPlan(plan, self));
  if (seq_base == 0) return absl::InvalidArgumentError("elastic exchange: sequence base 0");
  if (BoardBytes(plan.prompt_len, plan.kv_width) > board.data_bytes() ||
      BoardNotices(static_cast<int>(plan.rows.size())) > board.notices()) {
    return absl::ResourceExhaustedError("elastic exchange: the prompt or group exceeds the board");
  }
  std::unique_ptr<UcxElasticExchange> ex(
      new UcxElasticExchange(std::move(plan), self, layer_timeout, seq_base));
  ex->board_ = &board;
  return ex;
}

uint32_t UcxElasticExchange::SeqBase(std::string_view request_id, uint64_t group) {
  // Layers take base .. base + layers + 1 and the abort word base - 1: keep
  // all of them in [1, 2^31 + 2^16), far below kAbortSeq.
  uint32_t crc = Crc32c(request_id.data(), request_id.size());
  if (group != 0) crc = Crc32cExtend(crc, &group, sizeof(group));
  return 2 + crc % 0x7fffffffu;
}

void UcxElasticExchange::Refuse(UcxNoticeBoard& board,
                                const std::vector<ElasticExchangeTarget>& targets, int self,
                                uint32_t seq_base, absl::StatusCode code) {
  const int members = static_cast<int>(targets.size());
  if (self < 0 || self >= members || seq_base == 0) return;
  if (!board.Connect(targets, self).ok()) return;
  std::vector<int> peers;
  for (int m = 0; m < members; ++m) {
    if (m != self && !targets[m].worker_address.empty()) peers.push_back(m);
  }
  // Both slots: a peer waits on slot 1 to join and on slot layer % 2 after.
  for (int slot = 0; slot < 2; ++slot) {
    (void)board.Notify(peers, slot * members + self, AbortWord(seq_base - 1, code),
                       Deadline::After(absl::Milliseconds(200)));
  }
}

UcxElasticExchange::~UcxElasticExchange() = default;

float* UcxElasticExchange::Plane(int slot, int kv) const {
  const int64_t plane = plan_.prompt_len * plan_.kv_width;
  return reinterpret_cast<float*>(board_->data()) + (2 * slot + kv) * plane;
}

absl::Status UcxElasticExchange::Connect(const std::vector<ElasticExchangeTarget>& targets) {
  if (targets.size() != plan_.rows.size()) {
    return absl::InvalidArgumentError("elastic exchange: one target per member");
  }
  return board_->Connect(targets, self_);
}

uint32_t UcxElasticExchange::RowsCrc(int slot, const std::vector<int64_t>& rows) const {
  const size_t row_bytes = plan_.kv_width * sizeof(float);
  uint32_t crc = 0;
  for (int kv = 0; kv < 2; ++kv) {
    for (const auto& [first, count] : Runs(rows)) {
      crc = Crc32cExtend(crc, Plane(slot, kv) + first * plan_.kv_width, count * row_bytes);
    }
  }
  return crc;
}

// This member's rows (already in its own slot) to every peer, its notice,
// then every peer's notice and their CRCs.
absl::Status UcxElasticExchange::Exchange(int slot, uint32_t seq, Deadline deadline) {
  const std::vector<int64_t>& mine = plan_.rows[self_];
  const uint64_t row_bytes = plan_.kv_width * sizeof(float);
  std::vector<UcxNoticeBoard::Piece> pieces;
  for (int peer : peers_) {
    for (const auto& [first, count] : Runs(mine)) {
      for (int kv = 0; kv < 2; ++kv) {
        const uint64_t at =
            reinterpret_cast<const uint8_t*>(Plane(slot, kv)) - board_->data() + first * row_bytes;
        pieces.push_back({peer, at, at, count * row_bytes});
      }
    }
  }
  RETURN_IF_ERROR(board_->PutAndFlush(pieces, deadline));
  bytes_.Sent(2 * mine.size() * row_bytes * peers_.size());
  RETURN_IF_ERROR(
      board_->Notify(peers_, Notice(slot, self_), NoticeWord(seq, RowsCrc(slot, mine)), deadline));
  std::vector<int> notices;
  for (int peer : peers_) notices.push_back(Notice(slot, peer));
  std::vector<uint64_t> words;
  RETURN_IF_ERROR(board_->Await(notices, seq, deadline, aborted_, &words, abort_seq()));
  for (size_t i = 0; i < peers_.size(); ++i) {
    if (NoticeCrc(words[i]) != RowsCrc(slot, plan_.rows[peers_[i]])) {
      return absl::DataLossError("a member's K/V failed its CRC32C");
    }
    bytes_.Received(2 * plan_.rows[peers_[i]].size() * row_bytes);
  }
  return absl::OkStatus();
}

absl::Status UcxElasticExchange::AllGather(int layer, absl::Span<const int64_t> rows,
                                           const float* k, const float* v, const float** k_all,
                                           const float** v_all) {
  const std::vector<int64_t>& mine = plan_.rows[self_];
  if (rows.size() != mine.size() || !std::equal(rows.begin(), rows.end(), mine.begin())) {
    return absl::InvalidArgumentError("elastic exchange: rows differ from the plan");
  }
  if (aborted_) return absl::UnavailableError("elastic exchange: aborted");
  const int slot = layer & 1;
  for (size_t i = 0; i < mine.size(); ++i) {
    std::memcpy(Plane(slot, 0) + mine[i] * plan_.kv_width, k + i * plan_.kv_width,
                plan_.kv_width * sizeof(float));
    std::memcpy(Plane(slot, 1) + mine[i] * plan_.kv_width, v + i * plan_.kv_width,
                plan_.kv_width * sizeof(float));
  }
  absl::Status s =
      Exchange(slot, seq_base_ + static_cast<uint32_t>(layer) + 1, Deadline::After(timeout_));
  if (!s.ok()) {
    aborted_ = true;
    return absl::Status(s.code(), absl::StrCat("elastic exchange: ", s.message()));
  }
  *k_all = Plane(slot, 0);
  *v_all = Plane(slot, 1);
  return absl::OkStatus();
}

void UcxElasticExchange::Abort(absl::StatusCode code) {
  aborted_ = true;
  if (abort_sent_.exchange(true)) return;
  // Best effort: an abort word in both slots of every peer, briefly.
  for (int slot = 0; slot < 2; ++slot) {
    (void)board_->Notify(peers_, Notice(slot, self_), AbortWord(abort_seq(), code),
                         Deadline::After(absl::Milliseconds(200)));
  }
}

// Slot 1 carries the join: a peer writes its layer-1 notice there only after
// this member's layer-0 notice, which follows this member's Join.
absl::Status UcxElasticExchange::Join(absl::Duration timeout) {
  const Deadline deadline = Deadline::After(timeout);
  absl::Status s = board_->Notify(peers_, Notice(1, self_), NoticeWord(seq_base_, 0), deadline);
  std::vector<int> notices;
  for (int peer : peers_) notices.push_back(Notice(1, peer));
  std::vector<uint64_t> words;
  if (s.ok()) s = board_->Await(notices, seq_base_, deadline, aborted_, &words, abort_seq());
  if (!s.ok()) {
    aborted_ = true;
    return absl::Status(s.code(),
                        absl::StrCat("elastic exchange: a member did not join: ", s.message()));
  }
  return absl::OkStatus();
}

// The slot after the last layer's: every member has read its notices for
// layer num_layers - 2 before it sent its notice for num_layers - 1.
absl::Status UcxElasticExchange::SendToken(int num_layers, int to, int32_t token) {
  const uint32_t seq = seq_base_ + static_cast<uint32_t>(num_layers) + 1;
  return board_->Notify({to}, Notice(num_layers & 1, self_),
                        NoticeWord(seq, static_cast<uint32_t>(token)), Deadline::After(timeout_));
}

absl::StatusOr<int32_t> UcxElasticExchange::AwaitToken(int num_layers, int from) {
  const uint32_t seq = seq_base_ + static_cast<uint32_t>(num_layers) + 1;
  std::vector<uint64_t> words;
  absl::Status s = board_->Await({Notice(num_layers & 1, from)}, seq, Deadline::After(timeout_),
                                 aborted_, &words, abort_seq());
  if (!s.ok()) return absl::Status(s.code(), absl::StrCat("elastic exchange: ", s.message()));
  return static_cast<int32_t>(NoticeCrc(words[0]));
}

void UcxElasticExchange::Finish() {
  if (own_board_ == nullptr) board_->ClearNotices();
}

}  // namespace mmserve::transfer
