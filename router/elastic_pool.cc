#include "router/elastic_pool.h"

#include <algorithm>
#include <functional>
#include <random>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "proto/language.grpc.pb.h"
#include "router/elastic_group_plan.h"

namespace mmserve::router {
namespace {

int64_t RoundUp(int64_t tokens, int64_t block_size) {
  return (tokens + block_size - 1) / block_size * block_size;
}

// Each member's promised slots: the block-rounded spans the retention plan
// puts on it.
std::vector<int64_t> PromisedPerMember(const scheduler::ElasticRequestPlan& request,
                                       const std::vector<int>& members, int64_t block_size) {
  std::vector<int64_t> promised(members.size(), 0);
  for (const scheduler::ElasticSpan& span : request.spans) {
    const auto it = std::find(members.begin(), members.end(), span.instance);
    if (it == members.end()) continue;
    promised[static_cast<size_t>(it - members.begin())] +=
        RoundUp(span.end - span.begin, block_size);
  }
  return promised;
}

}  // namespace

ElasticPool::ElasticPool(InstanceTable& table, metrics::Registry& metrics, EventLoop& loop,
                         ElasticPoolOptions options)
    : table_(table),
      loop_(loop),
      master_moves_(metrics.GetCounter(
          "mmserve_router_elastic_master_moves_total",
          "Elastic requests whose master moved to the next member of its group.")),
      aborts_sent_(metrics.GetCounter("mmserve_router_elastic_aborts_total",
                                      "Abort calls sent to the members of elastic groups.")),
      pending_gauge_(metrics.GetGauge("mmserve_router_elastic_pending",
                                      "Requests waiting for elastic KV slots.")),
      promised_gauge_(
          metrics.GetGauge("mmserve_router_elastic_promised_slots",
                           "KV token slots promised to live requests on elastic instances.")),
      options_(std::move(options)),
      step_fit_(options_.config.per_degree) {
  avg_decode_seconds_ = options_.config.avg_decode_latency;
  // Placements of one router never share a group; another router's (or a
  // restarted one's) start elsewhere.
  std::random_device random;
  last_group_ = (uint64_t{random()} << 32) | random();
  // Every degree the step models allow, exported from the start.
  const size_t max_degree = std::max<size_t>(1, options_.config.per_degree.size());
  for (size_t degree = 1; degree <= max_degree; ++degree) {
    requests_by_degree_.push_back(
        &metrics.GetCounter("mmserve_router_elastic_requests_total",
                            "Requests the elastic manager placed, by degree of parallelism.",
                            {{"degree", absl::StrCat(degree)}}));
  }
}

ElasticPool::~ElasticPool() { Stop(); }

void ElasticPool::Start() { ScheduleTick(); }

void ElasticPool::ScheduleTick() {
  loop_.PostAfter(options_.tick, [this, alive = alive_] {
    if (!*alive) return;
    RunIteration();
    ScheduleTick();
  });
}

void ElasticPool::Wake() {
  if (wake_ || stopping_) return;
  wake_ = true;
  loop_.Post([this, alive = alive_] {
    if (!*alive) return;
    {
      absl::MutexLock lock(&mu_);
      wake_ = false;
    }
    RunIteration();
  });
}

void ElasticPool::Stop() {
  std::vector<Delivery> out;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    for (Pending& p : pending_) {
      out.emplace_back(std::move(p.demand.on_placed),
                       absl::UnavailableError("the router is shutting down"));
    }
    pending_.clear();
    SetGauges();
  }
  // Once this returns no task of the pool runs on the loop (a stopped loop
  // runs none).
  const absl::Status s = loop_.RunAndWait([alive = alive_] {
    *alive = false;
    return absl::OkStatus();
  });
  if (!s.ok()) *alive_ = false;
  for (auto& [f, placement] : out) f(std::move(placement));
}

bool ElasticPool::CanPlace() const { return !table_.Healthy(Role::kElastic).empty(); }

int64_t ElasticPool::BlockSize(const std::vector<std::shared_ptr<Instance>>& pool) const {
  for (const auto& i : pool) {
    if (i->info.capacity().kv_block_size() > 0) return i->info.capacity().kv_block_size();
  }
  return std::max<int64_t>(1, options_.config.block_size);
}

