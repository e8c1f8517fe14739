// The embedding transfer protocol's control messages (init, resume, cancel, done and
// chunk notices) against the real EmbeddingSender, EmbeddingReceiver and
// BlockAllocators, over a TransferLink that moves bytes with memcpy and
// applies the engine's checks on allocations from the wire
// (EmbeddingLayout::FitsChunk). The input is a program: publish and receive
// images, deliver, drop or inject messages (hostile offsets, lengths, block
// runs, token counts, statuses), complete or fail data movement, tick,
// cancel, lose peers. Properties:
//  - nothing is read or written outside either buffer (ChunkInfo CHECKs and
//    ASan), and no chunk lands outside the sender's or receiver's pool;
//  - every Publish and Receive callback runs exactly once;
//  - an image that arrives OK holds exactly the bytes the sender published;
//  - after both sides shut down and the link drained, both allocators have
//    every block back (no leak, no double free).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "common/crc32c.h"
#include "fuzz/fuzz_check.h"
#include "fuzz/fuzz_input.h"
#include "transfer/block_allocator.h"
#include "transfer/embedding_buffer.h"
#include "transfer/embedding_receiver.h"
#include "transfer/embedding_sender.h"
#include "transfer/transfer_link.h"

namespace mmserve::transfer {
namespace {

// Large enough embeddings that chunks span several pieces (ChunkPieceTokens:
// 64 tokens on put/get, 128 on tag), small pools so that they fill up.
constexpr EmbeddingLayout kSenderLayout{
    .block_size = 8, .num_blocks = 24, .hidden_size = 8192, .dtype_bytes = 2};
constexpr EmbeddingLayout kReceiverLayout{
    .block_size = 8, .num_blocks = 16, .hidden_size = 8192, .dtype_bytes = 2};
const char* const kSenderName = "encoder";
const char* const kReceiverName = "language";

using Message =
    std::variant<v1::EmbeddingTransferInit, v1::EmbeddingTransferResume,
                 v1::EmbeddingTransferCancel, v1::EmbeddingTransferDone, v1::EmbeddingChunkNotice>;

bool Inside(const ChunkRanges& ranges, const EmbeddingBuffer& buffer) {
  for (const ByteRange& r : ranges) {
    if (r.offset > buffer.size() || r.size > buffer.size() - r.offset) return false;
  }
  return true;
}

// One side's link. Writes and reads reach the other side's buffer directly.
class FakeLink : public TransferLink {
 public:
  FakeLink(DataPath path, EmbeddingBuffer& local) : path_(path), local_(local) {}
  void set_peer(EmbeddingBuffer* peer) { peer_ = peer; }
  void set_can_read(bool can) { can_read_ = can; }

  DataPath data_path() const override { return path_; }
  absl::Status SendInit(const std::string&, const v1::EmbeddingTransferInit& m) override {
    return Send(m);
  }
  absl::Status SendResume(const std::string&, const v1::EmbeddingTransferResume& m) override {
    return Send(m);
  }
  absl::Status SendCancel(const std::string&, const v1::EmbeddingTransferCancel& m) override {
    return Send(m);
  }
  absl::Status SendNotice(const std::string&, const v1::EmbeddingChunkNotice& m) override {
    return Send(m);
  }
  absl::Status SendDone(const std::string&, const v1::EmbeddingTransferDone& m) override {
    return Send(m);
  }

  absl::Status WriteChunk(const std::string&, const ChunkRanges& local,
                          const BlockAllocation& remote, uint64_t, Done done) override {
    FUZZ_CHECK(Inside(local, local_)) << "sender reads outside its buffer";
    const uint32_t n = static_cast<uint32_t>(local[kFillId].size / sizeof(int32_t));
    if (!peer_->layout().FitsChunk(remote, 0, n)) {  // as TransferEngine::WriteChunk
      return absl::InvalidArgumentError("chunk does not fit the receiver's allocation");
    }
    const ChunkRanges dst = peer_->layout().ChunkInfo(remote, 0, n);
    FUZZ_CHECK(Inside(dst, *peer_)) << "write outside the receiver's buffer";
    for (int s = 0; s < kNumSections; ++s) {
      FUZZ_CHECK(dst[s].size == local[s].size);
      std::memcpy(peer_->data() + dst[s].offset, local_.data() + local[s].offset, local[s].size);
    }
    written[dst[kFillId].offset] = n;
    writes.push_back(std::move(done));
    return absl::OkStatus();
  }

