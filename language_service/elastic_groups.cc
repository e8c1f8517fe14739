// ElasticGroups: creation, the span server's answers, release and the idle
// lease (the prefill and the decode are in elastic_groups_prefill.cc and
// elastic_groups_decode.cc).
#include "language_service/elastic_groups.h"

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "common/crc32c.h"
#include "common/status_macros.h"
#include "language_service/elastic_groups_internal.h"
#include "language_service/elastic_plan.h"
#include "language_service/kv_bytes_moved.h"
#include "model/cpu/split_attention.h"

namespace mmserve::language {

uint64_t ElasticSpanTag(const std::string& request_id) {
  const uint32_t a = Crc32c(request_id.data(), request_id.size());
  const uint32_t b = Crc32cExtend(a ^ 0x5a5a5a5au, request_id.data(), request_id.size());
  return (uint64_t{a} << 32) | b;
}

ElasticGroups::ElasticGroups(const ElasticGroupsOptions& options, worker::LlmEngine& engine,
                             Emit emit, Moved moved)
    : options_(options), engine_(engine), emit_(std::move(emit)), moved_(std::move(moved)) {}

ElasticGroups::~ElasticGroups() {
  // The engine's callbacks of the requests mastered here point at this.
  closing_ = true;
  std::vector<std::string> mastered;
  for (const auto& [id, d] : decodes_) mastered.push_back(id);
  for (const std::string& id : mastered) engine_.Abort(id).IgnoreError();
  engine_.set_master_peers(nullptr);
  elastic_.reset();  // the span server's thread first
}

absl::StatusOr<std::unique_ptr<ElasticGroups>> ElasticGroups::Create(
    const ElasticGroupsOptions& options, worker::LlmEngine& engine, metrics::Registry& metrics,
    Emit emit, Moved moved) {
  std::unique_ptr<ElasticGroups> g(
      new ElasticGroups(options, engine, std::move(emit), std::move(moved)));
  const model::TextConfig& cfg = engine.config().text;
  const int64_t head_dim = cfg.head_dim();
  g->scale_ = static_cast<float>(std::pow(static_cast<double>(head_dim), -0.5));
  g->expired_ = &metrics.GetCounter(
      "mmserve_language_elastic_spans_expired_total",
      "Held elastic spans freed by the idle lease (no span query for --elastic_span_idle_s).");
  g->moves_ = &metrics.GetCounter(
      "mmserve_language_elastic_master_moves_total",
      "elastic requests this instance mastered until its decode range was full and handed on "
      "to the next master (no KV moved).");
  g->orphaned_ = &metrics.GetCounter(
      "mmserve_language_elastic_spans_orphaned_total",
      "Held elastic spans freed because their master's process is gone (a master on this host).");
  g->prefill_bytes_ = KvBytesMoved(metrics, "elastic_prefill");
  ASSIGN_OR_RETURN(g->context_, transfer::UcxContext::Create(options.profile));
  const uint32_t cap = options.max_prompt_tokens != 0
                           ? options.max_prompt_tokens
                           : static_cast<uint32_t>(engine.sizing().context_len);
  const transfer::ElasticInstance::Options o{
      .name = options.name,
      .max_prompt_tokens = cap,
      .kv_width = static_cast<uint32_t>(cfg.num_key_value_heads * head_dim),
      .q_width = cfg.num_attention_heads * head_dim,
      .heads = cfg.num_attention_heads,
      .max_members = kMaxElasticMembers,
      .query_timeout = options.layer_timeout};
  ElasticGroups* self = g.get();
  ASSIGN_OR_RETURN(g->elastic_, transfer::ElasticInstance::Create(
                                    *g->context_, o,
                                    [self](int layer, absl::Span<const uint64_t> tags,
                                           const float* q, int64_t rows, float* out, float* lse) {
                                      return self->AnswerQuery(layer, tags, q, rows, out, lse);
                                    }));
  const transfer::WireBytes decode_bytes = KvBytesMoved(metrics, "elastic_decode");
  g->elastic_->span_server().CountBytes(decode_bytes);
  g->elastic_->span_client().CountBytes(decode_bytes);
  engine.set_master_peers(g.get());
  return g;
}

absl::Status ElasticGroups::AnswerQuery(int layer, absl::Span<const uint64_t> tags, const float* q,
                                        int64_t rows, float* out, float* lse) {
  const model::TextConfig& cfg = engine_.config().text;
  if (layer < 0 || layer >= cfg.num_hidden_layers) {
    return absl::InvalidArgumentError("no such layer");
  }
  model::KvCache& kv = engine_.kv_cache();
  const model::cpu::PagedKvLayer layer_kv{kv.Key(layer), kv.Value(layer), kv.shape().block_size,
                                          cfg.num_key_value_heads, cfg.head_dim()};
  // Held while the blocks are read: Release waits for the answer.
  absl::MutexLock lock(&mu_);
  std::vector<model::cpu::PartialSpan> spans;
  const absl::Time now = absl::Now();
  for (int64_t r = 0; r < rows; ++r) {
    auto it = spans_.find(tags[r]);
    // A span that is gone (released, expired) must not merge as empty.
    if (it == spans_.end()) return absl::NotFoundError("no span of that request here");
    it->second->last_query = now;
    spans.push_back({r, it->second->blocks.data(), it->second->keys});
  }
  model::cpu::PartialAttention(server_pool_, q, cfg.num_attention_heads, layer_kv, spans, scale_,
                               out, lse);
  return absl::OkStatus();
}

bool ElasticGroups::Release(const std::string& id) {
  bool known = false;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = spans_.begin(); it != spans_.end(); ++it) {
      if (it->second->id != id) continue;
      spans_.erase(it);
      known = true;
      break;
    }
  }
  known |= decodes_.erase(id) > 0;
  known |= waiting_.erase(id) > 0;
  ForgetLanes(id);
  // Its span, held or mastered (a mastered request's final event comes
  // from the engine and finds nothing here).
  if (known) engine_.Abort(id).IgnoreError();
  return known;
}

namespace {

bool AnyGone(const std::vector<transfer::ProcessIdentity>& processes) {
  for (const transfer::ProcessIdentity& p : processes) {
    if (transfer::CheckPeerProcess(p) == transfer::PeerState::kGone) return true;
  }
  return false;
}

}  // namespace

void ElasticGroups::ExpireIdle() {
  const bool check_masters = masters_check_.Expired();
  if (check_masters) masters_check_ = Deadline::After(transfer::kLivenessInterval);
  std::vector<std::pair<std::string, metrics::Counter*>> freed;
  {
    absl::MutexLock lock(&mu_);
    const absl::Time oldest = absl::Now() - options_.span_idle;
    for (auto it = spans_.begin(); it != spans_.end();) {
      const Span& span = *it->second;
      const bool idle = span.last_query < oldest;
      const bool orphan = !idle && check_masters && AnyGone(span.masters);
      if (!idle && !orphan) {
        ++it;
        continue;
      }
      freed.push_back({span.id, idle ? expired_ : orphaned_});
      it = spans_.erase(it);
    }
  }
  for (const auto& [id, counter] : freed) {
    ForgetLanes(id);
    engine_.ReleaseSpan(id).IgnoreError();
    counter->Increment();
  }
}

size_t ElasticGroups::num_held_spans() const {
  absl::MutexLock lock(&mu_);
  return spans_.size();
}

}  // namespace mmserve::language
