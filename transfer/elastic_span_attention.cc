#include "transfer/elastic_span_attention.h"

#include <sched.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "common/status_macros.h"

namespace mmserve::transfer {
namespace {

// How long a reply may take to land (the client's own timeout bounds the
// whole query).
constexpr absl::Duration kReplyTimeout = absl::Seconds(2);
// Idle polling rounds (each a round trip through the progress thread)
// before the server thread naps between rounds: a decode step queries every
// layer back to back, so a busy holder answers at once, an idle one costs
// one poll per nap.
constexpr int kSpinRounds = 2000;
constexpr absl::Duration kNap = absl::Microseconds(200);
// A server idle for longer (an instance's, whose lanes stay connected
// between groups) naps longer: a first query after it waits up to this.
constexpr int kLongIdleRounds = 20000;
constexpr absl::Duration kLongNap = absl::Milliseconds(2);

struct QueryHeader {
  uint32_t layer = 0;
  uint16_t rows = 0;
  uint16_t reply = 0;  // the client's reply slot (and notice) for this server
};
static_assert(sizeof(QueryHeader) == 8);

// Bytes of a query with `rows` rows: header, tag slots, q rows.
uint64_t QueryBytes(const ElasticSpanShape& s, int64_t rows) {
  return 8 + s.max_rows * 8 + rows * s.q_width * sizeof(float);
}
uint64_t LseOffset(const ElasticSpanShape& s) { return s.max_rows * s.q_width * sizeof(float); }

// CRC32C of a reply's rows: out, then lse.
uint32_t ReplyCrc(const ElasticSpanShape& s, const uint8_t* reply, int64_t rows) {
  const uint32_t crc = Crc32c(reply, rows * s.q_width * sizeof(float));
  return Crc32cExtend(crc, reply + LseOffset(s), rows * s.heads * sizeof(float));
}

}  // namespace

ElasticSpanServer::ElasticSpanServer(const ElasticSpanShape& shape, int self, Handler handler)
    : shape_(shape), self_(self), handler_(std::move(handler)), served_(shape.parties, 0) {}

absl::StatusOr<std::unique_ptr<ElasticSpanServer>> ElasticSpanServer::Create(
    UcxContext& context, const ElasticSpanShape& shape, int self, Handler handler,
    const UcxWorkerOptions& options) {
  if (self < 0 || self >= shape.parties || shape.max_rows <= 0 || shape.max_rows > 0xffff) {
    return absl::InvalidArgumentError("elastic span server: bad shape");
  }
  std::unique_ptr<ElasticSpanServer> s(new ElasticSpanServer(shape, self, std::move(handler)));
  ASSIGN_OR_RETURN(s->board_, UcxNoticeBoard::Create(
                                  context, shape.parties * shape.InboxBytes() + shape.ReplyBytes(),
                                  shape.parties, options));
  return s;
}

ElasticSpanServer::~ElasticSpanServer() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

absl::Status ElasticSpanServer::Connect(const std::vector<NoticeBoardTarget>& clients) {
  if (static_cast<int>(clients.size()) != shape_.parties) {
    return absl::InvalidArgumentError("elastic span server: one target per party");
  }
  for (int c = 0; c < shape_.parties; ++c) {
    if (c != self_ && !clients[c].worker_address.empty()) RETURN_IF_ERROR(AddClient(c, clients[c]));
  }
  return absl::OkStatus();
}

absl::Status ElasticSpanServer::AddClient(int lane, const NoticeBoardTarget& client) {
  if (lane < 0 || lane >= shape_.parties)
    return absl::InvalidArgumentError("elastic span server: lane");
  absl::MutexLock lock(&mu_);
  clients_.erase(std::remove(clients_.begin(), clients_.end(), lane), clients_.end());
  RETURN_IF_ERROR(board_->ConnectPeer(lane, client));
  if (client.worker_address.empty()) return absl::OkStatus();
  std::vector<uint64_t> word;
  RETURN_IF_ERROR(board_->Read({lane}, &word, /*ignore_lost=*/true));
  served_[lane] = NoticeSeq(word[0]);
  clients_.push_back(lane);
  if (!thread_.joinable()) thread_ = std::thread([this] { Serve(); });
  return absl::OkStatus();
}

void ElasticSpanServer::CountBytes(const WireBytes& bytes) {
  absl::MutexLock lock(&mu_);
  bytes_ = bytes;
}

void ElasticSpanServer::Serve() {
  int idle = 0;
  std::vector<uint64_t> words;
  while (!stop_) {
    bool worked = false;
    if (!ServeRound(words, &worked)) return;  // the worker stopped
    idle = worked ? 0 : std::min(idle + 1, kLongIdleRounds + 1);
    if (idle > kLongIdleRounds) {
      absl::SleepFor(kLongNap);
    } else if (idle > kSpinRounds) {
      absl::SleepFor(kNap);
    } else {
      sched_yield();
    }
  }
}

bool ElasticSpanServer::ServeRound(std::vector<uint64_t>& words, bool* worked) {
  absl::MutexLock lock(&mu_);
  // Lost clients do not stop the others (Answer to one fails alone).
  if (!board_->Read(clients_, &words, /*ignore_lost=*/true).ok()) return false;
  for (size_t i = 0; i < clients_.size(); ++i) {
    const int c = clients_[i];
    const uint32_t seq = NoticeSeq(words[i]);
    if (seq == 0 || seq == kAbortSeq || seq == served_[c]) continue;
    served_[c] = seq;
    *worked = true;
    if (Answer(c, seq, NoticeCrc(words[i])).ok() || board_->PeerLost(c)) continue;
    QueryHeader h;
    std::memcpy(&h, board_->data() + c * shape_.InboxBytes(), sizeof(h));
    if (h.reply >= shape_.parties) continue;
    (void)board_->Notify({c}, h.reply, NoticeWord(kAbortSeq, 0),
                         Deadline::After(absl::Milliseconds(200)));
  }
  return true;
}

absl::Status ElasticSpanServer::Answer(int client, uint32_t seq, uint32_t crc) {
  const uint8_t* inbox = board_->data() + client * shape_.InboxBytes();
  QueryHeader h;
  std::memcpy(&h, inbox, sizeof(h));
  if (h.rows > shape_.max_rows || h.reply >= shape_.parties) {
    return absl::DataLossError("query too long");
  }
  if (Crc32c(inbox, QueryBytes(shape_, h.rows)) != crc) {
    return absl::DataLossError("query failed its CRC32C");
  }
  bytes_.Received(QueryBytes(shape_, h.rows));
  const auto* tags = reinterpret_cast<const uint64_t*>(inbox + 8);
  const auto* q = reinterpret_cast<const float*>(inbox + 8 + shape_.max_rows * 8);
  const uint64_t reply_at = shape_.parties * shape_.InboxBytes();
  uint8_t* reply = board_->data() + reply_at;
  RETURN_IF_ERROR(handler_(static_cast<int>(h.layer), absl::MakeConstSpan(tags, h.rows), q, h.rows,
                           reinterpret_cast<float*>(reply),
                           reinterpret_cast<float*>(reply + LseOffset(shape_))));
  const uint64_t remote = uint64_t{h.reply} * shape_.ReplyBytes();
  const Deadline deadline = Deadline::After(kReplyTimeout);
  RETURN_IF_ERROR(
      board_->PutAndFlush({{client, reply_at, remote, h.rows * shape_.q_width * sizeof(float)},
                           {client, reply_at + LseOffset(shape_), remote + LseOffset(shape_),
                            h.rows * shape_.heads * sizeof(float)}},
                          deadline));
  bytes_.Sent(h.rows * (shape_.q_width + shape_.heads) * sizeof(float));
  return board_->Notify({client}, h.reply, NoticeWord(seq, ReplyCrc(shape_, reply, h.rows)),
                        deadline);
}

UcxSpanPeers::UcxSpanPeers(const ElasticSpanShape& shape, int self, absl::Duration timeout)
    : shape_(shape),
      self_(self),
      timeout_(timeout),
      seq_(static_cast<uint32_t>(absl::ToUnixNanos(absl::Now()) >> 10) | 1) {}

UcxSpanPeers::~UcxSpanPeers() = default;

absl::StatusOr<std::unique_ptr<UcxSpanPeers>> UcxSpanPeers::Create(UcxContext& context,
                                                                   const ElasticSpanShape& shape,
                                                                   int self,
                                                                   const UcxWorkerOptions& options,
                                                                   absl::Duration timeout) {
  if (self < 0 || self >= shape.parties || shape.max_rows <= 0 || shape.max_rows > 0xffff) {
    return absl::InvalidArgumentError("elastic span peers: bad shape");
  }
  std::unique_ptr<UcxSpanPeers> p(new UcxSpanPeers(shape, self, timeout));
  ASSIGN_OR_RETURN(p->board_, UcxNoticeBoard::Create(
                                  context, shape.parties * shape.ReplyBytes() + shape.InboxBytes(),
                                  shape.parties, options));
  return p;
}

absl::Status UcxSpanPeers::Connect(const std::vector<NoticeBoardTarget>& servers) {
  if (static_cast<int>(servers.size()) != shape_.parties) {
    return absl::InvalidArgumentError("elastic span peers: one target per party");
  }
  return board_->Connect(servers, self_);
}

absl::Status UcxSpanPeers::Retarget(int self, const std::vector<NoticeBoardTarget>& servers) {
  if (self < 0 || self >= shape_.parties || static_cast<int>(servers.size()) > shape_.parties) {
    return absl::InvalidArgumentError("elastic span peers: self or servers out of range");
  }
  self_ = self;
  std::vector<NoticeBoardTarget> all = servers;
  all.resize(shape_.parties);
  return Connect(all);
}

void UcxSpanPeers::SetBatch(std::vector<int> members, int self_member,
                            std::vector<uint64_t> row_tags) {
  members_ = std::move(members);
  self_member_ = self_member;
  tags_ = std::move(row_tags);
}

absl::Status UcxSpanPeers::Query(int member, int layer, const float* q, int64_t rows, float* out,
                                 float* lse) {
  if (member < 0 || member >= num_members() || member == self_member_ ||
      rows != static_cast<int64_t>(tags_.size()) || rows > shape_.max_rows) {
    return absl::InvalidArgumentError("elastic span query: bad member or rows");
  }
  const int server = members_[member];
  if (++seq_ == kAbortSeq || seq_ == 0) seq_ = 1;
  const uint32_t seq = seq_;
  const uint64_t staging = shape_.parties * shape_.ReplyBytes();
  uint8_t* query = board_->data() + staging;
  const QueryHeader h{static_cast<uint32_t>(layer), static_cast<uint16_t>(rows),
                      static_cast<uint16_t>(server)};
  std::memcpy(query, &h, sizeof(h));
  std::memcpy(query + 8, tags_.data(), rows * sizeof(uint64_t));
  std::memcpy(query + 8 + shape_.max_rows * 8, q, rows * shape_.q_width * sizeof(float));
  const uint64_t bytes = QueryBytes(shape_, rows);
  const Deadline deadline = Deadline::After(timeout_);
  absl::Status s =
      board_->PutAndFlush({{server, staging, self_ * shape_.InboxBytes(), bytes}}, deadline);
  if (s.ok()) bytes_.Sent(bytes);
  if (s.ok()) s = board_->Notify({server}, self_, NoticeWord(seq, Crc32c(query, bytes)), deadline);
  std::vector<uint64_t> words;
  if (s.ok()) s = board_->Await({server}, seq, deadline, never_, &words);
  const uint8_t* reply = board_->data() + server * shape_.ReplyBytes();
  if (s.ok() && NoticeCrc(words[0]) != ReplyCrc(shape_, reply, rows)) {
    s = absl::DataLossError("a reply failed its CRC32C");
  }
  if (!s.ok()) return absl::Status(s.code(), absl::StrCat("elastic span query: ", s.message()));
  bytes_.Received(rows * (shape_.q_width + shape_.heads) * sizeof(float));
  std::memcpy(out, reply, rows * shape_.q_width * sizeof(float));
  std::memcpy(lse, reply + LseOffset(shape_), rows * shape_.heads * sizeof(float));
  return absl::OkStatus();
}

}  // namespace mmserve::transfer
