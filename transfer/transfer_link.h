// The seam between the protocol state machines and the UCX engine.
//
// EmbeddingSender and EmbeddingReceiver (the embedding protocol's state machines) see the
// wire only through TransferLink: control messages out, chunk data moved or
// expected. Control messages in arrive through SenderControl and
// ReceiverControl. In this package TransferEngine implements the link with UCX
// active messages carrying the serialized transfer.proto messages; in the
// services init/resume/cancel arrive over gRPC (Encoder service) and are fed
// to the same SenderControl methods.
//
// Ordering contract: WriteChunk's `done` runs only once
// the chunk is remotely complete (puts + flush, or completed two-sided sends),
// and the sender sends its EmbeddingChunkNotice only after that. On the tag
// data path the receiver additionally waits for its own receives. When the
// receiver reads (kGet), the notice comes first and carries where the chunk
// is; the data is complete once the receiver's own ReadChunk returned.
//
// Everything here runs on the engine's progress thread.
#ifndef MMSERVE_TRANSFER_TRANSFER_LINK_H_
#define MMSERVE_TRANSFER_TRANSFER_LINK_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/transfer.pb.h"
#include "transfer/block_allocator.h"
#include "transfer/embedding_buffer.h"

namespace mmserve::transfer {

namespace v1 = ::mmserve::internal::v1;

// How chunk bytes move. kPut: the sender puts into the receiver's registered
// buffer, flushes, then notifies. kTag: the receiver posts tagged receives into
// its allocation, the sender sends the four sections as tagged messages.
// kGet: the receiver copies the chunk out of the sender's buffer itself,
// checksumming as it copies (one pass over the bytes, on the core that goes on
// to use them), when that buffer is mapped into its address space (same host
// and IPC namespace; ucp_rkey_ptr); with a sender it cannot map it falls back
// to kPut for that transfer. The receiver chooses per transfer (init/resume
// receiver_reads); senders follow whatever it asks.
enum class DataPath { kPut, kTag, kGet };
const char* DataPathName(DataPath path);
// "put", "tag" or "get"; anything else is nullopt.
std::optional<DataPath> ParseDataPath(const std::string& name);

// Tag of one section of the chunk starting at `offset_tokens` of an image.
uint64_t ChunkTag(const std::string& request_id, uint32_t image_index, uint32_t offset_tokens,
                  int section);

// Control messages the receiver sends to the sender.
class SenderControl {
 public:
  virtual ~SenderControl() = default;
  virtual void OnInit(const std::string& peer, const v1::EmbeddingTransferInit& init) = 0;
  virtual void OnResume(const std::string& peer, const v1::EmbeddingTransferResume& resume) = 0;
  virtual void OnCancel(const std::string& peer, const v1::EmbeddingTransferCancel& cancel) = 0;
  virtual void OnDone(const std::string& peer, const v1::EmbeddingTransferDone& done) = 0;
};

// Control messages the sender sends to the receiver.
class ReceiverControl {
 public:
  virtual ~ReceiverControl() = default;
  virtual void OnNotice(const std::string& peer, const v1::EmbeddingChunkNotice& notice) = 0;
};

// Every data path moves a chunk's embedding section as pieces of
// ChunkPieceTokens tokens, so the receiver checksums piece i while piece i+1
// is in flight: on kTag each piece is its own tagged message; on kPut each is
// a put, a flush, then an 8-byte tagged "landed" message with its byte count;
// kGet reads kPut's pieces, alternately on two threads.
// Both ends derive the pieces from the receiver's allocation: piece j covers
// tokens [j * p, (j + 1) * p) of it, clipped to the chunk (trailing pieces may
// be empty), and is tagged ChunkTag(..., chunk offset + j * p, kEmbedding).
// Pieces are smaller on kPut, where a piece costs a flush of a few us but the
// receiver's checksum of the last one is the tail of every chunk; tcp
// messages want to be large.
inline constexpr size_t kTagPieceBytes = size_t{2} << 20;
inline constexpr size_t kPutPieceBytes = size_t{1} << 20;
uint32_t ChunkPieceTokens(size_t embedding_token_bytes, DataPath path);

// What the link learned of a chunk's bytes as they landed: CRC32C
// and length of each embedding piece, in order. The receiver checks the
// lengths against the notice and combines the CRCs instead of re-reading.
struct ChunkDataCrc {
  std::vector<std::pair<size_t, uint32_t>> pieces;  // (bytes received, crc32c)
};

class TransferLink {
 public:
  using Done = std::function<void(absl::Status)>;
  using ExpectDone = std::function<void(absl::Status, std::optional<ChunkDataCrc>)>;
  // A handle to cancel an expected chunk's receives.
  using ExpectId = uint64_t;

  virtual ~TransferLink() = default;
  virtual DataPath data_path() const = 0;

  virtual absl::Status SendInit(const std::string& peer, const v1::EmbeddingTransferInit& m) = 0;
  virtual absl::Status SendResume(const std::string& peer,
                                  const v1::EmbeddingTransferResume& m) = 0;
  virtual absl::Status SendCancel(const std::string& peer,
                                  const v1::EmbeddingTransferCancel& m) = 0;
  virtual absl::Status SendNotice(const std::string& peer, const v1::EmbeddingChunkNotice& m) = 0;
  virtual absl::Status SendDone(const std::string& peer, const v1::EmbeddingTransferDone& m) = 0;

  // Sender: writes `local` (ranges of the sender's buffer) into tokens
  // [0, n) of `remote` in the peer's buffer, under `tag` + section. `done`
  // runs once, on remote completion or failure; an error return means `done`
  // will not run.
  virtual absl::Status WriteChunk(const std::string& peer, const ChunkRanges& local,
                                  const BlockAllocation& remote, uint64_t tag_base, Done done) = 0;
  // Receiver: readies `local` (ranges of this receive buffer) for the chunk
  // tagged `tag_base`. `done` runs when every piece landed (kTag: and the
  // other sections) and was checksummed. Returns an id for CancelExpect (0
  // when `done` already ran).
  virtual ExpectId ExpectChunk(const std::string& peer, const ChunkRanges& local, uint64_t tag_base,
                               ExpectDone done) = 0;
  // Cancels the receives of ExpectChunk; its `done` still runs (CANCELLED).
  virtual void CancelExpect(ExpectId id) = 0;
  // Receiver (kGet): whether `peer`'s buffer is mapped here, so ReadChunk works.
  virtual bool CanRead(const std::string& peer) = 0;
  // Receiver (kGet): copies tokens [offset, offset + n) of `source` (blocks of
  // the peer's buffer) into `local` (ranges of this buffer for n tokens),
  // checksumming the embedding piece by piece as it copies (pieces as on
  // kPut). Returns when done; an error leaves `local` partly written.
  virtual absl::StatusOr<ChunkDataCrc> ReadChunk(const std::string& peer,
                                                 const BlockAllocation& source, uint32_t offset,
                                                 uint32_t n, const ChunkRanges& local) = 0;
  // Gives up on a peer whose operations hang (shm has no error detection):
  // force-closes its endpoint so outstanding operations complete with errors.
  virtual void AbortPeer(const std::string& peer, const absl::Status& why) = 0;
};

}  // namespace mmserve::transfer

#endif  // MMSERVE_TRANSFER_TRANSFER_LINK_H_
