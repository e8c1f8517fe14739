#include "transfer/embedding_receiver.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "common/logging.h"
#include "transfer/media_crc.h"

namespace mmserve::transfer {

std::string ReceivedMedia::Section(int section) const {
  std::string out = buffered_[section];
  if (tail_ != nullptr) {
    ByteRange r = buffer_->layout().ChunkInfo(tail_->allocation(), 0,
                                              total_tokens_ - buffered_tokens_)[section];
    out.append(reinterpret_cast<const char*>(buffer_->data() + r.offset), r.size);
  }
  return out;
}

std::optional<BlockAllocation> ReceivedMedia::tail_blocks() const {
  if (tail_ == nullptr) return std::nullopt;
  return tail_->allocation();
}

bool EmbeddingReceiver::expecting_data() const {
  if (!quarantine_.empty()) return true;  // a late put may need our progress
  for (const auto& [key, t] : transfers_) {
    if (t.blocks != nullptr && !t.notice && !t.failure) return true;
  }
  return false;
}

void EmbeddingReceiver::Receive(ReceiveRequest request, Done done) {
  Key key{request.request_id, request.image_index};
  if (transfers_.count(key) != 0) {
    done(absl::AlreadyExistsError(
        absl::StrCat("image ", key.second, " of ", key.first, " is already being received")));
    return;
  }
  Transfer& t = transfers_[key];
  t.deadline = Deadline::After(request.timeout);
  t.request = std::move(request);
  t.done = std::move(done);
  t.image.buffer_ = &buffer_;
  TryAllocate(key);
}

void EmbeddingReceiver::Cancel(const std::string& request_id, const std::string& reason) {
  std::vector<Key> keys;
  for (const auto& [key, t] : transfers_) {
    if (key.first == request_id) keys.push_back(key);
  }
  for (const Key& key : keys) Fail(key, absl::CancelledError(reason), true);
}

void EmbeddingReceiver::TryAllocate(const Key& key) {
  auto it = transfers_.find(key);
  if (it == transfers_.end()) return;
  Transfer& t = it->second;
  const uint32_t held = t.image.buffered_tokens_;
  const bool first = held == 0 && t.total_tokens == 0;
  absl::StatusOr<BlockAllocation> a;
  if (first && t.request.known_tokens == 0) {
    a = allocator_.AllocDefault(key.first);
  } else {
    // The remainder, or as much of it as the largest free run holds: a small
    // pool then serves the image in several resumes.
    const uint32_t remaining = (first ? t.request.known_tokens : t.total_tokens) - held;
    const uint32_t fits = allocator_.largest_free_run() * allocator_.block_size();
    a = fits == 0 ? absl::ResourceExhaustedError("embedding buffer full")
                  : allocator_.Alloc(std::min(remaining, fits), key.first);
  }
  if (absl::IsResourceExhausted(a.status())) {
    // Backpressure: wait for blocks (Tick retries) until the deadline.
    if (std::find(waiting_.begin(), waiting_.end(), key) == waiting_.end()) {
      waiting_.push_back(key);
    }
    return;
  }
  if (!a.ok()) {
    Fail(key, a.status(), true);
    return;
  }
  t.blocks = std::make_shared<BlockLease>(allocator_, *a, key.first);
  t.handed_out = false;
  t.data_in = false;
  t.data_crc.reset();
  t.notice.reset();
  const std::string sender = t.request.sender;
  t.reads = link_.data_path() == DataPath::kGet && link_.CanRead(sender);
  if (!t.reads) {
    const uint64_t tag = ChunkTag(key.first, key.second, held, 0);
    const ChunkRanges local = buffer_.layout().ChunkInfo(*a, 0, a->num_tokens);
    const TransferLink::ExpectId expect = link_.ExpectChunk(
        sender, local, tag, [this, key](absl::Status s, std::optional<ChunkDataCrc> crc) {
          OnDataIn(key, s, std::move(crc));
        });
    // `done` may have run inline (put path, or a failed post): look again.
    it = transfers_.find(key);
    if (it == transfers_.end() || it->second.failure) return;
    if (expect != 0) it->second.expect = expect;
  }
  const bool reads = it->second.reads;

  v1::EmbeddingAllocation wire;
  wire.set_start_block(a->start_block);
  wire.set_num_blocks(a->num_blocks);
  wire.set_num_tokens(a->num_tokens);
  absl::Status sent;
  if (held == 0) {
    v1::EmbeddingTransferInit init;
    init.set_request_id(key.first);
    init.set_image_index(key.second);
    *init.mutable_allocation() = wire;
    init.set_timeout_ms(static_cast<uint32_t>(
        std::max<int64_t>(1, absl::ToInt64Milliseconds(it->second.deadline.Remaining()))));
    init.set_receiver_reads(reads);
    sent = link_.SendInit(sender, init);
  } else {
    v1::EmbeddingTransferResume resume;
    resume.set_request_id(key.first);
    resume.set_image_index(key.second);
    *resume.mutable_allocation() = wire;
    resume.set_sent_tokens(held);
    resume.set_receiver_reads(reads);
    sent = link_.SendResume(sender, resume);
  }
  if (!sent.ok()) {
    Fail(key, sent, false);
    return;
  }
  it->second.handed_out = true;
}

void EmbeddingReceiver::OnNotice(const std::string& peer, const v1::EmbeddingChunkNotice& notice) {
  Key key{notice.request_id(), notice.image_index()};
  // Any notice (they follow the writes they report; FAILED ones follow the
  // sender's last write) ends the quarantine of this transfer's blocks.
  quarantine_.erase(
      std::remove_if(quarantine_.begin(), quarantine_.end(),
                     [&](const Quarantined& q) { return q.key == key && q.sender == peer; }),
      quarantine_.end());
  auto it = transfers_.find(key);
  if (it == transfers_.end() || it->second.request.sender != peer || it->second.failure) {
    return;  // late notice of a transfer that already ended here
  }
  Transfer& t = it->second;
  if (notice.status() == v1::TRANSFER_STATUS_FAILED) {
    Fail(key, absl::UnavailableError(absl::StrCat("sender failed: ", notice.error())), false,
         /*sender_stopped=*/true);
    return;
  }
  if (t.blocks == nullptr || t.notice || notice.offset_tokens() != t.image.buffered_tokens_) {
    Fail(key, absl::InternalError("chunk notice out of order"), true);
    return;
  }
  t.notice = notice;
  if (t.reads) {
    ReadChunk(key);
    return;
  }
  MaybeProcess(key);
}

void EmbeddingReceiver::ReadChunk(const Key& key) {
  Transfer& t = transfers_.find(key)->second;
  const v1::EmbeddingChunkNotice& notice = *t.notice;
  const BlockAllocation blocks = t.blocks->allocation();
  const uint32_t n = notice.num_tokens();
  if (!notice.has_source() || n == 0 || n > blocks.num_tokens) {
    Fail(key, absl::InternalError("chunk notice without a readable source"), true);
    return;
  }
  const BlockAllocation source{notice.source().start_block(), notice.source().num_blocks(),
                               notice.source().num_tokens()};
  absl::StatusOr<ChunkDataCrc> crc =
      link_.ReadChunk(t.request.sender, source, notice.offset_tokens(), n,
                      buffer_.layout().ChunkInfo(blocks, 0, n));
  if (!crc.ok()) {
    Fail(key, crc.status(), true);
    return;
  }
  ++chunks_read_;
  t.data_in = true;
  t.data_crc = *std::move(crc);
  MaybeProcess(key);
}

void EmbeddingReceiver::OnDataIn(const Key& key, absl::Status status,
                                 std::optional<ChunkDataCrc> crc) {
  auto it = transfers_.find(key);
  if (it == transfers_.end()) return;
  Transfer& t = it->second;
  t.expect.reset();
  if (t.failure) {
    Release(it, *t.failure);
    return;
  }
  if (!status.ok()) {
    Fail(key, status, true);
    return;
  }
  t.data_in = true;
  t.data_crc = std::move(crc);
  MaybeProcess(key);
}

void EmbeddingReceiver::MaybeProcess(const Key& key) {
  auto it = transfers_.find(key);
  if (it == transfers_.end()) return;
  Transfer& t = it->second;
  if (!t.notice || !t.data_in) return;
  const v1::EmbeddingChunkNotice notice = *t.notice;
  const BlockAllocation blocks = t.blocks->allocation();
  const uint32_t n = notice.num_tokens();
  const uint32_t end = notice.offset_tokens() + n;
  const bool last = notice.status() == v1::TRANSFER_STATUS_SUCCESS;
  if (n == 0 || n > blocks.num_tokens || end > notice.total_tokens() ||
      last != (end == notice.total_tokens()) ||
      (t.total_tokens != 0 && t.total_tokens != notice.total_tokens())) {
    Fail(key, absl::InternalError("chunk notice does not fit the allocation"), true);
    return;
  }
  const ChunkRanges ranges = buffer_.layout().ChunkInfo(blocks, 0, n);
  absl::StatusOr<uint32_t> computed = ChunkCrc(t, blocks, n);
  if (!computed.ok()) {
    Fail(key, computed.status(), true);
    return;
  }
  const uint32_t crc = *computed;
  AuxRecord aux;
  std::memcpy(&aux, buffer_.data() + ranges[kAux].offset, sizeof(aux));
  if (crc != notice.crc32c() || aux.total_tokens != static_cast<int32_t>(notice.total_tokens()) ||
      aux.image_index != static_cast<int32_t>(key.second)) {
    Fail(key,
         absl::DataLossError(absl::StrCat("chunk at token ", notice.offset_tokens(), " of ",
                                          key.first, ": crc32c ", crc, " != ", notice.crc32c(),
                                          " or aux mismatch")),
         true);
    return;
  }
  t.total_tokens = notice.total_tokens();
  t.image.total_tokens_ = t.total_tokens;
  ++t.image.num_chunks_;
  if (t.request.on_chunk) t.request.on_chunk(notice);
  if (transfers_.find(key) == transfers_.end()) return;  // the hook cancelled it
  if (last) {
    if (t.reads) {
      // The sender may free its blocks now.
      v1::EmbeddingTransferDone read;
      read.set_request_id(key.first);
      read.set_image_index(key.second);
      if (absl::Status s = link_.SendDone(t.request.sender, read); !s.ok()) {
        LOG(WARNING) << "done for " << key.first << "/" << key.second << ": " << s;
      }
    }
    t.image.tail_ = std::move(t.blocks);
    Transfer done = std::move(it->second);
    transfers_.erase(it);
    done.done(std::move(done.image));
    return;
  }
  // Keep the chunk, free its blocks, and ask for the rest.
  for (int s = 0; s < kNumSections; ++s) {
    t.image.buffered_[s].append(reinterpret_cast<const char*>(buffer_.data() + ranges[s].offset),
                                ranges[s].size);
  }
  t.image.buffered_tokens_ = end;
  t.blocks.reset();
  t.notice.reset();
  t.data_in = false;
  TryAllocate(key);
}

absl::StatusOr<uint32_t> EmbeddingReceiver::ChunkCrc(const Transfer& t,
                                                     const BlockAllocation& blocks,
                                                     uint32_t n) const {
  const ChunkRanges ranges = buffer_.layout().ChunkInfo(blocks, 0, n);
  if (!t.data_crc) return ChunkRangesCrc(buffer_, ranges);
  const size_t token_bytes = buffer_.layout().TokenBytes(kEmbedding);
  const uint32_t piece = ChunkPieceTokens(token_bytes, link_.data_path());
  uint32_t crc = 0;
  for (size_t j = 0; j < t.data_crc->pieces.size(); ++j) {
    const auto [length, piece_crc] = t.data_crc->pieces[j];
    const uint32_t begin = std::min<uint64_t>(n, j * piece);
    const uint32_t end = std::min<uint64_t>(n, (j + 1) * piece);
    if (length != size_t{end - begin} * token_bytes) {
      return absl::DataLossError(absl::StrCat("embedding piece ", j, " of ", t.request.request_id,
                                              " carried ", length, " bytes, expected ",
                                              size_t{end - begin} * token_bytes));
    }
    crc = Crc32cCombine(crc, piece_crc, length);
  }
  if (size_t{n} > size_t{piece} * t.data_crc->pieces.size()) {
    return absl::DataLossError("chunk longer than its pieces");
  }
  for (int s = kFillId; s < kNumSections; ++s) {
    crc = Crc32cExtend(crc, buffer_.data() + ranges[s].offset, ranges[s].size);
  }
  return crc;
}

void EmbeddingReceiver::OnPeerFailed(const std::string& peer, const absl::Status& status) {
  std::vector<Key> keys;
  for (const auto& [key, t] : transfers_) {
    if (t.request.sender == peer) keys.push_back(key);
  }
  for (const Key& key : keys) Fail(key, status, false);
}

void EmbeddingReceiver::Tick() {
  std::vector<Key> expired;
  for (const auto& [key, t] : transfers_) {
    if (!t.failure && t.deadline.Expired()) expired.push_back(key);
  }
  for (const Key& key : expired) {
    Fail(key,
         absl::DeadlineExceededError(
             absl::StrCat("embedding receive of ", key.first, "/", key.second, " timed out")),
         true);
  }
  for (auto q = quarantine_.begin(); q != quarantine_.end();) {
    if (!q->until.Expired()) {
      ++q;
      continue;
    }
    LOG(WARNING) << "freeing quarantined blocks of " << q->key.first << "/" << q->key.second
                 << ": no word from sender " << q->sender << " within " << quarantine_limit_;
    q = quarantine_.erase(q);
  }
  const uint64_t generation = allocator_.FreeGeneration();
  if (waiting_.empty() || generation == seen_free_generation_) return;
  seen_free_generation_ = generation;
  std::deque<Key> retry;
  retry.swap(waiting_);
  for (const Key& key : retry) TryAllocate(key);  // re-queues itself when still full
}

void EmbeddingReceiver::Shutdown(const absl::Status& status) {
  std::vector<Key> keys;
  for (const auto& [key, t] : transfers_) keys.push_back(key);
  for (const Key& key : keys) Fail(key, status, false);
  quarantine_.clear();
}

void EmbeddingReceiver::Fail(const Key& key, absl::Status status, bool notify_peer,
                             bool sender_stopped) {
  auto it = transfers_.find(key);
  if (it == transfers_.end()) return;
  Transfer& t = it->second;
  if (!t.failure) t.failure = status;
  if (link_.data_path() != DataPath::kTag && !t.reads && t.blocks != nullptr && t.handed_out &&
      !t.notice && !sender_stopped) {
    // The sender may be writing into these blocks right now (cma/posix puts
    // cannot be revoked): keep them out of the pool until it says it stopped.
    quarantine_.push_back(
        {key, t.request.sender, std::move(t.blocks), Deadline::After(quarantine_limit_)});
  }
  waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), key), waiting_.end());
  if (notify_peer) {
    v1::EmbeddingTransferCancel cancel;
    cancel.set_request_id(key.first);
    cancel.set_reason(std::string(status.message()));
    (void)link_.SendCancel(t.request.sender, cancel);
  }
  if (t.expect) {
    // Receives may still write into our blocks: free them once cancelled.
    link_.CancelExpect(*t.expect);
    return;
  }
  Release(it, *t.failure);
}

void EmbeddingReceiver::Release(std::map<Key, Transfer>::iterator it, absl::Status status) {
  Transfer t = std::move(it->second);
  transfers_.erase(it);
  t.blocks.reset();
  t.image.tail_.reset();
  t.done(status);
}

}  // namespace mmserve::transfer
