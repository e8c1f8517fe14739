// The receiving half of the embedding transfer protocol (the language side).
//
// Receive() allocates blocks in this process's buffer - exactly the image's
// length when the caller knows it, else the default count - and sends
// init(allocation). When a chunk's notice arrives (after its data is remotely
// complete) the receiver verifies the chunk's CRC32C and aux record. If more
// remain, it keeps the chunk (copied out), frees the blocks, allocates the
// remainder and sends resume(allocation, sent_tokens). The last chunk stays in
// the buffer, owned by the ReceivedMedia. A full pool makes the transfer wait
// for blocks (retried whenever blocks are freed) until its deadline.
//
//   receiver.Receive({.request_id = "r1", .sender = "encoder-0", .known_tokens = 0,
//                     .timeout = absl::Seconds(5)},
//                    [](absl::StatusOr<ReceivedMedia> image) { ... });
//
// Errors: DEADLINE_EXCEEDED (timeout, incl. waiting for blocks), UNAVAILABLE
// (peer lost or the sender failed), DATA_LOSS (checksum or aux mismatch),
// CANCELLED. A failed transfer holds no blocks once its callback ran, except
// on the put data path: blocks the sender was told to write and whose chunk
// notice never came may still receive its (one-sided, unrevocable) writes, so
// they stay quarantined - not reusable - until the sender's FAILED notice or
// any later notice of that transfer says it stopped writing, or at most
// `quarantine_limit` (a sender stops writing by its own deadline, ~100 ms
// after the receiver's).
//
// On the kGet data path the receiver reads chunks itself when it can map the
// sender's buffer (TransferLink::CanRead; asked per init/resume with
// receiver_reads): the notice names the sender's blocks, the receiver copies
// the chunk into its allocation - checksumming as it copies - verifies it, and
// answers with resume, or with done after the last chunk so the sender frees
// its blocks. Nothing writes into its blocks then, so nothing is quarantined.
// With a sender it cannot map it falls back to the put path.
// Not thread-safe: every method runs on the engine's progress thread.
#ifndef MMSERVE_TRANSFER_EMBEDDING_RECEIVER_H_
#define MMSERVE_TRANSFER_EMBEDDING_RECEIVER_H_

#include <array>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "transfer/block_allocator.h"
#include "transfer/embedding_buffer.h"
#include "transfer/transfer_link.h"

namespace mmserve::transfer {

// One fully received image. Earlier chunks are held in memory; the last
// chunk's tokens stay in the receive buffer until this object is destroyed
// (which frees its blocks, from any thread). Must not outlive the engine.
class ReceivedMedia {
 public:
  uint32_t total_tokens() const { return total_tokens_; }
  // Chunks the image arrived in (1 when the first allocation was big enough).
  uint32_t num_chunks() const { return num_chunks_; }
  // Leading tokens held as copies (earlier chunks of a resumed image); the
  // rest are in tail_blocks().
  uint32_t buffered_tokens() const { return buffered_tokens_; }
  // All tokens' bytes of `section`, in token order (a copy).
  std::string Section(int section) const;
  // Blocks of the receive buffer that hold the tail; nullopt after Release.
  std::optional<BlockAllocation> tail_blocks() const;
  // Frees the tail's blocks now.
  void Release() { tail_.reset(); }

 private:
  friend class EmbeddingReceiver;
  const EmbeddingBuffer* buffer_ = nullptr;
  uint32_t total_tokens_ = 0;
  uint32_t num_chunks_ = 0;
  uint32_t buffered_tokens_ = 0;  // tokens [0, buffered) are in buffered_
  std::array<std::string, kNumSections> buffered_;
  std::shared_ptr<BlockLease> tail_;  // tokens [buffered, total)
};

struct ReceiveRequest {
  std::string request_id;
  uint32_t image_index = 0;
  // Instance id of the sender (connected to the engine).
  std::string sender;
  // The image's length in tokens when known (exact allocation), else 0
  // (default allocation, resumes if the image is longer).
  uint32_t known_tokens = 0;
  // The whole transfer, including waiting for blocks, gives up after this.
  absl::Duration timeout = absl::Seconds(10);
  // Observes each verified chunk before the next allocation (tests, metrics).
  std::function<void(const v1::EmbeddingChunkNotice&)> on_chunk;
};

class EmbeddingReceiver : public ReceiverControl {
 public:
  using Done = std::function<void(absl::StatusOr<ReceivedMedia>)>;

