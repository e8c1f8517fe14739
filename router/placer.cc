#include "router/placer.h"

#include <algorithm>
#include <utility>

#include "language_service/elastic_plan.h"
#include "router/elastic_pool.h"
#include "router/elastic_prompt.h"
#include "router/router_context.h"
#include "scheduler/placement.h"

namespace mmserve::router {
namespace {

// The instance of `candidates` with the least outstanding work.
std::shared_ptr<Instance> LeastLoaded(const InstanceTable& table,
                                      const std::vector<std::shared_ptr<Instance>>& candidates) {
  std::vector<uint64_t> loads;
  for (const auto& c : candidates) {
    loads.push_back(static_cast<uint64_t>(std::max<int64_t>(0, c->inflight.load())) +
                    table.LastLoad(c->id).outstanding_tokens());
  }
  return candidates[scheduler::LeastLoaded(loads)];
}

// Nothing usable: the one answer of every language placer.
absl::Status NoLanguageInstance() {
  return absl::UnavailableError(
      "no healthy language instance (role both, or prefill and decode together)");
}

// An elastic placement as the call relays it: degree 1 is colocated; a
// group's carriers are the sampler (when it is not the first master), then
// the masters in decode order.
Placement FromElastic(ElasticPlacement elastic) {
  Placement p{.instances = std::move(elastic.members), .plan = std::move(elastic.plan)};
  if (!p.plan) {
    p.carriers = {{.instance = 0}};
    return p;
  }
  p.flow = Placement::Flow::kElastic;
  const std::vector<int> masters = language::ElasticMasterChain(*p.plan);
  const size_t sampler = p.plan->sampler();
  if (masters.empty() || sampler != static_cast<size_t>(masters[0])) {
    p.carriers.push_back({.instance = sampler, .hand_over = HandOver::kFirstToken});
  }
  for (size_t k = 0; k < masters.size(); ++k) {
    p.carriers.push_back(
        {.instance = static_cast<size_t>(masters[k]),
         .hand_over = k + 1 < masters.size() ? HandOver::kMasterMoved : HandOver::kNever});
  }
  return p;
}

}  // namespace

bool BothPlacer::CanPlace() const { return !table_.Healthy(Role::kLanguage).empty(); }

void BothPlacer::Place(const PlaceRequest& request, OnPlaced on_placed) {
  std::vector<std::shared_ptr<Instance>> both = table_.Healthy(Role::kLanguage);
  both.erase(std::remove_if(both.begin(), both.end(),
                            [&](const std::shared_ptr<Instance>& i) {
                              return std::find(request.exclude.begin(), request.exclude.end(),
                                               i->id) != request.exclude.end();
                            }),
             both.end());
  if (both.empty()) {
    on_placed(NoLanguageInstance());
    return;
  }
  on_placed(Placement{.instances = {LeastLoaded(table_, both)}, .carriers = {{.instance = 0}}});
}

bool PdPlacer::CanPlace() const {
  return !table_.Healthy(Role::kPrefill).empty() && !table_.Healthy(Role::kDecode).empty();
}

void PdPlacer::Place(const PlaceRequest&, OnPlaced on_placed) {
  const std::vector<std::shared_ptr<Instance>> decoders = table_.Healthy(Role::kDecode);
  const std::vector<std::shared_ptr<Instance>> prefills = table_.Healthy(Role::kPrefill);
  if (decoders.empty() || prefills.empty()) {
    on_placed(NoLanguageInstance());
    return;
  }
  std::vector<uint64_t> pressure;
  for (const auto& d : decoders) {
    const internal::v1::LoadReport load = table_.LastLoad(d->id);
    pressure.push_back((uint64_t{0xffffffff} - load.kv_blocks_free()) << 24 |
                       std::min<uint64_t>(load.running(), 0xffffff));
  }
  on_placed(Placement{
      .flow = Placement::Flow::kDisaggregated,
      .instances = {LeastLoaded(table_, prefills), decoders[scheduler::LeastLoaded(pressure)]},
      .carriers = {{.instance = 0, .hand_over = HandOver::kKvHandedOff}, {.instance = 1}}});
}

bool ElasticPlacer::CanPlace() const { return pool_.CanPlace(); }

void ElasticPlacer::Place(const PlaceRequest& request, OnPlaced on_placed) {
  absl::StatusOr<ElasticLength> length =
      ElasticRequestLength(context_.options, context_.tokenizer, *request.request, *request.images);
  if (!length.ok()) {
    on_placed(length.status());
    return;
  }
  auto deliver = std::make_shared<OnPlaced>(std::move(on_placed));
  absl::Status queued = pool_.Submit(
      {.id = request.id,
       .prompt_tokens = length->prompt_tokens,
       .images = request.images->size(),
       .max_tokens = length->max_tokens,
       .deadline = request.deadline,
       .on_placed = [deliver](absl::StatusOr<ElasticPlacement> p) {
         (*deliver)(p.ok() ? absl::StatusOr<Placement>(FromElastic(*std::move(p))) : p.status());
       }});
  if (!queued.ok()) (*deliver)(std::move(queued));
}

void ElasticPlacer::PhaseChanged(const std::string& id, CallPhase phase, size_t carrier) {
  pool_.PhaseChanged(id, phase, carrier);
}

void ElasticPlacer::Released(const std::string& id) { pool_.Finished(id); }

std::unique_ptr<Placer> ChoosePlacer(const RouterContext& context) {
  if (context.elastic != nullptr) {
    auto elastic = std::make_unique<ElasticPlacer>(*context.elastic, context);
    if (elastic->CanPlace()) return elastic;
  }
  auto both = std::make_unique<BothPlacer>(*context.instances);
  if (both->CanPlace()) return both;
  return std::make_unique<PdPlacer>(*context.instances);
}

}  // namespace mmserve::router