  ExpectId ExpectChunk(const std::string&, const ChunkRanges& local, uint64_t,
                       ExpectDone done) override {
    FUZZ_CHECK(Inside(local, local_)) << "receive outside the receiver's buffer";
    const ExpectId id = next_expect_++;
    expects[id] = {local, std::move(done)};
    return id;
  }
  void CancelExpect(ExpectId id) override {
    auto it = expects.find(id);
    if (it == expects.end()) return;
    cancelled.push_back(std::move(it->second.done));  // runs later, as UCX completes it
    expects.erase(it);
  }
  bool CanRead(const std::string&) override { return can_read_; }

  absl::StatusOr<ChunkDataCrc> ReadChunk(const std::string&, const BlockAllocation& source,
                                         uint32_t offset, uint32_t n,
                                         const ChunkRanges& local) override {
    FUZZ_CHECK(Inside(local, local_)) << "read into memory outside the receiver's buffer";
    if (!peer_->layout().FitsChunk(source, offset, n)) {  // as TransferEngine::ReadChunk
      return absl::InvalidArgumentError("chunk source outside the sender's buffer");
    }
    const ChunkRanges src = peer_->layout().ChunkInfo(source, offset, n);
    FUZZ_CHECK(Inside(src, *peer_)) << "read outside the sender's buffer";
    for (int s = 0; s < kNumSections; ++s) {
      if (src[s].size != local[s].size) return absl::InvalidArgumentError("sizes differ");
    }
    for (int s = 0; s < kNumSections; ++s) {
      std::memcpy(local_.data() + local[s].offset, peer_->data() + src[s].offset, src[s].size);
    }
    return PieceCrcs(local, n);
  }
  void AbortPeer(const std::string&, const absl::Status& why) override {
    for (Done& d : writes) failed_writes.push_back({std::move(d), why});
    writes.clear();
  }

  // The pieces' CRCs of `n` tokens at `local`, as the engine reports them.
  ChunkDataCrc PieceCrcs(const ChunkRanges& local, uint32_t n) const {
    const size_t token_bytes = local_.layout().TokenBytes(kEmbedding);
    const uint32_t piece = ChunkPieceTokens(token_bytes, path_);
    ChunkDataCrc crc;
    for (uint32_t begin = 0; begin < n || begin == 0; begin += piece) {
      const uint32_t end = std::min(n, begin + piece);
      const size_t bytes = size_t{end - begin} * token_bytes;
      crc.pieces.push_back(
          {bytes, Crc32c(local_.data() + local[kEmbedding].offset + begin * token_bytes, bytes)});
      if (n == 0) break;
    }
    return crc;
  }

  struct Expect {
    ChunkRanges local;
    ExpectDone done;
  };
  std::deque<Message> outbox;
  std::deque<Done> writes;
  std::deque<std::pair<Done, absl::Status>> failed_writes;
  std::map<ExpectId, Expect> expects;
  std::deque<ExpectDone> cancelled;
  // Tokens of the last chunk written at each fill-id offset of the peer.
  std::map<size_t, uint32_t> written;

 private:
  absl::Status Send(Message m) {
    outbox.push_back(std::move(m));
    return absl::OkStatus();
  }

  const DataPath path_;
  EmbeddingBuffer& local_;
  EmbeddingBuffer* peer_ = nullptr;
  bool can_read_ = true;
  ExpectId next_expect_ = 1;
};

uint8_t EmbeddingByte(const std::string& req, uint32_t index, uint32_t token) {
  return static_cast<uint8_t>(req.back() * 13 + index * 7 + token * 31);
}

// The bytes an image's `section` holds when published by WriteImage.
std::string Expected(const std::string& req, uint32_t index, uint32_t total, int section) {
  std::string out;
  for (uint32_t t = 0; t < total; ++t) {
    if (section == kEmbedding) {
      out.append(kSenderLayout.TokenBytes(kEmbedding), EmbeddingByte(req, index, t));
    } else if (section == kFillId || section == kMrope) {
      const int32_t v = static_cast<int32_t>(t);
      for (int i = 0; i < (section == kFillId ? 1 : 3); ++i) {
        out.append(reinterpret_cast<const char*>(&v), sizeof(v));
      }
    } else {
      const AuxRecord aux{static_cast<int32_t>(total), static_cast<int32_t>(index), 0};
      out.append(reinterpret_cast<const char*>(&aux), sizeof(aux));
    }
  }
  return out;
}

void WriteImage(EmbeddingBuffer& buffer, const BlockAllocation& blocks, const std::string& req,
                uint32_t index) {
  for (int s = 0; s < kNumSections; ++s) {
    const std::string bytes = Expected(req, index, blocks.num_tokens, s);
    const ByteRange r = buffer.layout().ChunkInfo(blocks, 0, blocks.num_tokens)[s];
    std::memcpy(buffer.data() + r.offset, bytes.data(), bytes.size());
  }
}

// Small values mostly (they hit the interesting edges), any 32-bit value now and then.
uint32_t Number(fuzz::FuzzInput& in) {
  const uint8_t b = in.Byte();
  return b & 0x80 ? in.U32() : b % 40;
}

class Harness {
 public:
  explicit Harness(DataPath path)
      : sender_alloc_({.block_size = 8, .num_blocks = 24, .default_num_blocks = 2}),
        receiver_alloc_({.block_size = 8, .num_blocks = 16, .default_num_blocks = 2}),
        sender_buf_(kSenderLayout),
        receiver_buf_(kReceiverLayout),
        sender_link_(path, sender_buf_),
        receiver_link_(path, receiver_buf_),
        sender_(std::make_unique<EmbeddingSender>(sender_link_, sender_buf_, sender_alloc_)),
        receiver_(std::make_unique<EmbeddingReceiver>(receiver_link_, receiver_buf_,
                                                      receiver_alloc_, absl::ZeroDuration())) {
    sender_link_.set_peer(&receiver_buf_);
    receiver_link_.set_peer(&sender_buf_);
  }

