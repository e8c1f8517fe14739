// ElasticGroups::Prefill: one member's share of a group prefill (elastic_groups.h).
#include <algorithm>
#include <utility>

#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "language_service/elastic_groups.h"
#include "language_service/elastic_groups_internal.h"
#include "language_service/elastic_plan.h"

namespace mmserve::language {
namespace {

// The members' endpoints, each checked against this instance's board.
absl::StatusOr<std::vector<transfer::ElasticEndpoint>> Endpoints(
    const v1::ElasticPlan& plan, int64_t prompt_len, const transfer::ElasticEndpoint& mine) {
  std::vector<transfer::ElasticEndpoint> out;
  for (const v1::ElasticMember& m : plan.members()) {
    absl::StatusOr<transfer::ElasticEndpoint> e = transfer::DecodeElasticEndpoint(m.endpoint());
    // A plan the members cannot serve is the router's fault, not the
    // client's: INTERNAL, which the router shows clients as a generic error.
    if (!e.ok()) {
      return absl::InternalError(
          absl::StrCat("member ", m.instance_id(), ": ", e.status().message()));
    }
    if (e->kv_width != mine.kv_width) {
      return absl::InternalError(absl::StrCat("member ", m.instance_id(), " serves another model"));
    }
    // A limit a client may meet: the reason reaches it, so it names no
    // instance.
    if (prompt_len > e->max_prompt_tokens ||
        static_cast<uint32_t>(plan.members_size()) > e->max_members) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "the prompt (", prompt_len, " tokens) or the group is too large for a member of it (",
          e->max_prompt_tokens, " tokens, ", e->max_members, " members)"));
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

absl::StatusOr<ElasticGroups::Prefilled> ElasticGroups::Prefill(
    const v1::ElasticPlan& plan, int member, std::unique_ptr<worker::ElasticRequest> request,
    const std::function<void()>& on_joined) {
  Group g;
  g.plan = &plan;
  g.member = member;
  g.id = request->id();
  g.tag = ElasticSpanTag(g.id);
  g.request = std::move(request);
  absl::Status checked = Check(g);
  if (!checked.ok()) {
    Refuse(plan, member, g.id, checked);  // the others end at once
    return checked;
  }
  const v1::ElasticRowRange& keep = plan.members(member).keep();
  g.master = static_cast<uint32_t>(member) == plan.master();
  g.sampler = static_cast<uint32_t>(member) == plan.sampler();
  g.keep_len = keep.end() - keep.begin();
  g.holder = g.keep_len > 0 && !g.master;
  PlanChain(g);
  absl::Status s = Join(g);
  if (s.ok() && on_joined) on_joined();
  if (s.ok()) s = RunRows(g);
  Prefilled out;
  if (s.ok()) s = Finish(g, &out);
  if (!s.ok() && g.exchange != nullptr) g.exchange->Abort(s.code());  // the others end at once
  if (g.exchange != nullptr) g.exchange->Finish();
  if (!s.ok()) {
    Drop(g);
    return s;
  }
  return out;
}

// The plan and the members' endpoints, before any exchange exists.
absl::Status ElasticGroups::Check(Group& g) const {
  const v1::ElasticPlan& plan = *g.plan;
  const int64_t len = g.request->prompt_len();
  RETURN_IF_ERROR(CheckElasticPlan(plan, static_cast<uint32_t>(len),
                                   static_cast<uint32_t>(engine_.kv_cache().shape().block_size)));
  if (g.member < 0 || g.member >= plan.members_size()) {
    return absl::InvalidArgumentError("the receiver is not a member of the plan");
  }
  ASSIGN_OR_RETURN(transfer::ElasticEndpoint mine, transfer::DecodeElasticEndpoint(endpoint()));
  ASSIGN_OR_RETURN(g.endpoints, Endpoints(plan, len, mine));
  return absl::OkStatus();
}

void ElasticGroups::Refuse(const v1::ElasticPlan& plan, int member, const std::string& id,
                           const absl::Status& why) {
  if (member < 0 || member >= plan.members_size()) return;  // no place to tell them from
  std::vector<transfer::NoticeBoardTarget> targets(plan.members_size());
  for (int m = 0; m < plan.members_size(); ++m) {
    absl::StatusOr<transfer::ElasticEndpoint> e =
        transfer::DecodeElasticEndpoint(plan.members(m).endpoint());
    if (e.ok() && m != member) targets[m] = e->exchange;
  }
  transfer::UcxElasticExchange::Refuse(elastic_->exchange_board(), targets, member,
                                       transfer::UcxElasticExchange::SeqBase(id, plan.group()),
                                       why.code());
}

// The masters in decode order, and this member's place, range and span
// start among them (the plan is checked: the ranges tile the decode tail
// in order, the first is plan.master's). The last master's range reaches
// max_tokens at least (the manager's footprint: prompt + max_tokens - 1
// slots): without ranges, the one master holds room for all of it.
void ElasticGroups::PlanChain(Group& g) {
  const v1::ElasticPlan& plan = *g.plan;
  const int64_t len = g.request->prompt_len();
  g.chain = ElasticMasterChain(plan);
  g.keep_begin = plan.members(g.member).keep().begin();
  const auto at = std::find(g.chain.begin(), g.chain.end(), g.member);
  if (at == g.chain.end()) return;
  g.chain_pos = static_cast<int>(at - g.chain.begin());
  const v1::ElasticRowRange& d = plan.members(g.member).decode();
  g.decode_begin = d.begin() < d.end() ? d.begin() : len;
  g.decode_end = d.begin() < d.end() ? d.end() : len;
  if (static_cast<size_t>(g.chain_pos) + 1 == g.chain.size()) {
    // The last step's KV goes to index len + max_tokens - 2.
    g.decode_end = std::max<int64_t>(g.decode_end, len + g.request->max_tokens() - 1);
  }
  if (g.keep_len == 0) g.keep_begin = g.decode_begin;
  g.reserved_end = g.decode_end;
  if (plan.decode_window() > 0) {
    g.reserved_end = std::min<int64_t>(g.decode_end, g.decode_begin + plan.decode_window());
  }
}

// Connects the exchange, holds the span, opens the lanes of the masters it
// will serve and waits for every member.
absl::Status ElasticGroups::Join(Group& g) {
  transfer::UcxElasticExchange::Plan xplan;
  xplan.prompt_len = g.request->prompt_len();
  xplan.kv_width = g.endpoints[g.member].kv_width;
  std::vector<transfer::NoticeBoardTarget> targets;
  for (int m = 0; m < g.plan->members_size(); ++m) {
    std::vector<int64_t> rows;
    for (int32_t r : ElasticMemberRows(g.plan->members(m))) rows.push_back(r);
    xplan.rows.push_back(std::move(rows));
    targets.push_back(g.endpoints[m].exchange);
  }
  ASSIGN_OR_RETURN(g.exchange, transfer::UcxElasticExchange::CreateOn(
                                   elastic_->exchange_board(), std::move(xplan), g.member,
                                   transfer::UcxElasticExchange::SeqBase(g.id, g.plan->group()),
                                   options_.layer_timeout));
  g.exchange->CountBytes(prefill_bytes_);
  // Connected first: a member that cannot hold its span tells the others.
  RETURN_IF_ERROR(g.exchange->Connect(targets));
  const int64_t tokens = g.chain_pos >= 0 ? g.reserved_end - g.keep_begin : g.keep_len;
  if (tokens > 0) {
    ASSIGN_OR_RETURN(std::vector<kvpool::BlockId> blocks,
                     engine_.HoldSpan(g.id, static_cast<int>(tokens)));
    g.held = true;
    for (kvpool::BlockId b : blocks) g.blocks.push_back(b.value);
  }
  RETURN_IF_ERROR(OpenLanes(g));
  return g.exchange->Join(options_.join_timeout);
}

// The lanes (member places) of the masters this member will serve on its
// span server: every master when it keeps part of the prompt, the later
// masters of the chain when it is one. Refused while another master uses
// such a lane here for a live request.
absl::Status ElasticGroups::OpenLanes(Group& g) {
  std::vector<int> serve;
  for (size_t c = 0; c < g.chain.size(); ++c) {
    const int m = g.chain[c];
    const bool later = g.chain_pos >= 0 && static_cast<int>(c) > g.chain_pos;
    if (m != g.member && (g.keep_len > 0 || later)) serve.push_back(m);
  }
  if (serve.empty()) return absl::OkStatus();
  {
    absl::MutexLock lock(&mu_);
    if (spans_.count(g.tag) != 0) return absl::AlreadyExistsError("a span of that id is held");
  }
  for (int lane : serve) {
    const auto it = lanes_.find(lane);
    if (it != lanes_.end() && !it->second.ids.empty() &&
        it->second.master != g.endpoints[lane].span_reply.worker_address) {
      return absl::ResourceExhaustedError(
          "this instance holds a span for another master in that member place");
    }
  }
  g.lanes = true;
  for (int lane : serve) {
    lanes_[lane].master = g.endpoints[lane].span_reply.worker_address;
    lanes_[lane].ids.insert(g.id);
    RETURN_IF_ERROR(elastic_->span_server().AddClient(lane, g.endpoints[lane].span_reply));
  }
  return absl::OkStatus();
}

void ElasticGroups::ForgetLanes(const std::string& id) {
  for (auto& [lane, use] : lanes_) use.ids.erase(id);
}

// This member's rows through every layer: their tokens, M-RoPE positions
// and image rows (by global index), the kept range into its blocks.
absl::Status ElasticGroups::RunRows(Group& g) {
  const worker::ElasticRequest& r = *g.request;
  const model::MropePositions& pos = r.positions();
  const worker::RunnerRequestState& st = r.runner();
  const int64_t hidden = engine_.config().text.hidden_size;
  model::ElasticPrefillBatch b;
  b.prompt_len = r.prompt_len();
  const std::vector<int32_t> rows = ElasticMemberRows(g.plan->members(g.member));
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
        b.rows.embedding_overrides.push_back(worker::ImageOverride(st, k, at, i, hidden));
      }
    }
  }
  if (g.sampler) b.rows.logits_rows.push_back(n - 1);
  b.keep_begin = g.keep_len > 0 ? g.keep_begin : b.prompt_len;  // a later master keeps none
  const int64_t bs = engine_.kv_cache().shape().block_size;
  for (int64_t i = 0; i < g.keep_len; ++i) b.keep_slots.push_back(g.blocks[i / bs] * bs + i % bs);
  DelayedExchange delayed(*g.exchange, options_.test_step_delay);
  model::KvExchange& exchange = options_.test_step_delay > absl::ZeroDuration()
                                    ? static_cast<model::KvExchange&>(delayed)
                                    : *g.exchange;
  return engine_.model().ForwardElasticPrefill(b, engine_.kv_cache(), exchange, &g.logits);
}

