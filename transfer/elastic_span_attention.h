// Decode attention across span holders over UCX (model/elastic.h's
// SpanAttentionPeers): a decode master sends each layer's query rows to the
// instances holding spans of their sequences; each holder's server thread
// answers with its partial attention (output and log-sum-exp).
//
// Parties are numbered 0..parties-1 in the pool; a party may be a server
// (holds spans), a client (masters decode batches) or both (two objects).
//
//   // holder
//   ASSIGN_OR_RETURN(auto server, ElasticSpanServer::Create(*ctx, shape, /*self=*/1,
//       [&](int layer, absl::Span<const uint64_t> tags, const float* q, int64_t rows,
//           float* out, float* lse) { ... PartialAttention over the tagged spans ... },
//       {.name = "span-1"}));
//   // master
//   ASSIGN_OR_RETURN(auto peers, UcxSpanPeers::Create(*ctx, shape, /*self=*/0, {...}, timeout));
//   // exchange targets (party order), then
//   RETURN_IF_ERROR(server->Connect(client_targets));
//   RETURN_IF_ERROR(peers->Connect(server_targets));
//   peers->SetBatch(/*members=*/{1, 0}, /*self member=*/1, row_tags);  // span order
//   RETURN_IF_ERROR(model.ForwardElasticDecode(batch, kv, *peers, &logits));
//
// A query: the client puts {layer, rows, its reply slot}, the rows' tags (which sequence
// each row is, the server's business) and q into its inbox on the server,
// flushes, then a notice {seq, CRC32C}; the server thread checks the CRC,
// calls the handler, puts out and lse into the client's reply inbox, flushes
// and notifies likewise (at the reply slot the query names: the server's
// party index in the client's view). Every wait has the client's timeout;
// a server or client that dies ends the other's wait UNAVAILABLE sooner
// (tcp: UCX's report; shm: its process gone, ucx_notice_board.h).
//
// An instance's server and client (served groups) live as long
// as the instance: parties are then a group's member indices, the server
// takes clients one lane at a time (AddClient: lane = the master's member
// index in its group, reconnected for each group) and the client is moved
// between groups (Retarget).
// Thread-safety: one thread drives a UcxSpanPeers; the server's handler runs
// on the server's own thread, one query at a time, beside whatever else the
// holder runs: it reads only held (immutable) spans, and a ThreadPool it
// uses must not also serve the holder's own steps (one caller per pool).
#ifndef MMSERVE_TRANSFER_ELASTIC_SPAN_ATTENTION_H_
#define MMSERVE_TRANSFER_ELASTIC_SPAN_ATTENTION_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "model/elastic.h"
#include "transfer/ucx_notice_board.h"
#include "transfer/wire_bytes.h"

namespace mmserve::transfer {

struct ElasticSpanShape {
  int parties = 0;
  int64_t max_rows = 0;  // rows of one query
  int64_t q_width = 0;   // heads * head_dim
  int64_t heads = 0;
  uint64_t InboxBytes() const { return 8 + max_rows * 8 + max_rows * q_width * sizeof(float); }
  uint64_t ReplyBytes() const { return max_rows * (q_width + heads) * sizeof(float); }
};

class ElasticSpanServer {
 public:
  // out [rows][q_width] and lse [rows][heads] of q's rows over the spans the
  // tags name (lse -inf, out 0 where none is held here).
  using Handler = std::function<absl::Status(int layer, absl::Span<const uint64_t> tags,
                                             const float* q, int64_t rows, float* out, float* lse)>;
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<ElasticSpanServer>> Create(
      UcxContext& context, const ElasticSpanShape& shape, int self, Handler handler,
      const UcxWorkerOptions& options);
  ~ElasticSpanServer();  // stops the server thread
  ElasticSpanServer(const ElasticSpanServer&) = delete;
  ElasticSpanServer& operator=(const ElasticSpanServer&) = delete;

