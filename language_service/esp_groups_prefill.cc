// EspGroups::Prefill: one member's share of a group prefill (esp_groups.h).
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "language_service/esp_groups.h"
#include "language_service/esp_groups_internal.h"
#include "language_service/esp_plan.h"

namespace mmserve::language {
namespace {

// The members' endpoints, each checked against this instance's board.
absl::StatusOr<std::vector<transfer::EspEndpoint>> Endpoints(const v1::EspPlan& plan,
                                                             int64_t prompt_len,
                                                             const transfer::EspEndpoint& mine) {
  std::vector<transfer::EspEndpoint> out;
  for (const v1::EspMember& m : plan.members()) {
    absl::StatusOr<transfer::EspEndpoint> e = transfer::DecodeEspEndpoint(m.endpoint());
    if (!e.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("member ", m.instance_id(), ": ", e.status().message()));
    }
    if (e->kv_width != mine.kv_width) {
      return absl::InvalidArgumentError(
          absl::StrCat("member ", m.instance_id(), " serves another model"));
    }
    if (prompt_len > e->max_prompt_tokens ||
        static_cast<uint32_t>(plan.members_size()) > e->max_members) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "the prompt (", prompt_len, " tokens) or the group is too large for member ",
          m.instance_id(), " (", e->max_prompt_tokens, " tokens, ", e->max_members, " members)"));
    }
    out.push_back(*std::move(e));
  }
  return out;
}

// TEST ONLY: an exchange whose layers wait first.
class DelayedExchange final : public model::KvExchange {
 public:
  DelayedExchange(model::KvExchange& inner, absl::Duration delay) : inner_(inner), delay_(delay) {}
  absl::Status AllGather(int layer, absl::Span<const int64_t> rows, const float* k, const float* v,
                         const float** k_all, const float** v_all) override {
    absl::SleepFor(delay_);
    return inner_.AllGather(layer, rows, k, v, k_all, v_all);
  }
  void Abort() override { inner_.Abort(); }

 private:
  model::KvExchange& inner_;
  const absl::Duration delay_;
};

}  // namespace

absl::StatusOr<EspGroups::Prefilled> EspGroups::Prefill(const v1::EspPlan& plan, int member,
                                                        std::unique_ptr<worker::EspRequest> request,
                                                        const std::function<void()>& on_joined) {
  Group g;
  g.plan = &plan;
  g.member = member;
  g.id = request->id();
  g.tag = EspSpanTag(g.id);
  g.request = std::move(request);
  const int64_t len = g.request->prompt_len();
  RETURN_IF_ERROR(CheckEspPlan(plan, static_cast<uint32_t>(len),
                               static_cast<uint32_t>(engine_.kv_cache().shape().block_size)));
  if (member < 0 || member >= plan.members_size()) {
    return absl::InvalidArgumentError("the receiver is not a member of the plan");
  }
  ASSIGN_OR_RETURN(transfer::EspEndpoint mine, transfer::DecodeEspEndpoint(endpoint()));
  ASSIGN_OR_RETURN(g.endpoints, Endpoints(plan, len, mine));
  const v1::EspRowRange& keep = plan.members(member).keep();
  g.master = static_cast<uint32_t>(member) == plan.master();
  g.sampler = static_cast<uint32_t>(member) == plan.sampler();
  g.keep_begin = keep.begin() == keep.end() && g.master ? len : keep.begin();
  g.keep_len = keep.end() - keep.begin();
  g.holder = g.keep_len > 0 && !g.master;
  absl::Status s = Join(g);
  if (s.ok() && on_joined) on_joined();
  if (s.ok()) s = RunRows(g);
  Prefilled out;
  if (s.ok()) s = Finish(g, &out);
  if (!s.ok() && g.exchange != nullptr) g.exchange->Abort();  // the others end at once
  if (g.exchange != nullptr) g.exchange->Finish();
  if (!s.ok()) {
    Drop(g);
    return s;
  }
  return out;
}