// The first token, then what stays: a held span for the master's queries,
// or the master's decode. Every holder and the sampler tell the master once
// their part is done (the sampler's notice carries the first token), so the
// master queries no span before it is registered.
absl::Status ElasticGroups::Finish(Group& g, Prefilled* out) {
  const int layers = engine_.config().text.num_hidden_layers;
  const int master = static_cast<int>(g.plan->master());
  worker::StreamEvent first;
  int32_t token = 0;
  if (g.sampler) {
    ASSIGN_OR_RETURN(first,
                     engine_.FirstElasticToken(*g.request, {.logits = absl::MakeSpan(g.logits)}));
    token = first.token_ids.front();
    out->event = first;
  }
  if (!g.master) return FinishMember(g, first, token, out);
  for (int m = 0; m < g.plan->members_size(); ++m) {
    const v1::ElasticRowRange& k = g.plan->members(m).keep();
    const bool sampler = static_cast<uint32_t>(m) == g.plan->sampler();
    if (m == master || (!sampler && k.begin() == k.end())) continue;
    ASSIGN_OR_RETURN(const int32_t t, g.exchange->AwaitToken(layers, m));
    if (sampler) token = t;
  }
  if (!g.sampler) {
    // The sampler's stream carried the token; the master's only ends.
    ASSIGN_OR_RETURN(first, engine_.FirstElasticToken(*g.request, {.token = token}));
    if (first.finish_reason != worker::FinishReason::kNone) out->event = first;
  }
  if (first.finish_reason != worker::FinishReason::kNone) {
    if (g.held) engine_.ReleaseSpan(g.id).IgnoreError();  // a master done at once
    g.held = false;
    ForgetLanes(g.id);
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(StartDecode(g, /*waiting=*/false));
  out->decodes = true;
  return absl::OkStatus();
}

// A member other than the (first) master: its span held for the masters'
// queries, a later master's decode waiting for its move, and its notice
// to the master (the sampler's carries the first token).
absl::Status ElasticGroups::FinishMember(Group& g, const worker::StreamEvent& first, int32_t token,
                                         Prefilled* out) {
  if (g.holder) AddSpan(g);
  if (g.chain_pos > 0 && first.finish_reason == worker::FinishReason::kNone) {
    RETURN_IF_ERROR(StartDecode(g, /*waiting=*/true));  // Resume starts it
    out->awaits_move = true;
  } else if (g.chain_pos > 0) {  // the sampler's token ended it: nothing to wait for
    engine_.ReleaseSpan(g.id).IgnoreError();
    g.held = false;
    ForgetLanes(g.id);
  }
  if (!g.holder && !g.sampler) return absl::OkStatus();
  absl::Status s = g.exchange->SendToken(engine_.config().text.num_hidden_layers,
                                         static_cast<int>(g.plan->master()), token);
  if (!s.ok()) Release(g.id);
  return s;
}

void ElasticGroups::AddSpan(Group& g) {
  auto span = std::make_unique<Span>();
  span->id = g.id;
  span->blocks = g.blocks;
  span->keys = g.keep_len;
  for (int m : g.chain) span->masters.push_back(g.endpoints[m].process);
  span->last_query = absl::Now();
  absl::MutexLock lock(&mu_);
  spans_[g.tag] = std::move(span);
  g.held = false;  // the span owns the blocks now (Release frees them)
}

// The holders it queries: the members keeping part of the prompt and the
// earlier masters of the chain (their decode tails), in member order. The
// first master's request goes to the engine now, a later one's at Resume.
absl::Status ElasticGroups::StartDecode(Group& g, bool waiting) {
  const int self = g.member;
  auto d = std::make_unique<Decode>();
  d->id = g.id;
  d->tag = g.tag;
  d->prompt_len = g.request->prompt_len();
  d->blocks = g.blocks;
  d->keep_begin = g.keep_begin;
  d->first_index = g.decode_begin;
  d->reserved_end = g.reserved_end;
  d->range_end = g.decode_end;
  d->window = g.plan->decode_window();
  d->last = static_cast<size_t>(g.chain_pos) + 1 == g.chain.size();
  d->master = self;
  for (int m : g.chain) d->masters.push_back(g.endpoints[m].process);
  d->servers.resize(g.plan->members_size());
  for (int m = 0; m < g.plan->members_size(); ++m) {
    const v1::ElasticRowRange& k = g.plan->members(m).keep();
    const int c = static_cast<int>(std::find(g.chain.begin(), g.chain.end(), m) - g.chain.begin());
    if (m != self && k.begin() == k.end() && c >= g.chain_pos) continue;
    if (m == self) d->self_holder = static_cast<int>(d->holders.size());
    d->holders.push_back(m);
    if (m != self) d->servers[m] = g.endpoints[m].span_inbox;
  }
  // Requests with the same holders, servers and lane share the span client.
  std::string key = absl::StrCat(self, "/", d->self_holder);
  for (int m : d->holders) absl::StrAppend(&key, ",", m);
  for (const transfer::NoticeBoardTarget& t : d->servers) {
    absl::StrAppend(&key, "|", t.worker_address, "|", t.rkey, "|", t.base_address);
  }
  d->holder_set = absl::Hash<std::string>{}(key);
  if (waiting) {
    d->request = std::move(g.request);
    waiting_[g.id] = std::move(d);
  } else {
    const worker::ElasticRequest::MasterState state = g.request->ExportState();
    RETURN_IF_ERROR(engine_.StartMastering(
        std::move(g.request), state, {.kv_begin = d->keep_begin, .decode_group = d->holder_set},
        MasterCallback()));
    decodes_[g.id] = std::move(d);
    client_set_.reset();  // its holders opened their lanes anew: reconnect
  }
  g.held = false;  // the decode owns the blocks now
  return absl::OkStatus();
}

// A failed prefill leaves nothing here (a span or decode Finish recorded
// owns its blocks: Finish releases those itself on error).
void ElasticGroups::Drop(Group& g) {
  if (g.held) engine_.ReleaseSpan(g.id).IgnoreError();
  if (g.lanes) ForgetLanes(g.id);
}

}  // namespace mmserve::language
