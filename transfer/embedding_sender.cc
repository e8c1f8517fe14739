#include "transfer/embedding_sender.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace mmserve::transfer {
namespace {

constexpr absl::Duration kSenderGrace = absl::Milliseconds(100);

}  // namespace

EmbeddingSender::~EmbeddingSender() {
  // The engine shut down first; whatever is left holds blocks nobody reads.
  for (auto& [key, t] : transfers_) {
    if (t.source) (void)allocator_.Free(*t.source, t.request_id);
  }
}

void EmbeddingSender::Publish(const PublishedMedia& image, Done done, std::optional<MediaCrc> crc) {
  Key key{image.request_id, image.image_index};
  auto it = transfers_.find(key);
  if (it != transfers_.end() && it->second.source) {
    (void)allocator_.Free(image.blocks, image.request_id);
    done(absl::AlreadyExistsError(
        absl::StrCat("image ", image.image_index, " of ", image.request_id, " published twice")));
    return;
  }
  if (it == transfers_.end()) {
    it = transfers_.emplace(key, Transfer{}).first;
    it->second.request_id = image.request_id;
    it->second.image_index = image.image_index;
    it->second.deadline = Deadline::After(image.keep_for);
  }
  it->second.source = image.blocks;
  it->second.crc = crc && crc->image() == image.blocks ? *std::move(crc)
                                                       : MediaCrc::Compute(buffer_, image.blocks);
  it->second.done = std::move(done);
  MaybeStart(key);
}

void EmbeddingSender::OnInit(const std::string& peer, const v1::EmbeddingTransferInit& init) {
  Key key{init.request_id(), init.image_index()};
  auto it = transfers_.find(key);
  if (it != transfers_.end() && !it->second.peer.empty()) {
    LOG(WARNING) << "duplicate init for " << init.request_id() << "/" << init.image_index();
    return;
  }
  if (it == transfers_.end()) {
    it = transfers_.emplace(key, Transfer{}).first;
    it->second.request_id = init.request_id();
    it->second.image_index = init.image_index();
  }
  Transfer& t = it->second;
  t.peer = peer;
  t.reader = init.receiver_reads();
  if (init.allocation().num_tokens() == 0) {
    Fail(key, absl::InvalidArgumentError("init with an empty allocation"), true);
    return;
  }
  t.target = BlockAllocation{init.allocation().start_block(), init.allocation().num_blocks(),
                             init.allocation().num_tokens()};
  t.sent_tokens = 0;
  // The receiver decides timeouts (and cancels); the sender's own deadline,
  // a little later, only frees its blocks when the receiver is gone.
  if (init.timeout_ms() > 0) {
    t.deadline = Deadline::After(absl::Milliseconds(init.timeout_ms()) + kSenderGrace);
  }
  MaybeStart(key);
}

void EmbeddingSender::OnResume(const std::string& peer, const v1::EmbeddingTransferResume& resume) {
  Key key{resume.request_id(), resume.image_index()};
  auto it = transfers_.find(key);
  if (it == transfers_.end() || it->second.peer != peer) {
    // Unknown (expired or cancelled here): tell the receiver instead of
    // letting it wait for its deadline.
    v1::EmbeddingChunkNotice notice;
    notice.set_request_id(resume.request_id());
    notice.set_image_index(resume.image_index());
    notice.set_offset_tokens(resume.sent_tokens());
    notice.set_status(v1::TRANSFER_STATUS_FAILED);
    notice.set_error("resume of a transfer the sender does not hold");
    (void)link_.SendNotice(peer, notice);
    return;
  }
  Transfer& t = it->second;
  if (t.lent) {
    // The receiver read the lent chunk; the resume asks for the next one.
    if (resume.sent_tokens() != t.sent_tokens) {
      Fail(key, absl::FailedPreconditionError("resume out of order"), true);
      return;
    }
    t.lent = false;
    --num_lent_;
  }
  if (t.writing || t.target || !t.source || resume.sent_tokens() >= t.source->num_tokens ||
      resume.allocation().num_tokens() == 0) {
    Fail(key, absl::FailedPreconditionError("resume out of order"), true);
    return;
  }
  t.target = BlockAllocation{resume.allocation().start_block(), resume.allocation().num_blocks(),
                             resume.allocation().num_tokens()};
  t.sent_tokens = resume.sent_tokens();
  t.reader = resume.receiver_reads();
  MaybeStart(key);
}