int64_t ElasticPool::CapacitySlots(const Instance& instance) const {
  const iv1::Capacity& c = instance.info.capacity();
  const int64_t slots = int64_t{c.kv_blocks_total()} * c.kv_block_size();
  if (slots > 0) return slots;
  // Not registered with its capacity (a flag-given instance): the latest
  // report's free slots are the best guess.
  return static_cast<int64_t>(table_.LastLoad(instance.id).kv_token_slots_free());
}

int64_t ElasticPool::FreeSlots(const Instance& instance) const {
  const LoadSnapshot snap = table_.LastLoadSnapshot(instance.id);
  int64_t since_report = 0, live = 0;
  for (const auto& [id, l] : live_) {
    for (size_t m = 0; m < l.members.size(); ++m) {
      if (l.members[m]->id != instance.id) continue;
      live += l.promised[m];
      if (l.placed_at >= snap.at) since_report += l.promised[m];
    }
  }
  const int64_t reported = static_cast<int64_t>(snap.load.kv_token_slots_free()) - since_report;
  return std::max<int64_t>(0, std::min(reported, CapacitySlots(instance) - live));
}

bool ElasticPool::InGroupPrefill(const std::string& instance_id) const {
  for (const auto& [id, l] : live_) {
    if (!l.group || Decoding(l)) continue;
    for (const auto& m : l.members) {
      if (m->id == instance_id) return true;
    }
  }
  return false;
}

bool ElasticPool::Busy(const std::string& instance_id) const {
  for (const auto& [id, l] : live_) {
    for (const auto& m : l.members) {
      if (m->id == instance_id) return true;
    }
  }
  return false;
}

absl::Status ElasticPool::Submit(ElasticDemand demand) {
  std::vector<std::shared_ptr<Instance>> pool = table_.Healthy(Role::kElastic);
  if (pool.empty()) return absl::UnavailableError("no healthy elastic instance");  // !CanPlace()
  std::vector<int64_t> capacities;
  for (const auto& i : pool) capacities.push_back(CapacitySlots(*i));
  std::sort(capacities.rbegin(), capacities.rend());
  const size_t degree = std::min(capacities.size(), options_.config.per_degree.size());
  const int64_t block_size = BlockSize(pool);
  int64_t largest_group = 0;
  for (size_t k = 0; k < degree; ++k) largest_group += capacities[k] / block_size * block_size;
  const int64_t kv = demand.prompt_tokens + demand.max_tokens - 1;
  if (RoundUp(kv, block_size) > largest_group) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "prompt (", demand.prompt_tokens, " tokens) + max_tokens (", demand.max_tokens, ") need ",
        kv, " KV slots; the elastic instances hold at most ", largest_group, " for one request"));
  }
  absl::MutexLock lock(&mu_);
  if (stopping_) return absl::UnavailableError("the router is shutting down");
  if (pending_.size() >= options_.max_pending) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the elastic queue is full (", options_.max_pending, " requests)"));
  }
  pending_.push_back({std::move(demand), absl::Now()});
  SetGauges();
  Wake();
  return absl::OkStatus();
}

void ElasticPool::PhaseChanged(const std::string& id, CallPhase phase, size_t carrier) {
  absl::MutexLock lock(&mu_);
  auto it = live_.find(id);
  if (it == live_.end()) return;
  Live& l = it->second;
  const bool was_decoding = Decoding(l);
  l.phase = phase;
  if (!was_decoding && Decoding(l)) {
    l.first_token_at = absl::Now();
    if (l.sample) {
      step_fit_.Add(static_cast<int>(l.members.size()), l.prompt_tokens,
                    absl::ToDoubleSeconds(l.first_token_at - l.placed_at));
    }
    if (l.group) Wake();  // its instances rejoin the pool
  }
  // The sampler hands its first token over to the master: only a move
  // away from the master is the master's.
  if (phase == CallPhase::kHandedOver && carrier != l.master && carrier < l.members.size()) {
    master_moves_.Increment();
    l.master = carrier;
  }
}