  void Step(fuzz::FuzzInput& in);
  void Finish();

 private:
  std::string Req(fuzz::FuzzInput& in) { return std::string("r") + char('0' + in.Byte() % 3); }
  v1::EmbeddingAllocation Allocation(fuzz::FuzzInput& in) {
    v1::EmbeddingAllocation a;
    a.set_start_block(Number(in));
    a.set_num_blocks(Number(in));
    a.set_num_tokens(Number(in));
    return a;
  }
  void Publish(fuzz::FuzzInput& in);
  void Receive(fuzz::FuzzInput& in);
  void DeliverToSender(const Message& m);
  void DeliverToReceiver(const Message& m);
  void CompleteExpect(fuzz::FuzzInput& in);
  void Drain();

  BlockAllocator sender_alloc_;
  BlockAllocator receiver_alloc_;
  EmbeddingBuffer sender_buf_;
  EmbeddingBuffer receiver_buf_;
  FakeLink sender_link_;
  FakeLink receiver_link_;
  std::unique_ptr<EmbeddingSender> sender_;
  std::unique_ptr<EmbeddingReceiver> receiver_;
  // Callbacks: key -> times run (must end at exactly 1 per call).
  std::map<int, int> publish_done_;
  std::map<int, int> receive_done_;
  int next_call_ = 0;
  std::map<std::pair<std::string, uint32_t>, uint32_t> published_;  // key -> tokens
  std::vector<ReceivedMedia> images_;
  int images_ok_ = 0;
};

void Harness::Publish(fuzz::FuzzInput& in) {
  const std::string req = Req(in);
  const uint32_t index = in.Byte() % 2;
  const uint32_t tokens = 1 + in.Byte() % 160;
  absl::StatusOr<BlockAllocation> blocks = sender_alloc_.Alloc(tokens, req);
  if (!blocks.ok()) return;
  WriteImage(sender_buf_, *blocks, req, index);
  const int call = next_call_++;
  publish_done_[call] = 0;
  if (!published_.count({req, index})) published_[{req, index}] = tokens;
  const absl::Duration keep = in.Bool() ? absl::ZeroDuration() : absl::Hours(1);
  sender_->Publish({.request_id = req, .image_index = index, .blocks = *blocks, .keep_for = keep},
                   [this, call](absl::Status) { ++publish_done_[call]; });
}

void Harness::Receive(fuzz::FuzzInput& in) {
  ReceiveRequest r;
  r.request_id = Req(in);
  r.image_index = in.Byte() % 2;
  r.sender = in.Byte() % 8 == 0 ? "elsewhere" : kSenderName;
  const uint8_t known = in.Byte();
  auto it = published_.find({r.request_id, r.image_index});
  r.known_tokens = known % 3 == 0                             ? 0
                   : known % 3 == 1 && it != published_.end() ? it->second
                                                              : known % 200;
  r.timeout = in.Bool() ? absl::ZeroDuration() : absl::Hours(1);
  const int call = next_call_++;
  receive_done_[call] = 0;
  const std::string req = r.request_id;
  const uint32_t index = r.image_index;
  receiver_->Receive(std::move(r), [this, call, req, index](absl::StatusOr<ReceivedMedia> image) {
    ++receive_done_[call];
    if (!image.ok()) {
      if (std::getenv("FUZZ_VERBOSE") != nullptr) {
        std::fprintf(stderr, "receive %s/%u: %s\n", req.c_str(), index,
                     image.status().ToString().c_str());
      }
      return;
    }
    auto pub = published_.find({req, index});
    FUZZ_CHECK(pub != published_.end()) << "an image nobody published arrived: " << req;
    for (int s = 0; s < kNumSections; ++s) {
      FUZZ_CHECK(image->Section(s) == Expected(req, index, image->total_tokens(), s))
          << "image " << req << "/" << index << " arrived with other bytes in section " << s;
    }
    ++images_ok_;
    images_.push_back(*std::move(image));
  });
}

void Harness::DeliverToSender(const Message& m) {
  if (auto* init = std::get_if<v1::EmbeddingTransferInit>(&m)) {
    sender_->OnInit(kReceiverName, *init);
  } else if (auto* resume = std::get_if<v1::EmbeddingTransferResume>(&m)) {
    sender_->OnResume(kReceiverName, *resume);
  } else if (auto* cancel = std::get_if<v1::EmbeddingTransferCancel>(&m)) {
    sender_->OnCancel(kReceiverName, *cancel);
  } else if (auto* done = std::get_if<v1::EmbeddingTransferDone>(&m)) {
    sender_->OnDone(kReceiverName, *done);
  }
}

void Harness::DeliverToReceiver(const Message& m) {
  if (auto* notice = std::get_if<v1::EmbeddingChunkNotice>(&m)) {
    receiver_->OnNotice(kSenderName, *notice);
  }
}

void Harness::CompleteExpect(fuzz::FuzzInput& in) {
  auto& expects = receiver_link_.expects;
  const uint8_t which = in.Byte();
  const uint8_t mode = in.Byte();
  if (expects.empty()) return;
  auto it = expects.begin();
  std::advance(it, which % expects.size());
  FakeLink::Expect e = std::move(it->second);
  expects.erase(it);
  const uint32_t tokens = static_cast<uint32_t>(e.local[kFillId].size / sizeof(int32_t));
  switch (mode % 4) {
    case 0:
      e.done(absl::UnavailableError("receive failed"), std::nullopt);
      break;
    case 1: {  // hostile piece lengths
      ChunkDataCrc crc;
      for (int i = in.Byte() % 4; i > 0; --i) crc.pieces.push_back({Number(in), in.U32()});
      e.done(absl::OkStatus(), crc);
      break;
    }
    default: {  // what landed: the pieces' CRCs of the chunk the sender wrote there
      auto w = sender_link_.written.find(e.local[kFillId].offset);
      const uint32_t n = w != sender_link_.written.end() ? std::min(tokens, w->second) : tokens;
      e.done(absl::OkStatus(), receiver_link_.PieceCrcs(e.local, n));
      break;
    }
  }
}

void Harness::Step(fuzz::FuzzInput& in) {
  switch (in.Byte() % 16) {
    case 0:
      Publish(in);
      break;
    case 1:
      Receive(in);
      break;
    case 2:
    case 3: {  // deliver (or drop) the oldest message
      const bool to_sender = in.Bool();
      const bool lost = in.Byte() % 8 == 0;
      FakeLink& from = to_sender ? receiver_link_ : sender_link_;
      if (from.outbox.empty()) break;
      Message m = std::move(from.outbox.front());
      from.outbox.pop_front();
      if (lost) break;
      if (to_sender) {
        DeliverToSender(m);
      } else {
        DeliverToReceiver(m);
      }
      break;
    }
    case 4: {
      const bool fail = in.Byte() % 4 == 0;
      if (!sender_link_.writes.empty()) {
        auto done = std::move(sender_link_.writes.front());
        sender_link_.writes.pop_front();
        done(fail ? absl::UnavailableError("put failed") : absl::OkStatus());
      }
      break;
    }
    case 5:
      CompleteExpect(in);
      break;
    case 6: {  // hostile init
      v1::EmbeddingTransferInit m;
      m.set_request_id(Req(in));
      m.set_image_index(Number(in) % 3);
      *m.mutable_allocation() = Allocation(in);
      m.set_timeout_ms(in.Bool() ? 0 : 3600000);
      m.set_receiver_reads(in.Bool());
      sender_->OnInit(in.Bool() ? kReceiverName : "intruder", m);
      break;
    }
    case 7: {  // hostile resume
      v1::EmbeddingTransferResume m;
      m.set_request_id(Req(in));
      m.set_image_index(Number(in) % 3);
      *m.mutable_allocation() = Allocation(in);
      m.set_sent_tokens(Number(in));
      m.set_receiver_reads(in.Bool());
      sender_->OnResume(in.Bool() ? kReceiverName : "intruder", m);
      break;
    }
    case 8: {  // hostile cancel or done
      const std::string peer = in.Bool() ? kReceiverName : "intruder";
      if (in.Bool()) {
        v1::EmbeddingTransferCancel m;
        m.set_request_id(Req(in));
        m.set_reason("fuzz");
        sender_->OnCancel(peer, m);
      } else {
        v1::EmbeddingTransferDone m;
        m.set_request_id(Req(in));
        m.set_image_index(Number(in) % 3);
        sender_->OnDone(peer, m);
      }
      break;
    }
    case 9: {  // hostile notice
      v1::EmbeddingChunkNotice m;
      m.set_request_id(Req(in));
      m.set_image_index(Number(in) % 3);
      m.set_offset_tokens(Number(in));
      m.set_num_tokens(Number(in));
      m.set_total_tokens(Number(in));
      m.set_crc32c(in.U32());
      m.set_status(static_cast<v1::TransferStatus>(in.Byte() % 4));
      if (in.Bool()) *m.mutable_source() = Allocation(in);
      receiver_->OnNotice(in.Bool() ? kSenderName : "intruder", m);
      break;
    }
    case 10:
      sender_->Tick();
      receiver_->Tick();
      break;
    case 11:
      receiver_->Cancel(Req(in), "client went away");
      break;
    case 12:
      if (in.Bool()) {
        sender_->OnPeerFailed(kReceiverName, absl::UnavailableError("peer lost"));
      } else {
        receiver_->OnPeerFailed(kSenderName, absl::UnavailableError("peer lost"));
      }
      break;
    case 13: {
      const uint8_t which = in.Byte();
      if (!images_.empty()) images_.erase(images_.begin() + which % images_.size());
      break;
    }
    case 14:
      receiver_link_.set_can_read(in.Bool());
      break;
    default:  // completions the link owes: failed writes, cancelled receives
      Drain();
      break;
  }
}

void Harness::Drain() {
  while (!sender_link_.failed_writes.empty() || !receiver_link_.cancelled.empty()) {
    while (!sender_link_.failed_writes.empty()) {
      auto [done, status] = std::move(sender_link_.failed_writes.front());
      sender_link_.failed_writes.pop_front();
      done(status);
    }
    while (!receiver_link_.cancelled.empty()) {
      auto done = std::move(receiver_link_.cancelled.front());
      receiver_link_.cancelled.pop_front();
      done(absl::CancelledError("receive cancelled"), std::nullopt);
    }
  }
}

void Harness::Finish() {
  if (std::getenv("FUZZ_VERBOSE") != nullptr) {
    std::fprintf(stderr, "%zu publishes, %zu receives, %d images arrived intact\n",
                 publish_done_.size(), receive_done_.size(), images_ok_);
  }
  // Engine shutdown: outstanding data movement fails, then both sides stop.
  sender_link_.AbortPeer(kReceiverName, absl::UnavailableError("shutdown"));
  for (auto& [id, e] : receiver_link_.expects)
    receiver_link_.cancelled.push_back(std::move(e.done));
  receiver_link_.expects.clear();
  Drain();
  sender_->Shutdown(absl::CancelledError("shutdown"));
  receiver_->Shutdown(absl::CancelledError("shutdown"));
  Drain();
  images_.clear();
  for (const auto& [call, runs] : publish_done_) {
    FUZZ_CHECK(runs == 1) << "publish callback " << call << " ran " << runs << " times";
  }
  for (const auto& [call, runs] : receive_done_) {
    FUZZ_CHECK(runs == 1) << "receive callback " << call << " ran " << runs << " times";
  }
  FUZZ_CHECK(sender_->num_transfers() == 0) << sender_->num_transfers();
  FUZZ_CHECK(receiver_->num_transfers() == 0) << receiver_->num_transfers();
  sender_.reset();
  receiver_.reset();
  FUZZ_CHECK(sender_alloc_.used_blocks() == 0)
      << sender_alloc_.used_blocks() << " sender blocks leaked";
  FUZZ_CHECK(receiver_alloc_.used_blocks() == 0)
      << receiver_alloc_.used_blocks() << " receiver blocks leaked";
  FUZZ_CHECK(sender_alloc_.num_free_runs() == 1 && receiver_alloc_.num_free_runs() == 1);
}

}  // namespace
}  // namespace mmserve::transfer

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace mmserve::transfer;
  if (size > 2048) return 0;
  mmserve::fuzz::FuzzInput in(data, size);
  const DataPath path = static_cast<DataPath>(in.Byte() % 3);
  Harness h(path);
  for (int steps = 0; !in.empty() && steps < 400; ++steps) h.Step(in);
  h.Finish();
  return 0;
}
