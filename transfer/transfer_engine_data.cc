// TransferEngine's wire operations: control messages as active messages and
// the two chunk data paths (put + flush, or tagged send/receive).
#include <algorithm>
#include <memory>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "transfer/transfer_engine.h"
#include "transfer/ucx_request.h"

namespace mmserve::transfer {
namespace {

// Joins `count` completions into one `done` carrying the first error.
class Join {
 public:
  Join(int count, TransferLink::Done done) : remaining_(count), done_(std::move(done)) {}
  void Complete(const absl::Status& status) {
    if (!status.ok() && status_.ok()) status_ = status;
    if (--remaining_ == 0) done_(status_);
  }

 private:
  int remaining_;
  absl::Status status_;
  TransferLink::Done done_;
};

}  // namespace

absl::Status TransferEngine::SendControl(const std::string& name, AmId id,
                                         const google::protobuf::MessageLite& message) {
  ASSIGN_OR_RETURN(Peer * peer, LivePeer(name));
  // Header and payload must stay valid until the send completes.
  auto header = std::make_shared<std::string>(options_.instance_id);
  auto payload = std::make_shared<std::string>(message.SerializeAsString());
  ucp_ep_h ep = peer->ep->get();
  StartUcxOp(
      [&](const ucp_request_param_t& p) {
        ucp_request_param_t q = p;
        q.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
        q.flags = UCP_AM_SEND_FLAG_EAGER;
        return ucp_am_send_nbx(ep, id, header->data(), header->size(), payload->data(),
                               payload->size(), &q);
      },
      [header, payload, id, name](absl::Status s) {
        if (!s.ok()) LOG(WARNING) << "control message " << id << " to " << name << ": " << s;
      });
  return absl::OkStatus();
}

absl::Status TransferEngine::SendInit(const std::string& peer, const v1::EmbeddingTransferInit& m) {
  return SendControl(peer, kAmInit, m);
}
absl::Status TransferEngine::SendResume(const std::string& peer,
                                        const v1::EmbeddingTransferResume& m) {
  return SendControl(peer, kAmResume, m);
}
absl::Status TransferEngine::SendCancel(const std::string& peer,
                                        const v1::EmbeddingTransferCancel& m) {
  return SendControl(peer, kAmCancel, m);
}
absl::Status TransferEngine::SendNotice(const std::string& peer,
                                        const v1::EmbeddingChunkNotice& m) {
  return SendControl(peer, kAmNotice, m);
}

absl::Status TransferEngine::WriteChunk(const std::string& name, const ChunkRanges& local,
                                        const BlockAllocation& remote, uint64_t tag_base,
                                        Done done) {
  ASSIGN_OR_RETURN(Peer * peer, LivePeer(name));
  const uint32_t n = static_cast<uint32_t>(local[kFillId].size / sizeof(int32_t));
  if (n > remote.num_tokens ||
      size_t{remote.start_block} + remote.num_blocks > peer->layout.num_blocks) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk of ", n, " tokens does not fit the receiver's allocation"));
  }
  ucp_ep_h ep = peer->ep->get();
  if (data_path_ == DataPath::kTag) {
    // Sections 1..3 as one message each; the embedding as pieces (see
    // ChunkPieceTokens), as many as the receiver's allocation has.
    const size_t token_bytes = options_.layout.TokenBytes(kEmbedding);
    const uint32_t piece = ChunkPieceTokens(token_bytes);
    const uint32_t pieces = (remote.num_tokens + piece - 1) / piece;
    auto join = std::make_shared<Join>(kNumSections - 1 + pieces, std::move(done));
    auto send = [&](const uint8_t* src, size_t size, uint64_t tag) {
      StartUcxOp(
          [&](const ucp_request_param_t& p) { return ucp_tag_send_nbx(ep, src, size, tag, &p); },
          [join](absl::Status st) { join->Complete(st); });
    };
    for (int s = kFillId; s < kNumSections; ++s) {
      send(buffer_->data() + local[s].offset, local[s].size, tag_base + s);
    }
    for (uint32_t j = 0; j < pieces; ++j) {
      const uint32_t begin = std::min(n, j * piece), end = std::min(n, (j + 1) * piece);
      send(buffer_->data() + local[kEmbedding].offset + size_t{begin} * token_bytes,
           size_t{end - begin} * token_bytes, tag_base + (uint64_t{j * piece} << 2));
    }
    return absl::OkStatus();
  }
  // Put path: four puts, then a flush; remote completion = flush completion.
  const ChunkRanges remote_ranges = peer->layout.ChunkInfo(remote, 0, n);
  auto join = std::make_shared<Join>(kNumSections + 1, std::move(done));
  ucp_rkey_h rkey = peer->rkey->get();
  for (int s = 0; s < kNumSections; ++s) {
    const void* src = buffer_->data() + local[s].offset;
    const uint64_t dst =
        peer->section_base[s] + remote_ranges[s].offset - peer->layout.SectionOffset(s);
    StartUcxOp(
        [&](const ucp_request_param_t& p) {
          return ucp_put_nbx(ep, src, local[s].size, dst, rkey, &p);
        },
        [join](absl::Status st) { join->Complete(st); });
  }
  StartUcxOp([&](const ucp_request_param_t& p) { return ucp_ep_flush_nbx(ep, &p); },
             [join](absl::Status st) { join->Complete(st); });
  return absl::OkStatus();
}