void ElasticPool::Finished(const std::string& id) {
  std::vector<std::shared_ptr<Instance>> abort;
  {
    absl::MutexLock lock(&mu_);
    const auto p = std::find_if(pending_.begin(), pending_.end(),
                                [&](const Pending& q) { return q.demand.id == id; });
    if (p != pending_.end()) pending_.erase(p);
    auto it = live_.find(id);
    if (it != live_.end()) {
      const Live& l = it->second;
      if (Decoding(l)) {
        const double s = absl::ToDoubleSeconds(absl::Now() - l.first_token_at);
        avg_decode_seconds_ = avg_decode_seconds_ == 0 ? s : 0.8 * avg_decode_seconds_ + 0.2 * s;
      }
      if (l.group) abort = l.members;
      live_.erase(it);
    }
    SetGauges();
    Wake();
  }
  if (!abort.empty()) SendAborts(id, abort);
}

void ElasticPool::SendAborts(const std::string& id,
                             const std::vector<std::shared_ptr<Instance>>& members) {
  for (const auto& member : members) {
    auto ctx = std::make_shared<grpc::ClientContext>();
    ctx->set_deadline(std::chrono::system_clock::now() +
                      absl::ToChronoNanoseconds(options_.abort_timeout));
    auto request = std::make_shared<internal::v1::AbortRequest>();
    request->set_request_id(id);
    auto response = std::make_shared<internal::v1::AbortResponse>();
    aborts_sent_.Increment();
    member->language->async()->Abort(ctx.get(), request.get(), response.get(),
                                     [ctx, request, response, member](const grpc::Status& s) {
                                       if (!s.ok()) {
                                         LOG(WARNING) << "Abort " << request->request_id() << " on "
                                                      << member->id << ": " << s.error_message();
                                       }
                                     });
  }
}

void ElasticPool::RunIteration() {
  std::vector<Delivery> out;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    Expire(out);
    if (!pending_.empty()) Plan(out);
    SetGauges();
  }
  for (auto& [f, placement] : out) f(std::move(placement));
}

void ElasticPool::Expire(std::vector<Delivery>& out) {
  const absl::Time now = absl::Now();
  const auto wall = std::chrono::system_clock::now();
  for (auto it = pending_.begin(); it != pending_.end();) {
    absl::Status s;
    if (wall >= it->demand.deadline) {
      s = absl::DeadlineExceededError("the deadline passed while waiting for elastic KV slots");
    } else if (now - it->since >= options_.max_queue_wait) {
      s = absl::ResourceExhaustedError(
          absl::StrCat("no elastic KV slots within ",
                       absl::ToInt64Milliseconds(options_.max_queue_wait), " ms"));
    }
    if (s.ok()) {
      ++it;
      continue;
    }
    out.emplace_back(std::move(it->demand.on_placed), std::move(s));
    it = pending_.erase(it);
  }
}

scheduler::ElasticPoolState ElasticPool::PoolState(
    const std::vector<std::shared_ptr<Instance>>& pool, int64_t block_size) const {
  scheduler::ElasticPoolState state;
  const absl::Time now = absl::Now();
  for (size_t i = 0; i < pool.size(); ++i) {
    scheduler::ElasticInstanceState s{.id = static_cast<int>(i),
                                      .free_blocks = FreeSlots(*pool[i]) / block_size};
    double least = 0;
    for (const auto& [id, l] : live_) {
      if (!Decoding(l) || l.members[l.master]->id != pool[i]->id) continue;
      const double elapsed = absl::ToDoubleSeconds(now - l.first_token_at);
      least = s.decoding_output_lens.empty() ? elapsed : std::min(least, elapsed);
      s.decoding_output_lens.push_back(l.max_tokens);
    }
    s.min_decode_elapsed_seconds = least;
    state.instances.push_back(std::move(s));
  }
  for (size_t k = 0; k < pending_.size(); ++k) {
    state.pending.push_back({.id = k,
                             .input_len = pending_[k].demand.prompt_tokens,
                             .max_new_tokens = pending_[k].demand.max_tokens - 1});
  }
  return state;
}

