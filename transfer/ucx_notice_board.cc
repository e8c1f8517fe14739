#include "transfer/ucx_notice_board.h"

#include <sched.h>

#include <algorithm>
#include <cstring>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/status_macros.h"
#include "transfer/elastic_echo.h"
#include "transfer/ucx_request.h"

namespace mmserve::transfer {
namespace {}  // namespace

// One batch of puts and the flushes after them.
struct UcxNoticeBoard::Puts {
  std::set<int> named;       // the peers written to; set before the batch starts
  int pending = 1;           // flushes not completed, plus a guard; progress thread only
  absl::Status first_error;  // progress thread only until `done`
  absl::Status refused;      // the batch did not start (set before `done`)
  absl::Status result;
  absl::Notification done;
};

namespace {

// One flush (or the guard) done; the last settles the batch.
void Settle(UcxNoticeBoard::Puts& state) {
  if (--state.pending == 0) {
    state.result = state.first_error;
    state.done.Notify();
  }
}

}  // namespace

struct UcxNoticeBoard::Peer {
  std::unique_ptr<UcxEndpoint> ep;
  std::unique_ptr<UcxRemoteKey> rkey;
  uint64_t base = 0;
  uint64_t notice_offset = 0;
  ProcessIdentity process;
  std::shared_ptr<std::atomic<bool>> failed = std::make_shared<std::atomic<bool>>(false);
};

UcxNoticeBoard::UcxNoticeBoard(size_t data_bytes, int notices)
    : data_bytes_(data_bytes), notices_(notices) {}

absl::StatusOr<std::unique_ptr<UcxNoticeBoard>> UcxNoticeBoard::Create(
    UcxContext& context, size_t data_bytes, int notices, const UcxWorkerOptions& options) {
  std::unique_ptr<UcxNoticeBoard> b(new UcxNoticeBoard(data_bytes, notices));
  const size_t bytes = b->NoticeOffset(notices + 1);
  ASSIGN_OR_RETURN(b->region_, UcxMemoryRegion::Allocate(context, bytes));
  std::memset(b->data() + b->NoticeOffset(0), 0, (notices + 1) * sizeof(uint64_t));
  ASSIGN_OR_RETURN(b->worker_, UcxWorker::Create(context, options));
  UcxNoticeBoard* board = b.get();
  b->worker_->Start(nullptr,
                    [board] { return board->awake_holds_.load(std::memory_order_relaxed) > 0; });
  ASSIGN_OR_RETURN(b->target_.rkey, b->region_->PackRkey());
  b->target_.worker_address = b->worker_->address();
  b->target_.base_address = reinterpret_cast<uint64_t>(b->region_->address());
  b->target_.notice_offset = b->NoticeOffset(0);
  b->target_.process = SelfProcessIdentity();
  return b;
}

UcxNoticeBoard::~UcxNoticeBoard() {
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

absl::Status UcxNoticeBoard::Connect(const std::vector<NoticeBoardTarget>& targets, int self) {
  return worker_->RunSync([&]() -> absl::Status {
    peers_.clear();
    for (size_t i = 0; i < targets.size(); ++i) {
      peers_.push_back(nullptr);
      if (static_cast<int>(i) == self || targets[i].worker_address.empty()) continue;
      auto peer = std::make_unique<Peer>();
      std::shared_ptr<std::atomic<bool>> failed = peer->failed;
      ASSIGN_OR_RETURN(peer->ep, UcxEndpoint::Create(*worker_, targets[i].worker_address,
                                                     [failed](absl::Status) { *failed = true; }));
      ASSIGN_OR_RETURN(peer->rkey, UcxRemoteKey::Unpack(peer->ep->get(), targets[i].rkey));
      peer->base = targets[i].base_address;
      peer->notice_offset =
          targets[i].notice_offset != 0 ? targets[i].notice_offset : NoticeOffset(0);
      peer->process = targets[i].process;
      peers_.back() = std::move(peer);
    }
    return absl::OkStatus();
  });
}

absl::Status UcxNoticeBoard::ConnectPeer(int index, const NoticeBoardTarget& target) {
  if (index < 0) return absl::InvalidArgumentError("notice board: no such peer");
  return worker_->RunSync([&]() -> absl::Status {
    if (static_cast<int>(peers_.size()) <= index) peers_.resize(index + 1);
    peers_[index].reset();
    if (target.worker_address.empty()) return absl::OkStatus();
    auto peer = std::make_unique<Peer>();
    std::shared_ptr<std::atomic<bool>> failed = peer->failed;
    ASSIGN_OR_RETURN(peer->ep, UcxEndpoint::Create(*worker_, target.worker_address,
                                                   [failed](absl::Status) { *failed = true; }));
    ASSIGN_OR_RETURN(peer->rkey, UcxRemoteKey::Unpack(peer->ep->get(), target.rkey));
    peer->base = target.base_address;
    peer->notice_offset = target.notice_offset != 0 ? target.notice_offset : NoticeOffset(0);
    peer->process = target.process;
    peers_[index] = std::move(peer);
    return absl::OkStatus();
  });
}

bool UcxNoticeBoard::PeerLost(int index) { return index >= 0 && CheckPeerProcesses({index}); }

bool UcxNoticeBoard::CheckPeerProcesses(const std::set<int>& which) {
  bool lost = false;
  (void)worker_->RunSync([&] {
    for (int i = 0; i < static_cast<int>(peers_.size()); ++i) {
      Peer* p = peers_[i].get();
      if (p == nullptr || (!which.empty() && which.count(i) == 0)) continue;
      if (!*p->failed && CheckPeerProcess(p->process) == PeerState::kGone) *p->failed = true;
      lost |= *p->failed;
    }
    return absl::OkStatus();
  });
  return lost;
}

void UcxNoticeBoard::ClearNotices() {
  (void)worker_->RunSync([&] {
    std::memset(data() + NoticeOffset(0), 0, notices_ * sizeof(uint64_t));
    return absl::OkStatus();
  });
}

absl::Status UcxNoticeBoard::PutAndFlush(const std::vector<Piece>& pieces, Deadline deadline) {
  return PutFenceFlush(pieces, {}, deadline);
}

std::shared_ptr<UcxNoticeBoard::Puts> UcxNoticeBoard::NewPuts(const std::vector<Piece>& first,
                                                              const std::vector<Piece>& after) {
  auto state = std::make_shared<Puts>();
  for (const Piece& piece : first) state->named.insert(piece.peer);
  for (const Piece& piece : after) state->named.insert(piece.peer);
  return state;
}

absl::Status UcxNoticeBoard::PutFenceFlush(const std::vector<Piece>& first,
                                           const std::vector<Piece>& after, Deadline deadline) {
  std::shared_ptr<Puts> state = NewPuts(first, after);
  RETURN_IF_ERROR(worker_->RunSync([&] { return IssuePuts(state, first, after); }));
  return WaitPuts(*state, deadline);
}

std::shared_ptr<UcxNoticeBoard::Puts> UcxNoticeBoard::StartPuts(std::vector<Piece> first,
                                                                std::vector<Piece> after) {
  std::shared_ptr<Puts> state = NewPuts(first, after);
  worker_->Post([this, state, first = std::move(first), after = std::move(after)] {
    absl::Status s = IssuePuts(state, first, after);
    if (s.ok()) return;
    state->refused = std::move(s);  // no flush started: nothing else settles it
    state->done.Notify();
  });
  return state;
}

absl::Status UcxNoticeBoard::IssuePuts(const std::shared_ptr<Puts>& state,
                                       const std::vector<Piece>& first,
                                       const std::vector<Piece>& after) {
  const UcxDone note = [state](absl::Status st) {
    if (!st.ok() && state->first_error.ok()) state->first_error = st;
  };
  auto put = [&](const Piece& piece) -> absl::Status {
    if (piece.peer < 0 || piece.peer >= static_cast<int>(peers_.size()) ||
        peers_[piece.peer] == nullptr) {
      return absl::InvalidArgumentError("notice board: no such peer");
    }
    const Peer& p = *peers_[piece.peer];
    if (*p.failed) return absl::UnavailableError("notice board: a peer is lost");
    const uint64_t remote =
        piece.to_notice ? p.notice_offset + piece.remote_offset * 8 : piece.remote_offset;
    StartUcxOp(
        [&](const ucp_request_param_t& param) {
          return ucp_put_nbx(p.ep->get(), data() + piece.local_offset, piece.bytes, p.base + remote,
                             p.rkey->get(), &param);
        },
        note);
    return absl::OkStatus();
  };
  for (const Piece& piece : first) RETURN_IF_ERROR(put(piece));
  if (!first.empty() && !after.empty()) {
    const ucs_status_t fenced = ucp_worker_fence(worker_->get());
    if (fenced != UCS_OK) {
      return absl::InternalError(absl::StrCat("ucp_worker_fence: ", ucs_status_string(fenced)));
    }
  }
  for (const Piece& piece : after) RETURN_IF_ERROR(put(piece));
  for (int i : state->named) {
    ++state->pending;
    StartUcxOp(
        [&](const ucp_request_param_t& param) {
          return ucp_ep_flush_nbx(peers_[i]->ep->get(), &param);
        },
        [state](absl::Status st) {
          if (!st.ok() && state->first_error.ok()) state->first_error = st;
          Settle(*state);
        });
  }
  Settle(*state);  // the guard
  return absl::OkStatus();
}

absl::Status UcxNoticeBoard::WaitPuts(Puts& state, Deadline deadline) {
  // A flush over shm waits for the peer's progress: check its process.
  while (!state.done.WaitForNotificationWithTimeout(
      std::min(deadline.Remaining(), kLivenessInterval))) {
    if (deadline.Expired())
      return absl::DeadlineExceededError("a peer did not take the data in time");
    if (!state.named.empty() && CheckPeerProcesses(state.named)) {
      return absl::UnavailableError("a peer is lost");
    }
  }
  if (!state.refused.ok()) return state.refused;
  if (!state.result.ok()) {
    return absl::UnavailableError(absl::StrCat("a peer is lost: ", state.result.message()));
  }
  return absl::OkStatus();
}

absl::Status UcxNoticeBoard::Notify(const std::vector<int>& peers, int index, uint64_t word,
                                    Deadline deadline) {
  absl::MutexLock lock(&notify_mu_);
  const uint64_t staging = NoticeOffset(notices_);
  std::memcpy(data() + staging, &word, sizeof(word));
  std::vector<Piece> pieces;
  for (int p : peers) {
    pieces.push_back({p, staging, static_cast<uint64_t>(index), sizeof(word), /*to_notice=*/true});
  }
  return PutAndFlush(pieces, deadline);
}

absl::Status UcxNoticeBoard::PutAndNotify(const std::vector<Piece>& pieces,
                                          const std::vector<int>& peers, int index, uint64_t word,
                                          Deadline deadline) {
  absl::MutexLock lock(&notify_mu_);
  const uint64_t staging = NoticeOffset(notices_);
  std::memcpy(data() + staging, &word, sizeof(word));
  std::vector<Piece> notices;
  for (int p : peers) {
    notices.push_back({p, staging, static_cast<uint64_t>(index), sizeof(word), /*to_notice=*/true});
  }
  return PutFenceFlush(pieces, notices, deadline);
}

void UcxNoticeBoard::Peek(const std::vector<int>& indices, std::vector<uint64_t>* words) const {
  words->resize(indices.size());
  for (size_t i = 0; i < indices.size(); ++i) {
    (*words)[i] = __atomic_load_n(
        reinterpret_cast<const uint64_t*>(data() + NoticeOffset(indices[i])), __ATOMIC_ACQUIRE);
  }
}

absl::Status UcxNoticeBoard::Read(const std::vector<int>& indices, std::vector<uint64_t>* words,
                                  bool ignore_lost) {
  words->assign(indices.size(), 0);
  // On the progress thread: emulated puts land there, so what it read (and
  // every byte put before it) is ordered before the caller's later reads.
  return worker_->RunSync([&] {
    for (size_t i = 0; i < indices.size(); ++i) {
      (*words)[i] = __atomic_load_n(
          reinterpret_cast<const uint64_t*>(data() + NoticeOffset(indices[i])), __ATOMIC_ACQUIRE);
    }
    for (const std::unique_ptr<Peer>& p : peers_) {
      if (!ignore_lost && p != nullptr && *p->failed) {
        return absl::UnavailableError("a peer is lost");
      }
    }
    return absl::OkStatus();
  });
}

absl::Status UcxNoticeBoard::Await(const std::vector<int>& indices, uint32_t seq, Deadline deadline,
                                   const std::atomic<bool>& cancelled, std::vector<uint64_t>* words,
                                   uint32_t abort_seq) {
  // Polls with Peek (no hop to the progress thread, which a spinning
  // caller would otherwise keep busy); Reads when the words look settled
  // and at each liveness check (a lost peer's report).
  HoldAwake(true);
  struct Release {
    UcxNoticeBoard* board;
    ~Release() { board->HoldAwake(false); }
  } release{this};
  Deadline check = Deadline::After(kLivenessInterval);
  bool read = true;
  for (;;) {
    if (read) {
      RETURN_IF_ERROR(Read(indices, words));
    } else {
      Peek(indices, words);
    }
    size_t ready = 0, aborted = 0;
    absl::StatusCode code = absl::StatusCode::kUnavailable;
    for (uint64_t word : *words) {
      const bool abort = NoticeSeq(word) == kAbortSeq || NoticeSeq(word) == abort_seq;
      if (abort && aborted == 0) code = AbortCode(word);
      aborted += abort;
      ready += NoticeSeq(word) == seq;
    }
    if (aborted > 0 || ready == indices.size()) {
      if (!read) {  // settled: Read orders the data before the caller's reads
        read = true;
        continue;
      }
      if (aborted > 0) return absl::Status(code, kElasticEcho);
      return absl::OkStatus();
    }
    read = false;
    if (cancelled) return absl::UnavailableError("cancelled");
    if (deadline.Expired()) return absl::DeadlineExceededError("a notice did not come in time");
    if (check.Expired()) {
      (void)CheckPeerProcesses({});  // the next Read sees a gone one lost
      check = Deadline::After(kLivenessInterval);
      read = true;
    }
    sched_yield();
  }
}

}  // namespace mmserve::transfer