  const NoticeBoardTarget& target() const { return board_->target(); }
  // The clients' boards (party order; entries of parties that are not
  // clients may be empty), then starts answering.
  [[nodiscard]] absl::Status Connect(const std::vector<NoticeBoardTarget>& clients);
  // Or one client at a time: `client` queries in inbox `lane` from now on
  // (replacing the lane's earlier client; an empty target closes the lane).
  // Starts answering at the first call. Thread-safe.
  [[nodiscard]] absl::Status AddClient(int lane, const NoticeBoardTarget& client);
  // Counts from now on: received = each query accepted (its header, tag
  // slots and q rows: 8 + max_rows x 8 + rows x q_width x 4 bytes), sent =
  // each reply flushed (rows x (q_width + heads) x 4 bytes). Thread-safe.
  void CountBytes(const WireBytes& bytes);

 private:
  ElasticSpanServer(const ElasticSpanShape& shape, int self, Handler handler);
  void Serve();
  // One poll of every lane, answering what came; false once the worker stopped.
  bool ServeRound(std::vector<uint64_t>& words, bool* worked);
  absl::Status Answer(int client, uint32_t seq, uint32_t crc) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const ElasticSpanShape shape_;
  const int self_;
  const Handler handler_;
  std::unique_ptr<UcxNoticeBoard> board_;
  absl::Mutex mu_;
  std::vector<int> clients_ ABSL_GUARDED_BY(mu_);  // connected lanes
  // Per lane, the last query answered; a lane's new client starts from the
  // word its inbox holds then.
  std::vector<uint32_t> served_ ABSL_GUARDED_BY(mu_);
  WireBytes bytes_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> stop_{false};
  std::thread thread_;  // started once, under mu_
};

class UcxSpanPeers : public model::SpanAttentionPeers {
 public:
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<UcxSpanPeers>> Create(
      UcxContext& context, const ElasticSpanShape& shape, int self, const UcxWorkerOptions& options,
      absl::Duration timeout);
  ~UcxSpanPeers() override;

  const NoticeBoardTarget& target() const { return board_->target(); }
  // The servers' boards, party order (entries of non-servers may be empty).
  [[nodiscard]] absl::Status Connect(const std::vector<NoticeBoardTarget>& servers);
  // An instance's client moved to another group: it is party `self` there
  // (its lane on each server) and the servers are `servers` (party order,
  // at most `parties`; the rest are none).
  [[nodiscard]] absl::Status Retarget(int self, const std::vector<NoticeBoardTarget>& servers);
  // The next decode batch: its span holders in span order (parties; this
  // party among them at self_member) and each row's tag.
  void SetBatch(std::vector<int> members, int self_member, std::vector<uint64_t> row_tags);

  int num_members() const override { return static_cast<int>(members_.size()); }
  int self() const override { return self_member_; }
  [[nodiscard]] absl::Status Query(int member, int layer, const float* q, int64_t rows, float* out,
                                   float* lse) override;
  // Counts from now on: sent = each query flushed, received = each reply
  // accepted (the sizes ElasticSpanServer::CountBytes gives). The driving
  // thread.
  void CountBytes(const WireBytes& bytes) { bytes_ = bytes; }

 private:
  UcxSpanPeers(const ElasticSpanShape& shape, int self, absl::Duration timeout);

  const ElasticSpanShape shape_;
  int self_;
  const absl::Duration timeout_;
  std::unique_ptr<UcxNoticeBoard> board_;
  // The last query sent, to any party: starts from the clock, so a new
  // client of a lane never repeats the word its predecessor left there.
  uint32_t seq_;
  std::vector<int> members_;
  int self_member_ = 0;
  std::vector<uint64_t> tags_;
  WireBytes bytes_;
  std::atomic<bool> never_{false};
};

}  // namespace mmserve::transfer

#endif  // MMSERVE_TRANSFER_ELASTIC_SPAN_ATTENTION_H_