void ElasticPool::Plan(std::vector<Delivery>& out) {
  std::vector<std::shared_ptr<Instance>> pool;
  for (auto& i : table_.Healthy(Role::kElastic)) {
    if (!InGroupPrefill(i->id)) pool.push_back(std::move(i));
  }
  if (pool.empty()) return;
  const int64_t block_size = BlockSize(pool);
  scheduler::ElasticConfig config = options_.config;
  config.block_size = block_size;
  config.avg_decode_latency = avg_decode_seconds_;
  config.per_degree = step_fit_.models();
  const scheduler::ElasticIterationPlan plan =
      PlanElasticIteration(PoolState(pool, block_size), config);
  std::vector<std::string> ids;
  for (const auto& i : pool) ids.push_back(i->id);
  std::set<uint64_t> placed;
  for (const scheduler::ElasticBatchPlan& batch : plan.batches) {
    const bool group = batch.instances.size() > 1;
    for (const scheduler::ElasticRequestPlan& r : batch.requests) {
      const ElasticDemand& demand = pending_[r.id].demand;
      Live live{.group = group,
                .placed_at = absl::Now(),
                .max_tokens = demand.max_tokens,
                .prompt_tokens = demand.prompt_tokens,
                .sample = demand.images == 0};
      for (int i : batch.instances) {
        live.members.push_back(pool[static_cast<size_t>(i)]);
        if (Busy(live.members.back()->id)) live.sample = false;
      }
      live.promised = PromisedPerMember(r, batch.instances, block_size);
      std::optional<internal::v1::ElasticPlan> wire;
      if (group) {
        absl::StatusOr<internal::v1::ElasticPlan> p = ElasticWirePlan(batch, r, ids);
        if (!p.ok()) {
          LOG(ERROR) << "elastic plan: " << p.status();
          break;
        }
        for (size_t m = 0; m < live.members.size(); ++m) {
          p->mutable_members(static_cast<int>(m))
              ->set_endpoint(live.members[m]->info.elastic_endpoint());
        }
        live.master = p->master();
        if (++last_group_ == 0) ++last_group_;
        p->set_group(last_group_);
        wire = *std::move(p);
      }
      Place(pending_[r.id], std::move(live), std::move(wire), out);
      placed.insert(r.id);
      if (group) break;  // one group prefill at a time on these instances
    }
  }
  std::deque<Pending> left;
  for (size_t k = 0; k < pending_.size(); ++k) {
    if (placed.count(k) == 0) left.push_back(std::move(pending_[k]));
  }
  pending_.swap(left);
}

void ElasticPool::Place(Pending& pending, Live live, std::optional<internal::v1::ElasticPlan> plan,
                        std::vector<Delivery>& out) {
  requests_by_degree_[std::min(live.members.size(), requests_by_degree_.size()) - 1]->Increment();
  ElasticPlacement placement{.members = live.members, .plan = std::move(plan)};
  live_[pending.demand.id] = std::move(live);
  out.emplace_back(std::move(pending.demand.on_placed), std::move(placement));
}

void ElasticPool::SetGauges() {
  int64_t promised = 0;
  for (const auto& [id, l] : live_) {
    for (int64_t p : l.promised) promised += p;
  }
  pending_gauge_.Set(static_cast<double>(pending_.size()));
  promised_gauge_.Set(static_cast<double>(promised));
}

ElasticPool::Stats ElasticPool::stats() const {
  Stats s;
  absl::MutexLock lock(&mu_);
  s.pending = pending_.size();
  s.step_models = step_fit_.models();
  for (size_t d = 1; d <= s.step_models.size(); ++d) {
    if (step_fit_.fitted(static_cast<int>(d))) s.fitted_degrees.push_back(static_cast<int>(d));
  }
  for (const auto& [id, l] : live_) {
    for (size_t m = 0; m < l.members.size(); ++m) {
      s.members[id].push_back(l.members[m]->id);
      s.promised_by_instance[l.members[m]->id] += l.promised[m];
      s.capacity_by_instance[l.members[m]->id] = CapacitySlots(*l.members[m]);
      s.promised_slots += l.promised[m];
    }
  }
  return s;
}

}  // namespace mmserve::router