void EmbeddingSender::OnDone(const std::string& peer, const v1::EmbeddingTransferDone& done) {
  Key key{done.request_id(), done.image_index()};
  auto it = transfers_.find(key);
  // Unknown: the loan already ended here (deadline, cancel); nothing to free.
  if (it == transfers_.end() || it->second.peer != peer) return;
  Transfer& t = it->second;
  if (!t.lent || t.sent_tokens != t.source->num_tokens) {
    Fail(key, absl::FailedPreconditionError("done before the last chunk was lent"), true);
    return;
  }
  Release(it, absl::OkStatus());
}

void EmbeddingSender::OnCancel(const std::string& peer, const v1::EmbeddingTransferCancel& cancel) {
  std::vector<Key> keys;
  for (const auto& [key, t] : transfers_) {
    if (key.first == cancel.request_id() && (t.peer.empty() || t.peer == peer)) {
      keys.push_back(key);
    }
  }
  for (const Key& key : keys) {
    Fail(key, absl::CancelledError(absl::StrCat("cancelled by receiver: ", cancel.reason())),
         /*notify_peer=*/true);  // the acknowledgement the receiver's quarantine waits for
  }
}

void EmbeddingSender::OnPeerFailed(const std::string& peer, const absl::Status& status) {
  std::vector<Key> keys;
  for (const auto& [key, t] : transfers_) {
    if (t.peer == peer) keys.push_back(key);
  }
  for (const Key& key : keys) Fail(key, status, false);
}

void EmbeddingSender::Tick() {
  std::vector<Key> expired;
  for (const auto& [key, t] : transfers_) {
    if (!t.failure && t.deadline.Expired()) expired.push_back(key);
  }
  for (const Key& key : expired) {
    auto it = transfers_.find(key);
    if (it == transfers_.end()) continue;
    absl::Status status = absl::DeadlineExceededError(
        absl::StrCat("embedding send of ", key.first, "/", key.second, " timed out"));
    if (it->second.writing) {
      // UCX still reads our blocks and the peer is not answering: force its
      // endpoint closed so the writes complete (with an error) and we can free.
      it->second.failure = status;
      link_.AbortPeer(it->second.peer, status);
    } else {
      Fail(key, status, true);
    }
  }
}

void EmbeddingSender::Shutdown(const absl::Status& status) {
  std::vector<Key> keys;
  for (const auto& [key, t] : transfers_) keys.push_back(key);
  for (const Key& key : keys) Fail(key, status, false);
}

void EmbeddingSender::MaybeStart(const Key& key) {
  auto it = transfers_.find(key);
  if (it == transfers_.end()) return;
  Transfer& t = it->second;
  if (!t.source || !t.target || t.writing || t.lent || t.failure) return;
  const uint32_t total = t.source->num_tokens;
  const uint32_t n = std::min(total - t.sent_tokens, t.target->num_tokens);
  t.chunk_tokens = n;
  t.chunk_crc = t.crc->Chunk(buffer_, t.sent_tokens, n);
  if (t.reader) {
    Lend(key);
    return;
  }
  const ChunkRanges local = buffer_.layout().ChunkInfo(*t.source, t.sent_tokens, n);
  t.writing = true;
  ++num_writing_;
  absl::Status s =
      link_.WriteChunk(t.peer, local, *t.target, ChunkTag(key.first, key.second, t.sent_tokens, 0),
                       [this, key](absl::Status status) { OnChunkWritten(key, status); });
  if (!s.ok()) {
    auto again = transfers_.find(key);
    if (again != transfers_.end()) {
      again->second.writing = false;
      --num_writing_;
    }
    Fail(key, s, true);
  }
}

