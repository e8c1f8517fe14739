#include "transfer/elastic_endpoint.h"

#include <cstring>
#include <utility>

#include "common/status_macros.h"
#include "transfer/elastic_kv_exchange.h"

namespace mmserve::transfer {
namespace {

constexpr uint16_t kBoards = 3;
constexpr uint32_t kMaxField = 1 << 16;  // a worker address or rkey

template <typename T>
void Put(std::string& out, T v) {
  char bytes[sizeof(T)];
  std::memcpy(bytes, &v, sizeof(T));  // little-endian hosts only (x86-64, aarch64)
  out.append(bytes, sizeof(T));
}

void PutBytes(std::string& out, const std::string& bytes) {
  Put<uint32_t>(out, static_cast<uint32_t>(bytes.size()));
  out += bytes;
}

// Reads the blob front to back; every read checks what is left.
class Reader {
 public:
  explicit Reader(std::string_view blob) : rest_(blob) {}
  template <typename T>
  bool Get(T* v) {
    if (rest_.size() < sizeof(T)) return false;
    std::memcpy(v, rest_.data(), sizeof(T));
    rest_.remove_prefix(sizeof(T));
    return true;
  }
  bool GetBytes(std::string* out) {
    uint32_t n = 0;
    if (!Get(&n) || n > kMaxField || rest_.size() < n) return false;
    out->assign(rest_.data(), n);
    rest_.remove_prefix(n);
    return true;
  }
  bool done() const { return rest_.empty(); }

 private:
  std::string_view rest_;
};

bool GetProcess(Reader& r, ProcessIdentity* p) {
  return r.Get(&p->pid) && r.Get(&p->pid_namespace) && r.Get(&p->start_ticks) &&
         r.GetBytes(&p->boot_id);
}

bool GetBoard(Reader& r, NoticeBoardTarget* t) {
  return r.Get(&t->base_address) && r.Get(&t->notice_offset) && r.GetBytes(&t->worker_address) &&
         r.GetBytes(&t->rkey) && !t->worker_address.empty() && !t->rkey.empty();
}

}  // namespace

std::string EncodeElasticEndpoint(const ElasticEndpoint& e) {
  std::string out;
  Put<uint32_t>(out, kElasticEndpointMagic);
  Put<uint16_t>(out, kElasticEndpointVersion);
  Put<uint16_t>(out, kBoards);
  Put<uint32_t>(out, e.max_prompt_tokens);
  Put<uint32_t>(out, e.kv_width);
  Put<uint32_t>(out, e.max_members);
  Put<int32_t>(out, e.process.pid);
  Put<uint64_t>(out, e.process.pid_namespace);
  Put<uint64_t>(out, e.process.start_ticks);
  PutBytes(out, e.process.boot_id);
  for (const NoticeBoardTarget* t : {&e.exchange, &e.span_inbox, &e.span_reply}) {
    Put<uint64_t>(out, t->base_address);
    Put<uint64_t>(out, t->notice_offset);
    PutBytes(out, t->worker_address);
    PutBytes(out, t->rkey);
  }
  return out;
}

absl::StatusOr<ElasticEndpoint> DecodeElasticEndpoint(std::string_view blob) {
  Reader r(blob);
  uint32_t magic = 0;
  uint16_t version = 0, boards = 0;
  ElasticEndpoint e;
  if (!r.Get(&magic) || magic != kElasticEndpointMagic || !r.Get(&version) || !r.Get(&boards)) {
    return absl::InvalidArgumentError("not an elastic endpoint");
  }
  if (version != kElasticEndpointVersion || boards != kBoards) {
    return absl::InvalidArgumentError("an elastic endpoint of an unknown version");
  }
  if (!r.Get(&e.max_prompt_tokens) || !r.Get(&e.kv_width) || !r.Get(&e.max_members) ||
      !GetProcess(r, &e.process) || !GetBoard(r, &e.exchange) || !GetBoard(r, &e.span_inbox) ||
      !GetBoard(r, &e.span_reply) || !r.done()) {
    return absl::InvalidArgumentError("a malformed elastic endpoint");
  }
  if (e.max_prompt_tokens == 0 || e.kv_width == 0 || e.max_members < 2) {
    return absl::InvalidArgumentError("an elastic endpoint with no room");
  }
  for (NoticeBoardTarget* t : {&e.exchange, &e.span_inbox, &e.span_reply}) t->process = e.process;
  return e;
}

absl::StatusOr<std::unique_ptr<ElasticInstance>> ElasticInstance::Create(
    UcxContext& context, const Options& o, ElasticSpanServer::Handler handler) {
  if (o.max_prompt_tokens == 0 || o.kv_width == 0 || o.q_width <= 0 || o.heads <= 0 ||
      o.max_members < 2) {
    return absl::InvalidArgumentError("elastic instance: bad options");
  }
  std::unique_ptr<ElasticInstance> elastic(new ElasticInstance(o));
  ASSIGN_OR_RETURN(elastic->board_,
                   UcxNoticeBoard::Create(
                       context, UcxElasticExchange::BoardBytes(o.max_prompt_tokens, o.kv_width),
                       UcxElasticExchange::BoardNotices(static_cast<int>(o.max_members)),
                       {.name = o.name + "-elastic-kv"}));
  // One decode row a query: the master steps each elastic request alone.
  const ElasticSpanShape shape{static_cast<int>(o.max_members), 1, o.q_width, o.heads};
  ASSIGN_OR_RETURN(elastic->client_,
                   UcxSpanPeers::Create(context, shape, 0, {.name = o.name + "-elastic-master"},
                                        o.query_timeout));
  ASSIGN_OR_RETURN(elastic->server_,
                   ElasticSpanServer::Create(context, shape, 0, std::move(handler),
                                             {.name = o.name + "-elastic-spans"}));
  elastic->endpoint_ = EncodeElasticEndpoint({.max_prompt_tokens = o.max_prompt_tokens,
                                              .kv_width = o.kv_width,
                                              .max_members = o.max_members,
                                              .process = SelfProcessIdentity(),
                                              .exchange = elastic->board_->target(),
                                              .span_inbox = elastic->server_->target(),
                                              .span_reply = elastic->client_->target()});
  return elastic;
}

}  // namespace mmserve::transfer
