// Registered memory that peers put data and notice words into: the
// mechanics under the elastic-sequence-parallelism transfers
// (elastic_kv_exchange.h, elastic_span_attention.h). Data moves first (puts, then a
// flush: remotely complete), then one 8-byte notice word {sequence, CRC32C}
// is put and flushed (data complete before the notice).
//
//   ASSIGN_OR_RETURN(auto board, UcxNoticeBoard::Create(*ctx, data_bytes, /*notices=*/4, opts));
//   // exchange board->target() with the peers, then
//   RETURN_IF_ERROR(board->Connect(targets));  // peer i = targets[i]; own entry ignored
//   RETURN_IF_ERROR(board->PutAndFlush({{peer, local_offset, remote_offset, bytes}}, deadline));
//   RETURN_IF_ERROR(board->Notify({peer}, /*their notice*/ 2, NoticeWord(seq, crc), deadline));
//   // the peer:
//   RETURN_IF_ERROR(board->Await({2}, seq, deadline, cancelled, &words));
//
// Await polls the notice words from the caller's thread, then reads them
// once more on the progress thread, where UCX 1.13's emulated puts land, so
// the data the peer put before them is visible to the caller afterwards (shm puts into the mapped
// segment are plain memcpys by the peer, ordered by its flush). A word whose sequence is kAbortSeq
// (or the caller's abort sequence) ends every Await on it with the code it
// carries (AbortWord; UNAVAILABLE when none).
//
// Dead peers: UCX tcp reports a lost peer (error mode PEER) and the board
// marks it; UCX 1.13's shm transports report nothing. So every target also
// names its board's process (peer_liveness.h: boot id, pid namespace, pid,
// start time) and, while Await or a flush waits, the board asks the kernel
// every kLivenessInterval (50 ms) whether each connected peer's process
// still lives: one that is gone is marked lost like a tcp one (UNAVAILABLE
// within ~50 ms of its death instead of at the deadline). A peer on another
// host or in another pid namespace cannot be checked: the deadlines and
// UCX's own report stay.
// Thread-safety: PutAndFlush, Notify, PutAndNotify, Peek and Await are
// thread-safe (each runs its UCX work on the progress thread; Notify and
// PutAndNotify calls are serialized, they share the staging word); the caller owns the data layout:
// no two threads may write the same bytes.
#ifndef MMSERVE_TRANSFER_UCX_NOTICE_BOARD_H_
#define MMSERVE_TRANSFER_UCX_NOTICE_BOARD_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "transfer/peer_liveness.h"
#include "transfer/ucx_context.h"
#include "transfer/ucx_endpoint.h"
#include "transfer/ucx_memory.h"
#include "transfer/ucx_worker.h"

namespace mmserve::transfer {

// What a peer needs to write into a board.
struct NoticeBoardTarget {
  std::string worker_address;
  std::string rkey;
  uint64_t base_address = 0;
  // Where the board's notice words start, from base_address. 0: where the
  // writer's own board has them (boards of one size; targets from before
  // this field).
  uint64_t notice_offset = 0;
  // The board's process (Create fills it in): a peer on this host checks
  // that it lives while it waits. Empty: not checked.
  ProcessIdentity process;
};

inline constexpr uint32_t kAbortSeq = 0xffffffffu;
inline uint64_t NoticeWord(uint32_t seq, uint32_t crc) { return (uint64_t{seq} << 32) | crc; }
inline uint32_t NoticeSeq(uint64_t word) { return static_cast<uint32_t>(word >> 32); }
inline uint32_t NoticeCrc(uint64_t word) { return static_cast<uint32_t>(word); }
// An abort word's low half may carry the status code its writer failed
// with (the peers then end with that code); 0 or anything that is no error
// code reads as UNAVAILABLE.
inline uint64_t AbortWord(uint32_t abort_seq, absl::StatusCode code) {
  return NoticeWord(abort_seq, static_cast<uint32_t>(code));
}
inline absl::StatusCode AbortCode(uint64_t word) {
  const uint32_t c = NoticeCrc(word);
  if (c == 0 || c > static_cast<uint32_t>(absl::StatusCode::kUnauthenticated)) {
    return absl::StatusCode::kUnavailable;
  }
  return static_cast<absl::StatusCode>(c);
}

class UcxNoticeBoard {
 public:
  // data_bytes of data, then `notices` words (zeroed), then a staging word.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<UcxNoticeBoard>> Create(
      UcxContext& context, size_t data_bytes, int notices, const UcxWorkerOptions& options);
  ~UcxNoticeBoard();
  UcxNoticeBoard(const UcxNoticeBoard&) = delete;
  UcxNoticeBoard& operator=(const UcxNoticeBoard&) = delete;

  const NoticeBoardTarget& target() const { return target_; }
  uint8_t* data() const { return static_cast<uint8_t*>(region_->address()); }
  size_t data_bytes() const { return data_bytes_; }
  int notices() const { return notices_; }