// Connects the exchange, holds the span, opens the master's lane (a
// holder) and waits for every member.
absl::Status EspGroups::Join(Group& g) {
  transfer::UcxEspExchange::Plan xplan;
  xplan.prompt_len = g.request->prompt_len();
  xplan.kv_width = g.endpoints[g.member].kv_width;
  std::vector<transfer::NoticeBoardTarget> targets;
  for (int m = 0; m < g.plan->members_size(); ++m) {
    std::vector<int64_t> rows;
    for (int32_t r : EspMemberRows(g.plan->members(m))) rows.push_back(r);
    xplan.rows.push_back(std::move(rows));
    targets.push_back(g.endpoints[m].exchange);
  }
  ASSIGN_OR_RETURN(g.exchange,
                   transfer::UcxEspExchange::CreateOn(
                       esp_->exchange_board(), std::move(xplan), g.member,
                       transfer::UcxEspExchange::SeqBase(g.id), options_.layer_timeout));
  g.exchange->CountBytes(prefill_bytes_);
  // Connected first: a member that cannot hold its span tells the others.
  RETURN_IF_ERROR(g.exchange->Connect(targets));
  const int64_t tokens = g.keep_len + (g.master ? g.request->max_tokens() : 0);
  if (tokens > 0) {
    ASSIGN_OR_RETURN(std::vector<kvpool::BlockId> blocks,
                     engine_.HoldSpan(g.id, static_cast<int>(tokens)));
    g.held = true;
    for (kvpool::BlockId b : blocks) g.blocks.push_back(b.value);
  }
  if (g.holder) RETURN_IF_ERROR(OpenLane(g));
  return g.exchange->Join(options_.join_timeout);
}

// A holder's lane for the group's master (its member place) on the span
// server; refused while another master's live span uses that lane here.
absl::Status EspGroups::OpenLane(Group& g) {
  const int lane = static_cast<int>(g.plan->master());
  const transfer::NoticeBoardTarget& master = g.endpoints[lane].span_reply;
  {
    absl::MutexLock lock(&mu_);
    if (spans_.count(g.tag) != 0) return absl::AlreadyExistsError("a span of that id is held");
    for (const auto& [tag, span] : spans_) {
      if (span->lane == lane && span->master != master.worker_address) {
        return absl::ResourceExhaustedError(
            "this instance holds a span for another master in that member place");
      }
    }
  }
  return esp_->span_server().AddClient(lane, master);
}

// This member's rows through every layer: their tokens, M-RoPE positions
// and image rows (by global index), the kept range into its blocks.
absl::Status EspGroups::RunRows(Group& g) {
  const worker::EspRequest& r = *g.request;
  const model::MropePositions& pos = r.positions();
  const worker::RunnerRequestState& st = r.runner();
  const int64_t hidden = engine_.config().text.hidden_size;
  model::EspPrefillBatch b;
  b.prompt_len = r.prompt_len();
  const std::vector<int32_t> rows = EspMemberRows(g.plan->members(g.member));
  const int64_t n = static_cast<int64_t>(rows.size());
  b.rows.positions.resize(3 * n);
  for (int64_t i = 0; i < n; ++i) {
    const int32_t gr = rows[i];
    b.global_rows.push_back(gr);
    b.rows.token_ids.push_back(r.token_ids()[gr]);
    b.rows.positions[i] = pos.t[gr];
    b.rows.positions[n + i] = pos.h[gr];
    b.rows.positions[2 * n + i] = pos.w[gr];
    for (size_t k = 0; k < st.image_offsets.size(); ++k) {
      const int64_t at = gr - st.image_offsets[k];
      if (at >= 0 && at < st.image_lengths[k]) {
        b.rows.embedding_overrides.push_back({i, st.image_embeddings[k] + at * hidden});
      }
    }
  }
  if (g.sampler) b.rows.logits_rows.push_back(n - 1);
  b.keep_begin = g.keep_begin;
  const int64_t bs = engine_.kv_cache().shape().block_size;
  for (int64_t i = 0; i < g.keep_len; ++i) b.keep_slots.push_back(g.blocks[i / bs] * bs + i % bs);
  DelayedExchange delayed(*g.exchange, options_.test_step_delay);
  model::KvExchange& exchange = options_.test_step_delay > absl::ZeroDuration()
                                    ? static_cast<model::KvExchange&>(delayed)
                                    : *g.exchange;
  return engine_.model().ForwardEspPrefill(b, engine_.kv_cache(), exchange, &g.logits);
}

