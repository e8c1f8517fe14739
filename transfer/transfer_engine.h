// The embedding transfer engine of one process: UCX context, worker and its
// progress thread, the registered embedding buffer and its block allocator,
// endpoints to peers, and both protocol halves (EmbeddingSender for the
// encoder role, EmbeddingReceiver for the language role).
//
//   ASSIGN_OR_RETURN(auto engine, TransferEngine::Create({.instance_id = "prefill-0",
//       .profile = TransportProfile::kShm, .layout = {.hidden_size = 3584}}));
//   // exchange engine->local_info() with the peer (gRPC Connect; a pipe in tests)
//   RETURN_IF_ERROR(engine->Connect(encoder_info));
//   engine->Receive({.request_id = "r1", .sender = "encoder-0"}, [](auto image) {...});
//
// Control messages (init, resume, cancel, chunk notices) travel as UCX active
// messages carrying serialized transfer.proto messages; the header is the
// sending instance id. Chunk data moves per profile: kShm puts into the
// receiver's buffer, which UCX allocated as a shared-memory segment the
// sender maps, so each put is one memcpy (into registered private memory UCX
// 1.13 would emulate puts with active messages: two copies, ~3x slower here);
// kGet (the kShm default) turns that around: the receiver maps the sender's
// segment and copies each chunk out itself, checksumming as it copies, so the
// bytes are read once, by the core that keeps them (see DataPath);
// kTcp uses tagged sends into receives the receiver posted on its blocks
// (emulated puts over tcp are ~100x slower in UCX 1.13). Both profiles must
// match on both ends. On every path the embedding moves in pieces (see
// ChunkPieceTokens) that the receiver checksums as they land, so verifying a
// chunk overlaps writing it: on kTag and kPut the progress thread checksums
// each piece as it lands, on kGet the progress thread and a checksum thread
// copy and checksum alternate pieces. The progress
// thread never sleeps while a chunk is in flight (UCX 1.13 emulated RMA needs
// the target's progress and does not wake an armed worker).
//
// Thread-safety: every public method is thread-safe; callbacks run on the
// progress thread and must not block. Lock order: UcxWorker::mu_ and
// BlockAllocator::mu_ are leaves, never held together. ReceivedMedia and
// allocations must not outlive the engine.
#ifndef MMSERVE_TRANSFER_TRANSFER_ENGINE_H_
#define MMSERVE_TRANSFER_TRANSFER_ENGINE_H_

#include <map>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "proto/registry.pb.h"
#include "transfer/block_allocator.h"
#include "transfer/checksum_worker.h"
#include "transfer/embedding_buffer.h"
#include "transfer/embedding_receiver.h"
#include "transfer/embedding_sender.h"
#include "transfer/media_crc.h"
#include "transfer/transfer_link.h"
#include "transfer/ucx_context.h"
#include "transfer/ucx_endpoint.h"
#include "transfer/ucx_memory.h"
#include "transfer/ucx_worker.h"

namespace mmserve::transfer {

struct TransferEngineOptions {
  std::string instance_id;
  TransportProfile profile = TransportProfile::kShm;
  EmbeddingLayout layout;
  // Blocks a receive takes when the image length is unknown.
  uint32_t default_num_blocks = 8;
  // Data path override (benchmarks); default kGet on shm, kTag on tcp.
  std::optional<DataPath> data_path;
  // Put path: how long blocks of a failed receive stay out of the pool while
  // the sender may still write them (see EmbeddingReceiver).
  absl::Duration quarantine_limit = absl::Seconds(1);
  UcxWorkerOptions worker;
  // The buffer's memory, lent (at least layout.total_bytes(), 64-byte
  // aligned, outliving the engine), or null: UCX allocates it. Lent memory
  // is registered as it is: a peer's kPut into it is emulated by UCX (kGet,
  // the shm default, copies into it directly).
  uint8_t* buffer_memory = nullptr;
};

class TransferEngine : private TransferLink {
 public:
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<TransferEngine>> Create(
      const TransferEngineOptions& options);
  ~TransferEngine() override;
  TransferEngine(const TransferEngine&) = delete;
  TransferEngine& operator=(const TransferEngine&) = delete;

  // What a peer needs to reach this engine (its Connect argument).
  const v1::ConnectRequest& local_info() const { return local_info_; }
  // Creates the endpoint to `peer` (and unpacks its buffer's rkey); control
  // messages are accepted only from connected peers (the services call this
  // from their gRPC Connect, behind the internal plane's checks). Replaces
  // an earlier connection of the same instance id.
  [[nodiscard]] absl::Status Connect(const v1::ConnectRequest& peer);

  // Whether `peer`'s buffer is mapped here (shared memory, ucp_rkey_ptr):
  // then puts to it are plain memcpys (kPut) and this engine reads chunks out
  // of it (kGet); otherwise UCX emulates puts and kGet falls back to kPut.
  [[nodiscard]] absl::StatusOr<bool> DirectPuts(const std::string& peer);

  // Encoder role: offers an image whose sections are already in `image.blocks`.
  // `crc` is the image's MediaCrc if the producer has it (computed while it
  // wrote the bytes, or earlier for the same bytes in the same blocks);
  // otherwise Publish computes it on the calling thread.
  void Publish(PublishedMedia image, EmbeddingSender::Done done,
               std::optional<MediaCrc> crc = std::nullopt);
  // Language role: receives an image into this engine's buffer.
  void Receive(ReceiveRequest request, EmbeddingReceiver::Done done);
  // Language role: stops the receives of `request_id` here and at the sender.
  void Cancel(const std::string& request_id, const std::string& reason);