  EmbeddingReceiver(TransferLink& link, EmbeddingBuffer& buffer, BlockAllocator& allocator,
                    absl::Duration quarantine_limit = absl::Seconds(1))
      : link_(link), buffer_(buffer), allocator_(allocator), quarantine_limit_(quarantine_limit) {}
  EmbeddingReceiver(const EmbeddingReceiver&) = delete;
  EmbeddingReceiver& operator=(const EmbeddingReceiver&) = delete;

  // Starts receiving; `done` runs once (on the progress thread).
  void Receive(ReceiveRequest request, Done done);
  // Stops every transfer of `request_id` here and on the sender.
  void Cancel(const std::string& request_id, const std::string& reason);

  void OnNotice(const std::string& peer, const v1::EmbeddingChunkNotice& notice) override;
  void OnPeerFailed(const std::string& peer, const absl::Status& status);
  // Deadlines, and retries of transfers waiting for blocks.
  void Tick();
  void Shutdown(const absl::Status& status);

  size_t num_transfers() const { return transfers_.size(); }
  size_t num_waiting_for_blocks() const { return waiting_.size(); }
  // Block runs of failed put-path transfers held until their sender stops.
  size_t num_quarantined() const { return quarantine_.size(); }
  // Chunks read out of senders' buffers so far (kGet).
  uint64_t num_chunks_read() const { return chunks_read_; }
  // Whether some transfer told its sender where to write and awaits the data.
  bool expecting_data() const;

 private:
  using Key = std::pair<std::string, uint32_t>;  // request id, image index
  struct Transfer {
    ReceiveRequest request;
    Done done;
    Deadline deadline = Deadline::Never();
    uint32_t total_tokens = 0;  // from the first notice
    std::shared_ptr<BlockLease> blocks;
    std::optional<TransferLink::ExpectId> expect;  // receives outstanding
    bool handed_out = false;                       // the sender was told to write into `blocks`
    bool reads = false;  // kGet: this chunk is read out of the sender's buffer here
    bool data_in = false;
    std::optional<ChunkDataCrc> data_crc;  // with data_in: the pieces' CRCs
    std::optional<v1::EmbeddingChunkNotice> notice;
    ReceivedMedia image;
    std::optional<absl::Status> failure;
  };

  // Allocates the next chunk's blocks and sends init/resume; queues the
  // transfer in waiting_ when the pool is full.
  void TryAllocate(const Key& key);
  void OnDataIn(const Key& key, absl::Status status, std::optional<ChunkDataCrc> crc);
  // kGet: copies the noticed chunk out of the sender's buffer, then processes it.
  void ReadChunk(const Key& key);
  // CRC32C of the chunk's first `n` tokens in `blocks`, from the pieces'
  // CRCs when the link made them (DATA_LOSS when their lengths do not fit n).
  absl::StatusOr<uint32_t> ChunkCrc(const Transfer& t, const BlockAllocation& blocks,
                                    uint32_t n) const;
  void MaybeProcess(const Key& key);
  // `sender_stopped`: the failure is the sender's FAILED notice, so it no
  // longer writes and nothing needs quarantine.
  void Fail(const Key& key, absl::Status status, bool notify_peer, bool sender_stopped = false);
  void Release(std::map<Key, Transfer>::iterator it, absl::Status status);

  TransferLink& link_;
  EmbeddingBuffer& buffer_;
  BlockAllocator& allocator_;
  std::map<Key, Transfer> transfers_;
  std::deque<Key> waiting_;  // FIFO of transfers waiting for blocks
  struct Quarantined {
    Key key;
    std::string sender;
    std::shared_ptr<BlockLease> blocks;
    Deadline until;
  };
  const absl::Duration quarantine_limit_;
  std::vector<Quarantined> quarantine_;
  uint64_t seen_free_generation_ = 0;
  uint64_t chunks_read_ = 0;
};

}  // namespace mmserve::transfer

#endif  // MMSERVE_TRANSFER_EMBEDDING_RECEIVER_H_