TransferLink::ExpectId TransferEngine::ExpectChunk(const std::string& peer,
                                                   const ChunkRanges& local, uint64_t tag_base,
                                                   ExpectDone done) {
  if (data_path_ == DataPath::kPut) {
    done(absl::OkStatus(), std::nullopt);  // the notice follows the flush: nothing to post
    return 0;
  }
  const ExpectId id = next_expect_++;
  const size_t token_bytes = options_.layout.TokenBytes(kEmbedding);
  const uint32_t piece = ChunkPieceTokens(token_bytes);
  const uint32_t tokens = static_cast<uint32_t>(local[kEmbedding].size / token_bytes);
  const uint32_t pieces = (tokens + piece - 1) / piece;
  struct State {
    int remaining;
    absl::Status status;
    ChunkDataCrc crc;
    ExpectDone done;
    void Complete(const absl::Status& s) {
      if (!s.ok() && status.ok()) status = s;
      if (--remaining == 0) {
        if (status.ok()) {
          done(status, std::move(crc));
        } else {
          done(status, std::nullopt);
        }
      }
    }
  };
  auto state = std::make_shared<State>();
  state->remaining = kNumSections - 1 + pieces;
  state->crc.pieces.resize(pieces);
  state->done = std::move(done);
  // Receive `index` (section 1..3, or kNumSections + piece) into [dst, dst + size).
  auto post = [&](int index, uint8_t* dst, size_t size, uint64_t tag) {
    void* request = StartUcxTagRecv(
        [&](const ucp_request_param_t& p) {
          return ucp_tag_recv_nbx(worker_->get(), dst, size, tag, ~uint64_t{0}, &p);
        },
        [this, id, index, dst, state](absl::Status st, size_t length) {
          auto it = expects_.find(id);
          if (it != expects_.end()) {
            it->second.erase(index);
            if (it->second.empty()) expects_.erase(it);
          }
          if (!st.ok() || index < kNumSections) {
            state->Complete(st);
            return;
          }
          // A piece landed: checksum it on the checksum thread while UCX
          // moves the next one; the result comes back to this thread.
          const size_t j = index - kNumSections;
          checksum_->Submit(dst, length, [this, state, j, length](uint32_t crc) {
            worker_->Post([state, j, length, crc] {
              state->crc.pieces[j] = {length, crc};
              state->Complete(absl::OkStatus());
            });
          });
        });
    if (request != nullptr) expects_[id][index] = request;
  };
  for (int s = kFillId; s < kNumSections; ++s) {
    post(s, buffer_->data() + local[s].offset, local[s].size, tag_base + s);
  }
  for (uint32_t j = 0; j < pieces; ++j) {
    const uint32_t begin = j * piece, end = std::min(tokens, begin + piece);
    post(kNumSections + static_cast<int>(j),
         buffer_->data() + local[kEmbedding].offset + size_t{begin} * token_bytes,
         size_t{end - begin} * token_bytes, tag_base + (uint64_t{begin} << 2));
  }
  auto it = expects_.find(id);
  if (it != expects_.end() && it->second.empty()) expects_.erase(it);
  return expects_.count(id) != 0 ? id : 0;
}

void TransferEngine::CancelExpect(ExpectId id) {
  auto it = expects_.find(id);
  if (it == expects_.end()) return;
  // Copy: cancelling may complete requests, which edits expects_.
  std::map<int, void*> requests = it->second;
  for (auto& [section, request] : requests) {
    auto again = expects_.find(id);
    if (again == expects_.end() || again->second.count(section) == 0) continue;
    ucp_request_cancel(worker_->get(), request);
  }
}

}  // namespace mmserve::transfer