  struct Counts {
    size_t sending = 0;             // sender transfers alive
    size_t receiving = 0;           // receiver transfers alive
    size_t waiting_for_blocks = 0;  // receives queued on a full pool
    size_t quarantined = 0;         // block runs held for a sender that may still write
    uint64_t chunks_read = 0;       // chunks this receiver copied out of senders' buffers (kGet)
  };
  Counts counts();

  BlockAllocator& allocator() { return *allocator_; }
  EmbeddingBuffer& buffer() { return *buffer_; }
  DataPath data_path() const override { return data_path_; }
  const std::string& instance_id() const { return options_.instance_id; }

 private:
  struct Peer {
    std::unique_ptr<UcxEndpoint> ep;
    std::unique_ptr<UcxRemoteKey> rkey;  // the peer's buffer (kPut, kGet)
    bool direct_puts = false;            // rkey maps the peer's buffer here
    // Where the peer's buffer (offset 0) is mapped here, when direct_puts.
    const uint8_t* mapped = nullptr;
    EmbeddingLayout layout;
    uint64_t section_base[kNumSections] = {};
    std::optional<absl::Status> failure;
  };
  enum AmId : uint16_t { kAmInit = 1, kAmResume = 2, kAmCancel = 3, kAmNotice = 4, kAmDone = 5 };
  static constexpr int kNumAmIds = 5;

  explicit TransferEngine(const TransferEngineOptions& options);
  absl::Status Init();
  absl::Status RegisterAmHandler(AmId id);
  static ucs_status_t OnAm(void* arg, const void* header, size_t header_length, void* data,
                           size_t length, const ucp_am_recv_param_t* param);
  void Dispatch(AmId id, const std::string& peer, const std::string& payload);
  absl::StatusOr<Peer*> LivePeer(const std::string& peer);
  absl::Status SendControl(const std::string& peer, AmId id,
                           const google::protobuf::MessageLite& message);
  // Marks `peer` failed, force-closes its endpoint, and fails its transfers.
  void FailPeer(const std::string& peer, const absl::Status& status);

  // TransferLink (progress thread).
  absl::Status SendInit(const std::string& peer, const v1::EmbeddingTransferInit& m) override;
  absl::Status SendResume(const std::string& peer, const v1::EmbeddingTransferResume& m) override;
  absl::Status SendCancel(const std::string& peer, const v1::EmbeddingTransferCancel& m) override;
  absl::Status SendNotice(const std::string& peer, const v1::EmbeddingChunkNotice& m) override;
  absl::Status SendDone(const std::string& peer, const v1::EmbeddingTransferDone& m) override;
  absl::Status WriteChunk(const std::string& peer, const ChunkRanges& local,
                          const BlockAllocation& remote, uint64_t tag_base, Done done) override;
  ExpectId ExpectChunk(const std::string& peer, const ChunkRanges& local, uint64_t tag_base,
                       ExpectDone done) override;
  // WriteChunk's two data paths: tagged sends (kTag), or puts + flushes +
  // landed messages (kPut, kGet).
  void SendChunk(Peer& peer, const ChunkRanges& local, const BlockAllocation& remote,
                 uint64_t tag_base, Done done);
  void PutChunk(Peer& peer, const ChunkRanges& local, const BlockAllocation& remote,
                uint64_t tag_base, Done done);
  // ExpectChunk's state, and one tagged receive of it: section `index`
  // (1..3) or piece index - kNumSections, into [into, into + size); the
  // piece's bytes are at `piece` (kTag: into; kPut: where it was put).
  struct ChunkExpect;
  struct ChunkPart {
    int index;
    void* into;
    size_t size;
    uint64_t tag;
    const uint8_t* piece;
  };
  void PostChunkPart(ExpectId id, const std::shared_ptr<ChunkExpect>& expect,
                     const ChunkPart& part);
  void OnChunkPart(ExpectId id, const std::shared_ptr<ChunkExpect>& expect, const ChunkPart& part,
                   absl::Status st, size_t length);
  void CancelExpect(ExpectId id) override;
  bool CanRead(const std::string& peer) override;
  absl::StatusOr<ChunkDataCrc> ReadChunk(const std::string& peer, const BlockAllocation& source,
                                         uint32_t offset, uint32_t n,
                                         const ChunkRanges& local) override;
  void AbortPeer(const std::string& peer, const absl::Status& why) override;

  const TransferEngineOptions options_;
  const DataPath data_path_;
  std::unique_ptr<UcxContext> context_;
  std::unique_ptr<BlockAllocator> allocator_;
  std::unique_ptr<UcxMemoryRegion> region_;  // owns buffer_'s memory
  std::unique_ptr<EmbeddingBuffer> buffer_;
  std::unique_ptr<UcxWorker> worker_;
  // The second core of a chunk read (kGet).
  std::unique_ptr<ChecksumWorker> checksum_;
  v1::ConnectRequest local_info_;
  // Progress thread only, from here on.
  std::unique_ptr<EmbeddingSender> sender_;
  std::unique_ptr<EmbeddingReceiver> receiver_;
  std::map<std::string, std::unique_ptr<Peer>> peers_;
  // Outstanding tag receives of each ExpectChunk.
  std::map<ExpectId, std::map<int, void*>> expects_;
  ExpectId next_expect_ = 1;
  // Context for each registered AM id's callback.
  struct AmArg {
    TransferEngine* engine;
    AmId id;
  };
  AmArg am_args_[kNumAmIds];
};

}  // namespace mmserve::transfer

#endif  // MMSERVE_TRANSFER_TRANSFER_ENGINE_H_
