#include "transfer/esp_kv_exchange.h"

#include <sched.h>

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/crc32c.h"
#include "common/status_macros.h"
#include "transfer/ucx_request.h"

namespace mmserve::transfer {
namespace {

// A notice word: sequence (layer + 1, or kAbort) in the high half, CRC32C in
// the low half; one aligned 8-byte store, so a reader never sees half of it.
constexpr uint32_t kAbort = 0xffffffffu;
uint64_t NoticeWord(uint32_t seq, uint32_t crc) { return (uint64_t{seq} << 32) | crc; }

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

// One batch of puts and the flushes after them.
struct PutState {
  int pending = 0;           // flushes not completed, plus a guard; progress thread only
  absl::Status first_error;  // progress thread only until `done`
  absl::Status result;
  absl::Notification done;
};

// One flush (or the guard) done; the last settles the batch.
void Settle(PutState& state) {
  if (--state.pending == 0) {
    state.result = state.first_error;
    state.done.Notify();
  }
}

}  // namespace

struct UcxEspExchange::Peer {
  std::unique_ptr<UcxEndpoint> ep;
  std::unique_ptr<UcxRemoteKey> rkey;
  uint64_t base = 0;
  std::shared_ptr<std::atomic<bool>> failed = std::make_shared<std::atomic<bool>>(false);
};

UcxEspExchange::UcxEspExchange(Plan plan, int self, absl::Duration timeout)
    : plan_(std::move(plan)), self_(self), timeout_(timeout) {}

absl::StatusOr<std::unique_ptr<UcxEspExchange>> UcxEspExchange::Create(
    UcxContext& context, Plan plan, int self, const UcxWorkerOptions& options,
    absl::Duration layer_timeout) {
  const int members = static_cast<int>(plan.rows.size());
  if (self < 0 || self >= members || plan.kv_width <= 0 || plan.prompt_len <= 0) {
    return absl::InvalidArgumentError("ESP exchange: bad plan");
  }
  std::vector<bool> seen(plan.prompt_len, false);
  for (const std::vector<int64_t>& rows : plan.rows) {
    for (size_t i = 0; i < rows.size(); ++i) {
      if (rows[i] < 0 || rows[i] >= plan.prompt_len || seen[rows[i]] ||
          (i > 0 && rows[i] <= rows[i - 1])) {
        return absl::InvalidArgumentError("ESP exchange: rows must cover the prompt once");
      }
      seen[rows[i]] = true;
    }
  }
  for (bool s : seen) {
    if (!s) return absl::InvalidArgumentError("ESP exchange: rows must cover the prompt once");
  }
  std::unique_ptr<UcxEspExchange> ex(new UcxEspExchange(std::move(plan), self, layer_timeout));
  const size_t bytes = ex->NoticeOffset(0, 0) + (2 * members + 1) * sizeof(uint64_t);
  ASSIGN_OR_RETURN(ex->region_, UcxMemoryRegion::Allocate(context, bytes));
  std::memset(static_cast<uint8_t*>(ex->region_->address()) + ex->NoticeOffset(0, 0), 0,
              (2 * members + 1) * sizeof(uint64_t));
  ASSIGN_OR_RETURN(ex->worker_, UcxWorker::Create(context, options));
  ex->worker_->Start(nullptr);
  ASSIGN_OR_RETURN(ex->target_.rkey, ex->region_->PackRkey());
  ex->target_.worker_address = ex->worker_->address();
  ex->target_.base_address = reinterpret_cast<uint64_t>(ex->region_->address());
  return ex;
}

UcxEspExchange::~UcxEspExchange() {
  if (worker_ == nullptr) return;
  (void)worker_->RunSync([this] {
    for (std::unique_ptr<Peer>& p : peers_) {
      if (p == nullptr) continue;
      p->rkey.reset();
      if (p->ep != nullptr) p->ep->Close(Deadline::After(absl::Milliseconds(100)));
    }
    peers_.clear();
    return absl::OkStatus();
  });
  worker_->Stop();
}

float* UcxEspExchange::Plane(int slot, int kv) const {
  const int64_t plane = plan_.prompt_len * plan_.kv_width;
  return static_cast<float*>(region_->address()) + (2 * slot + kv) * plane;
}

uint64_t UcxEspExchange::NoticeOffset(int slot, int member) const {
  const uint64_t planes = 4 * plan_.prompt_len * plan_.kv_width * sizeof(float);
  const uint64_t aligned = (planes + 63) / 64 * 64;
  return aligned + (slot * plan_.rows.size() + member) * sizeof(uint64_t);
}

absl::Status UcxEspExchange::Connect(const std::vector<EspExchangeTarget>& targets) {
  if (targets.size() != plan_.rows.size()) {
    return absl::InvalidArgumentError("ESP exchange: one target per member");
  }
  return worker_->RunSync([&]() -> absl::Status {
    peers_.clear();
    for (size_t m = 0; m < targets.size(); ++m) {
      peers_.push_back(nullptr);
      if (static_cast<int>(m) == self_) continue;
      auto peer = std::make_unique<Peer>();
      std::shared_ptr<std::atomic<bool>> failed = peer->failed;
      ASSIGN_OR_RETURN(peer->ep, UcxEndpoint::Create(*worker_, targets[m].worker_address,
                                                     [failed](absl::Status) { *failed = true; }));
      ASSIGN_OR_RETURN(peer->rkey, UcxRemoteKey::Unpack(peer->ep->get(), targets[m].rkey));
      peer->base = targets[m].base_address;
      peers_.back() = std::move(peer);
    }
    return absl::OkStatus();
  });
}

absl::Status UcxEspExchange::PutAndFlush(const std::vector<std::pair<int64_t, int64_t>>& runs,
                                         int slot, Deadline deadline) {
  auto state = std::make_shared<PutState>();
  const size_t row_bytes = plan_.kv_width * sizeof(float);
  const uint8_t* base = static_cast<const uint8_t*>(region_->address());
  const uint64_t notice_at = NoticeOffset(0, 0) + 2 * plan_.rows.size() * sizeof(uint64_t);
  state->pending = 1;  // a guard until every flush has started
  RETURN_IF_ERROR(worker_->RunSync([&]() -> absl::Status {
    const UcxDone note = [state](absl::Status st) {
      if (!st.ok() && state->first_error.ok()) state->first_error = st;
    };
    for (const std::unique_ptr<Peer>& p : peers_) {
      if (p == nullptr) continue;
      if (*p->failed) return absl::UnavailableError("ESP exchange: a peer is lost");
      // runs empty: this batch is the notice word (staged after the notices).
      auto put = [&](uint64_t offset, size_t len, uint64_t remote_offset) {
        StartUcxOp(
            [&](const ucp_request_param_t& param) {
              return ucp_put_nbx(p->ep->get(), base + offset, len, p->base + remote_offset,
                                 p->rkey->get(), &param);
            },
            note);
      };
      if (runs.empty()) put(notice_at, sizeof(uint64_t), NoticeOffset(slot, self_));
      for (const auto& [first, count] : runs) {
        for (int kv = 0; kv < 2; ++kv) {
          const uint64_t at =
              reinterpret_cast<const uint8_t*>(Plane(slot, kv)) - base + first * row_bytes;
          put(at, count * row_bytes, at);
        }
      }
      ++state->pending;
      StartUcxOp(
          [&](const ucp_request_param_t& param) { return ucp_ep_flush_nbx(p->ep->get(), &param); },
          [state](absl::Status st) {
            if (!st.ok() && state->first_error.ok()) state->first_error = st;
            Settle(*state);
          });
    }
    Settle(*state);  // the guard taken below
    return absl::OkStatus();
  }));
  if (!state->done.WaitForNotificationWithTimeout(deadline.Remaining())) {
    return absl::DeadlineExceededError("ESP exchange: a peer did not take the K/V in time");
  }
  if (!state->result.ok()) {
    return absl::UnavailableError(absl::StrCat("ESP exchange: ", state->result.message()));
  }
  return absl::OkStatus();
}

absl::Status UcxEspExchange::PutNotices(int slot, uint64_t seq, uint32_t crc, Deadline deadline) {
  uint8_t* base = static_cast<uint8_t*>(region_->address());
  const uint64_t word = NoticeWord(static_cast<uint32_t>(seq), crc);
  std::memcpy(base + NoticeOffset(0, 0) + 2 * plan_.rows.size() * sizeof(uint64_t), &word,
              sizeof(word));
  return PutAndFlush({}, slot, deadline);
}

absl::Status UcxEspExchange::AwaitNotices(int slot, uint64_t seq, Deadline deadline,
                                          std::vector<uint64_t>* words) {
  const uint8_t* base = static_cast<const uint8_t*>(region_->address());
  const int members = static_cast<int>(plan_.rows.size());
  words->assign(members, 0);
  for (;;) {
    // Read on the progress thread: emulated puts land there, so what it
    // read (and every byte before it) is ordered before our later reads.
    RETURN_IF_ERROR(worker_->RunSync([&] {
      for (int m = 0; m < members; ++m) {
        if (m == self_) continue;
        (*words)[m] = __atomic_load_n(
            reinterpret_cast<const uint64_t*>(base + NoticeOffset(slot, m)), __ATOMIC_ACQUIRE);
      }
      return absl::OkStatus();
    }));
    int ready = 0;
    for (int m = 0; m < members; ++m) {
      if (m == self_) continue;
      const uint64_t word = (*words)[m];
      if ((word >> 32) == kAbort) return absl::UnavailableError("ESP exchange: a member failed");
      ready += (word >> 32) == seq;
    }
    if (ready == members - 1) return absl::OkStatus();
    if (aborted_) return absl::UnavailableError("ESP exchange: aborted");
    if (deadline.Expired()) {
      return absl::DeadlineExceededError("ESP exchange: a member's K/V did not arrive in time");
    }
    sched_yield();
  }
}

uint32_t UcxEspExchange::RowsCrc(int slot, const std::vector<int64_t>& rows) const {
  const size_t row_bytes = plan_.kv_width * sizeof(float);
  uint32_t crc = 0;
  for (int kv = 0; kv < 2; ++kv) {
    for (const auto& [first, count] : Runs(rows)) {
      crc = Crc32cExtend(crc, Plane(slot, kv) + first * plan_.kv_width, count * row_bytes);
    }
  }
  return crc;
}

absl::Status UcxEspExchange::AllGather(int layer, absl::Span<const int64_t> rows, const float* k,
                                       const float* v, const float** k_all, const float** v_all) {
  const std::vector<int64_t>& mine = plan_.rows[self_];
  if (rows.size() != mine.size() || !std::equal(rows.begin(), rows.end(), mine.begin())) {
    return absl::InvalidArgumentError("ESP exchange: rows differ from the plan");
  }
  if (aborted_) return absl::UnavailableError("ESP exchange: aborted");
  const int slot = layer & 1;
  const uint64_t seq = static_cast<uint64_t>(layer) + 1;
  const Deadline deadline = Deadline::After(timeout_);
  for (size_t i = 0; i < mine.size(); ++i) {
    std::memcpy(Plane(slot, 0) + mine[i] * plan_.kv_width, k + i * plan_.kv_width,
                plan_.kv_width * sizeof(float));
    std::memcpy(Plane(slot, 1) + mine[i] * plan_.kv_width, v + i * plan_.kv_width,
                plan_.kv_width * sizeof(float));
  }
  absl::Status s = PutAndFlush(Runs(mine), slot, deadline);
  if (s.ok()) s = PutNotices(slot, seq, RowsCrc(slot, mine), deadline);
  std::vector<uint64_t> words;
  if (s.ok()) s = AwaitNotices(slot, seq, deadline, &words);
  for (int m = 0; s.ok() && m < static_cast<int>(plan_.rows.size()); ++m) {
    if (m == self_) continue;
    if (static_cast<uint32_t>(words[m]) != RowsCrc(slot, plan_.rows[m])) {
      s = absl::DataLossError("ESP exchange: a member's K/V failed its CRC32C");
    }
  }
  if (!s.ok()) {
    aborted_ = true;
    return s;
  }
  *k_all = Plane(slot, 0);
  *v_all = Plane(slot, 1);
  return absl::OkStatus();
}

void UcxEspExchange::Abort() {
  aborted_ = true;
  if (abort_sent_.exchange(true)) return;
  // Best effort: an abort word in both slots of every peer, briefly.
  const uint64_t word = NoticeWord(kAbort, 0);
  std::memcpy(static_cast<uint8_t*>(region_->address()) + NoticeOffset(0, 0) +
                  2 * plan_.rows.size() * sizeof(uint64_t),
              &word, sizeof(word));
  for (int slot = 0; slot < 2; ++slot) {
    (void)PutAndFlush({}, slot, Deadline::After(absl::Milliseconds(200)));
  }
}

}  // namespace mmserve::transfer
