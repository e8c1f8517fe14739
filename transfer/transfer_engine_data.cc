// TransferEngine's wire operations: control messages as active messages and
// the two chunk data paths (put + flush, or tagged send/receive).
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
    auto join = std::make_shared<Join>(kNumSections, std::move(done));
    for (int s = 0; s < kNumSections; ++s) {
      const void* src = buffer_->data() + local[s].offset;
      StartUcxOp(
          [&](const ucp_request_param_t& p) {
            return ucp_tag_send_nbx(ep, src, local[s].size, tag_base + s, &p);
          },
          [join](absl::Status st) { join->Complete(st); });
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
                                                   Done done) {
  if (data_path_ == DataPath::kPut) {
    done(absl::OkStatus());  // the notice follows the flush: nothing to post
    return 0;
  }
  const ExpectId id = next_expect_++;
  auto join = std::make_shared<Join>(kNumSections, std::move(done));
  for (int s = 0; s < kNumSections; ++s) {
    void* dst = buffer_->data() + local[s].offset;
    void* request = StartUcxTagRecv(
        [&](const ucp_request_param_t& p) {
          return ucp_tag_recv_nbx(worker_->get(), dst, local[s].size, tag_base + s, ~uint64_t{0},
                                  &p);
        },
        [this, id, s, join](absl::Status st, size_t) {
          auto it = expects_.find(id);
          if (it != expects_.end()) {
            it->second.erase(s);
            if (it->second.empty()) expects_.erase(it);
          }
          join->Complete(st);
        });
    if (request != nullptr) expects_[id][s] = request;
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