// The first token, then what stays: a held span for the master's queries,
// or the master's decode. Every holder and the sampler tell the master once
// their part is done (the sampler's notice carries the first token), so the
// master queries no span before it is registered.
absl::Status EspGroups::Finish(Group& g, Prefilled* out) {
  const int layers = engine_.config().text.num_hidden_layers;
  const int master = static_cast<int>(g.plan->master());
  worker::StreamEvent first;
  int32_t token = 0;
  if (g.sampler) {
    const model::SampleResult s = g.request->Sample(absl::MakeSpan(g.logits));
    ASSIGN_OR_RETURN(first, g.request->Push(s));
    token = s.token;
    out->event = first;
  }
  if (!g.master) {
    if (g.holder) AddSpan(g);
    if (!g.holder && !g.sampler) return absl::OkStatus();
    absl::Status s = g.exchange->SendToken(layers, master, token);
    if (!s.ok()) Release(g.id);
    return s;
  }
  for (int m = 0; m < g.plan->members_size(); ++m) {
    const v1::EspRowRange& k = g.plan->members(m).keep();
    const bool sampler = static_cast<uint32_t>(m) == g.plan->sampler();
    if (m == master || (!sampler && k.begin() == k.end())) continue;
    ASSIGN_OR_RETURN(const int32_t t, g.exchange->AwaitToken(layers, m));
    if (sampler) token = t;
  }
  if (!g.sampler) {
    model::SampleResult s;
    s.token = token;
    ASSIGN_OR_RETURN(first, g.request->Push(s));
    if (first.finish_reason != worker::FinishReason::kNone) {
      // The sampler's stream carried the token; the master's only ends.
      first.token_ids.clear();
      first.logprobs.clear();
      first.text.clear();
      out->event = first;
    }
  }
  if (first.finish_reason != worker::FinishReason::kNone) {
    if (g.held) engine_.ReleaseSpan(g.id).IgnoreError();  // a master done at once
    g.held = false;
    return absl::OkStatus();
  }
  StartDecode(g, token);
  out->decodes = true;
  return absl::OkStatus();
}

void EspGroups::AddSpan(Group& g) {
  auto span = std::make_unique<Span>();
  span->id = g.id;
  span->blocks = g.blocks;
  span->keys = g.keep_len;
  span->lane = static_cast<int>(g.plan->master());
  span->master = g.endpoints[span->lane].span_reply.worker_address;
  span->last_query = absl::Now();
  absl::MutexLock lock(&mu_);
  spans_[g.tag] = std::move(span);
  g.held = false;  // the span owns the blocks now (Release frees them)
}

void EspGroups::StartDecode(Group& g, int32_t first_token) {
  const int master = static_cast<int>(g.plan->master());
  auto d = std::make_unique<Decode>();
  d->id = g.id;
  d->tag = g.tag;
  d->blocks = g.blocks;
  d->keep_begin = g.keep_begin;
  d->last_token = first_token;
  d->master = master;
  d->servers.resize(g.plan->members_size());
  for (int m = 0; m < g.plan->members_size(); ++m) {
    const v1::EspRowRange& k = g.plan->members(m).keep();
    if (m != master && k.begin() == k.end()) continue;
    if (m == master) d->self_holder = static_cast<int>(d->holders.size());
    d->holders.push_back(m);
    if (m != master) d->servers[m] = g.endpoints[m].span_inbox;
  }
  d->request = std::move(g.request);
  decodes_[g.id] = std::move(d);
  g.held = false;  // the decode owns the blocks now
}

// A failed prefill leaves nothing here (a span or decode Finish recorded
// owns its blocks: Finish releases those itself on error).
void EspGroups::Drop(Group& g) {
  if (g.held) engine_.ReleaseSpan(g.id).IgnoreError();
}

}  // namespace mmserve::language