void EmbeddingSender::OnChunkWritten(const Key& key, absl::Status status) {
  auto it = transfers_.find(key);
  if (it == transfers_.end()) return;
  Transfer& t = it->second;
  t.writing = false;
  --num_writing_;
  if (t.failure) {
    Release(it, *t.failure);
    return;
  }
  if (!status.ok()) {
    Fail(key, status, true);
    return;
  }
  const bool last = t.sent_tokens + t.chunk_tokens == t.source->num_tokens;
  if (absl::Status s = link_.SendNotice(t.peer, ChunkNotice(key, t)); !s.ok()) {
    Fail(key, s, false);
    return;
  }
  t.sent_tokens += t.chunk_tokens;
  t.target.reset();
  if (last) Release(it, absl::OkStatus());
}

v1::EmbeddingChunkNotice EmbeddingSender::ChunkNotice(const Key& key, const Transfer& t) const {
  const uint32_t total = t.source->num_tokens;
  v1::EmbeddingChunkNotice notice;
  notice.set_request_id(key.first);
  notice.set_image_index(key.second);
  notice.set_offset_tokens(t.sent_tokens);
  notice.set_num_tokens(t.chunk_tokens);
  notice.set_total_tokens(total);
  notice.set_status(t.sent_tokens + t.chunk_tokens == total ? v1::TRANSFER_STATUS_SUCCESS
                                                            : v1::TRANSFER_STATUS_TRANSFERRING);
  notice.set_crc32c(t.chunk_crc);
  return notice;
}

void EmbeddingSender::Lend(const Key& key) {
  Transfer& t = transfers_.find(key)->second;
  v1::EmbeddingChunkNotice notice = ChunkNotice(key, t);
  v1::EmbeddingAllocation* source = notice.mutable_source();
  source->set_start_block(t.source->start_block);
  source->set_num_blocks(t.source->num_blocks);
  source->set_num_tokens(t.source->num_tokens);
  t.lent = true;
  ++num_lent_;
  if (absl::Status s = link_.SendNotice(t.peer, notice); !s.ok()) {
    Fail(key, s, false);
    return;
  }
  t.sent_tokens += t.chunk_tokens;
  t.target.reset();
}

void EmbeddingSender::Fail(const Key& key, absl::Status status, bool notify_peer) {
  auto it = transfers_.find(key);
  if (it == transfers_.end()) return;
  Transfer& t = it->second;
  if (!t.failure) t.failure = status;
  t.notify_peer = t.notify_peer || notify_peer;
  if (!t.writing) Release(it, *t.failure);
}

void EmbeddingSender::Release(std::map<Key, Transfer>::iterator it, absl::Status status) {
  Transfer t = std::move(it->second);
  transfers_.erase(it);
  if (t.lent) --num_lent_;
  if (!status.ok() && t.notify_peer && !t.peer.empty()) {
    // Sent only now that UCX no longer writes into the receiver's blocks: the
    // receiver may free blocks it quarantined for this transfer.
    v1::EmbeddingChunkNotice notice;
    notice.set_request_id(t.request_id);
    notice.set_image_index(t.image_index);
    notice.set_offset_tokens(t.sent_tokens);
    notice.set_status(v1::TRANSFER_STATUS_FAILED);
    notice.set_error(std::string(status.message()));
    (void)link_.SendNotice(t.peer, notice);
  }
  if (t.source) {
    if (absl::Status s = allocator_.Free(*t.source, t.request_id); !s.ok()) LOG(ERROR) << s;
  }
  if (t.done) t.done(status);
}

}  // namespace mmserve::transfer
