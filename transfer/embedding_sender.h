// The sending half of the embedding transfer protocol (the encoder side).
//
// The encoder writes an image's four sections into its own buffer blocks and
// Publish()es them. When the receiver's init arrives (before or after
// Publish), the sender writes as many tokens as fit the receiver's allocation
// - aux carries the true length - and notifies TRANSFERRING (more to come) or
// SUCCESS (last chunk). On resume(allocation, sent_tokens) it continues from
// that offset. Its blocks are freed on success, cancel, failure, peer loss and
// deadline, but never while UCX may still read them. A FAILED notice to the
// receiver goes out only once the sender no longer writes into its blocks
// (it also acknowledges a cancel), so the receiver can free blocks it
// quarantined for a put-path transfer it gave up on.
//
// When the receiver reads (init/resume with receiver_reads, the kGet data
// path) the sender writes nothing: for each chunk it sends the notice at once,
// naming its blocks as the chunk's `source`, and lends the blocks until the
// receiver's resume (it read the chunk and wants the next) or done (it read
// the last). Cancel, failure, peer loss and the deadline end a loan like any
// transfer; the receiver verifies what it read, so a loan ended under it
// shows up there as a checksum error, never as a crash.
//
//   sender.Publish({.request_id = "r1", .image_index = 0, .blocks = a,
//                   .keep_for = absl::Seconds(30)},
//                  [](absl::Status s) { /* SUCCESS, or why the image was dropped */ });
//
// A transfer's state moves forward only:
//   kWaitingInit/kWaitingData -> kWriting -> (kWaitingResume -> kWriting)* -> done,
// with kLent in place of kWriting when the receiver reads.
// Not thread-safe: every method runs on the engine's progress thread.
#ifndef MMSERVE_TRANSFER_EMBEDDING_SENDER_H_
#define MMSERVE_TRANSFER_EMBEDDING_SENDER_H_

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "transfer/block_allocator.h"
#include "transfer/embedding_buffer.h"
#include "transfer/media_crc.h"
#include "transfer/transfer_link.h"

namespace mmserve::transfer {

struct PublishedMedia {
  std::string request_id;
  uint32_t image_index = 0;
  // Blocks of the sender's buffer holding the image, allocated under
  // `request_id`; num_tokens is its length. The sender owns (and frees) them
  // from now on.
  BlockAllocation blocks;
  // The image is dropped if no transfer completes within this time.
  absl::Duration keep_for = absl::Seconds(30);
};

class EmbeddingSender : public SenderControl {
 public:
  using Done = std::function<void(absl::Status)>;

  EmbeddingSender(TransferLink& link, EmbeddingBuffer& buffer, BlockAllocator& allocator)
      : link_(link), buffer_(buffer), allocator_(allocator) {}
  EmbeddingSender(const EmbeddingSender&) = delete;
  EmbeddingSender& operator=(const EmbeddingSender&) = delete;
  ~EmbeddingSender() override;

  // Offers an image for transfer; `done` runs once with OK after the last
  // chunk's notice went out (when the receiver reads: after it said it read
  // the last chunk), or with the reason the image was dropped.
  // `crc` is MediaCrc::Compute of the image's blocks, when the caller made it
  // off the progress thread; else Publish computes it here.
  void Publish(const PublishedMedia& image, Done done, std::optional<MediaCrc> crc = std::nullopt);

  void OnInit(const std::string& peer, const v1::EmbeddingTransferInit& init) override;
  void OnResume(const std::string& peer, const v1::EmbeddingTransferResume& resume) override;
  void OnCancel(const std::string& peer, const v1::EmbeddingTransferCancel& cancel) override;
  void OnDone(const std::string& peer, const v1::EmbeddingTransferDone& done) override;
  // Fails every transfer to `peer` (its endpoint reported an error).
  void OnPeerFailed(const std::string& peer, const absl::Status& status);
  // Expires transfers past their deadline.
  void Tick();
  // Fails everything (engine shutdown).
  void Shutdown(const absl::Status& status);

  size_t num_transfers() const { return transfers_.size(); }
  // Whether UCX is moving a chunk of some transfer now.
  bool writing() const { return num_writing_ != 0; }
  // Whether some receiver may be reading lent blocks now.
  bool lending() const { return num_lent_ != 0; }

 private:
  using Key = std::pair<std::string, uint32_t>;  // request id, image index
  struct Transfer {
    std::string request_id;
    uint32_t image_index = 0;
    std::optional<BlockAllocation> source;  // set by Publish
    std::optional<MediaCrc> crc;            // of `source`, set by Publish
    Done done;
    std::string peer;                       // set by init
    std::optional<BlockAllocation> target;  // receiver's current allocation
    uint32_t sent_tokens = 0;               // offset of the next chunk
    uint32_t chunk_tokens = 0;              // tokens of the chunk being written
    uint32_t chunk_crc = 0;
    bool reader = false;       // the receiver reads the next chunk (receiver_reads)
    bool writing = false;      // UCX may be reading the source blocks
    bool lent = false;         // the receiver may be reading the source blocks
    bool notify_peer = false;  // send a FAILED notice when released
    std::optional<absl::Status> failure;
    Deadline deadline = Deadline::Never();
  };

  void MaybeStart(const Key& key);
  void OnChunkWritten(const Key& key, absl::Status status);
  // The notice of the chunk MaybeStart set up (t.sent_tokens, t.chunk_tokens).
  v1::EmbeddingChunkNotice ChunkNotice(const Key& key, const Transfer& t) const;
  // Receiver reads: sends the notice with the source and lends the blocks.
  void Lend(const Key& key);
  // Fails the transfer and releases it unless UCX still reads its blocks
  // (then on write completion). With `notify_peer`, the release sends the
  // receiver a FAILED notice: a FAILED notice always means "no longer writing".
  void Fail(const Key& key, absl::Status status, bool notify_peer);
  void Release(std::map<Key, Transfer>::iterator it, absl::Status status);

  TransferLink& link_;
  EmbeddingBuffer& buffer_;
  BlockAllocator& allocator_;
  std::map<Key, Transfer> transfers_;
  size_t num_writing_ = 0;  // transfers with `writing` set
  size_t num_lent_ = 0;     // transfers with `lent` set
};

}  // namespace mmserve::transfer

#endif  // MMSERVE_TRANSFER_EMBEDDING_SENDER_H_