  // Endpoints to targets[i] for every i but `self` (-1: all) and those
  // with no address.
  [[nodiscard]] absl::Status Connect(const std::vector<NoticeBoardTarget>& targets, int self);
  // Peer `index` alone (a target with no address drops it); the others stay.
  [[nodiscard]] absl::Status ConnectPeer(int index, const NoticeBoardTarget& target);
  // Whether UCX reported peer `index` lost, or its process is gone (false
  // for unconnected ones).
  bool PeerLost(int index);
  // Zeroes every notice word (on the progress thread). A board reused by
  // several exchanges clears them between two.
  void ClearNotices();

  // This board's data [local_offset, + bytes) to the peer's data at remote_offset.
  struct Piece {
    int peer = 0;
    uint64_t local_offset = 0, remote_offset = 0, bytes = 0;
    bool to_notice = false;  // remote_offset is a notice index of the peer's board
  };
  // The pieces, then a flush of every peer named (or of `flush_peers` when
  // pieces is empty). DEADLINE_EXCEEDED past the deadline, UNAVAILABLE when
  // a peer named is lost (UCX's report, or its process gone).
  [[nodiscard]] absl::Status PutAndFlush(const std::vector<Piece>& pieces, Deadline deadline);
  // `word` into notice `index` of each peer, flushed.
  [[nodiscard]] absl::Status Notify(const std::vector<int>& peers, int index, uint64_t word,
                                    Deadline deadline);
  // PutAndFlush then Notify in one round trip: the pieces, a fence (UCX
  // completes them before anything after it), the notices, one flush.
  [[nodiscard]] absl::Status PutAndNotify(const std::vector<Piece>& pieces,
                                          const std::vector<int>& peers, int index, uint64_t word,
                                          Deadline deadline);
  // The notices in `indices` now (read once on the progress thread, with
  // the same ordering as Await). UNAVAILABLE once any connected peer is
  // marked lost (tcp: within ~0.1 s of its death; a gone process: at the
  // waits' next check), unless `ignore_lost` (a server whose clients come
  // and go).
  [[nodiscard]] absl::Status Read(const std::vector<int>& indices, std::vector<uint64_t>* words,
                                  bool ignore_lost = false);
  // A batch of puts in flight.
  struct Puts;
  // PutFenceFlush without the wait: `first`, a fence when both are given,
  // `after` and the flushes go to the progress thread and this returns at
  // once; WaitPuts waits for the flushes (PutFenceFlush's errors). The
  // bytes put must stay as they are until WaitPuts returned. Not from the
  // progress thread.
  std::shared_ptr<Puts> StartPuts(std::vector<Piece> first, std::vector<Piece> after);
  [[nodiscard]] absl::Status WaitPuts(Puts& puts, Deadline deadline);
  // The notices in `indices` as the calling thread sees them now, without
  // the progress thread: a cheap poll. It orders nothing: Read (or Await)
  // before reading the data a word announces.
  void Peek(const std::vector<int>& indices, std::vector<uint64_t>* words) const;
  // While held (holds count), the progress thread keeps polling UCX instead
  // of sleeping: shm puts (UCX 1.13) land only as it progresses and do not
  // wake it. Await holds it while it waits; a server thread polling with
  // Peek holds it while it expects queries.
  void HoldAwake(bool hold) { awake_holds_.fetch_add(hold ? 1 : -1, std::memory_order_relaxed); }
  // Waits until every notice in `indices` has sequence `seq` (*words gets
  // them, in the order of indices; polled with Peek, then Read once). An abort word (kAbortSeq
  // or `abort_seq`) ends it with the code the word carries (AbortCode); UNAVAILABLE once
  // `cancelled` is set or a peer is lost (its process gone
  // included); DEADLINE_EXCEEDED past the deadline.
  [[nodiscard]] absl::Status Await(const std::vector<int>& indices, uint32_t seq, Deadline deadline,
                                   const std::atomic<bool>& cancelled, std::vector<uint64_t>* words,
                                   uint32_t abort_seq = kAbortSeq);

 private:
  struct Peer;
  UcxNoticeBoard(size_t data_bytes, int notices);
  uint64_t NoticeOffset(int index) const { return (data_bytes_ + 63) / 64 * 64 + index * 8; }
  // Marks lost each connected peer in `peers` (every one when empty) whose
  // process is gone; whether any of them is lost now.
  bool CheckPeerProcesses(const std::set<int>& peers);
  // `first`, a fence when both are given, `after`, then a flush of every peer named.
  static std::shared_ptr<Puts> NewPuts(const std::vector<Piece>& first,
                                       const std::vector<Piece>& after);
  // The batch's puts and flushes (progress thread); on an error no flush
  // started.
  absl::Status IssuePuts(const std::shared_ptr<Puts>& state, const std::vector<Piece>& first,
                         const std::vector<Piece>& after);
  absl::Status PutFenceFlush(const std::vector<Piece>& first, const std::vector<Piece>& after,
                             Deadline deadline);

  const size_t data_bytes_;
  const int notices_;
  std::unique_ptr<UcxMemoryRegion> region_;
  std::unique_ptr<UcxWorker> worker_;
  std::vector<std::unique_ptr<Peer>> peers_;  // progress thread only
  NoticeBoardTarget target_;
  absl::Mutex notify_mu_;  // held across a Notify: the staging word is in flight
  std::atomic<int> awake_holds_{0};
};

}  // namespace mmserve::transfer

#endif  // MMSERVE_TRANSFER_UCX_NOTICE_BOARD_H_
