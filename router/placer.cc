#include "router/placer.h"

#include <algorithm>
#include <utility>

#include "language_service/elastic_plan.h"
#include "router/elastic_pool.h"
#include "router/elastic_prompt.h"
#include "router/router_context.h"
#include "scheduler/placement.h"
#include "scheduler/prompt_prefix.h"

namespace mmserve::router {
namespace {

// The prompt as placement sees it.
struct Prompt {
  uint64_t tokens = 0;  // EstimatePromptTokens
  scheduler::PrefixKeys prefix;
};

Prompt PromptOf(const PlaceRequest& request) {
  Prompt p{.tokens = EstimatePromptTokens(request)};
  std::vector<ContentHash> media;
  if (request.images != nullptr) {
    for (const PreparedMedia& m : *request.images) media.push_back(m.hash);
  }
  const mmserve::v1::GenerateRequest& r = *request.request;
  p.prefix = r.has_chat() ? scheduler::ChatPrefixKeys(r.chat(), media)
                          : scheduler::RawPrefixKeys(r.raw(), media);
  return p;
}

// The instance of `candidates` of the lowest cost (docs/routing.md):
//   load + kv_short - weight * cached
// load: tokens to compute and kRequestTokens per request (reported and
// placed since); cached: the prompt's tokens the instance holds
// (PrefixIndex); kv_short: the uncached tokens its free KV cannot hold.
std::shared_ptr<Instance> Cheapest(const std::vector<InstanceLoad>& candidates,
                                   const Prompt& prompt, const PrefixIndex& index) {
  const double weight = index.options().weight;
  const absl::Time now = absl::Now();
  size_t best = 0;
  double best_cost = 0;
  for (size_t k = 0; k < candidates.size(); ++k) {
    const InstanceLoad& c = candidates[k];
    const uint64_t cached =
        weight > 0 ? index.CachedTokens(c.instance->id, prompt.prefix.keys, now) : 0;
    const uint64_t uncached = prompt.tokens - std::min(prompt.tokens, cached);
    const uint64_t free_slots = c.report.kv_token_slots_free() -
                                std::min(c.report.kv_token_slots_free(), c.unreported.tokens);
    const uint64_t kv_short = uncached - std::min(uncached, free_slots);
    const double cost = static_cast<double>(c.tokens() + kRequestTokens * c.requests() + kv_short) -
                        weight * static_cast<double>(cached);
    if (k == 0 || cost < best_cost) {
      best = k;
      best_cost = cost;
    }
  }
  return candidates[best].instance;
}

// The images and videos of `request`'s chat in the messages whose KV
// `instance` holds, by `index` (a raw prompt's: 0).
uint32_t MediaOnHeldPrefix(const PlaceRequest& request, const Prompt& prompt,
                           const Instance& instance, const PrefixIndex& index) {
  const mmserve::v1::GenerateRequest& r = *request.request;
  if (!r.has_chat()) return 0;
  const size_t held = index.HeldPrefix(instance.id, prompt.prefix.keys, absl::Now()).keys;
  uint32_t media = 0;
  for (size_t m = 0; m < held && m < static_cast<size_t>(r.chat().messages_size()); ++m) {
    for (const auto& part : r.chat().messages(static_cast<int>(m)).content()) {
      media += part.has_image() || part.has_video();
    }
  }
  return media;
}

// The decode instance with the most free KV blocks, then the fewest
// sequences, both counting the requests placed since its report.
std::shared_ptr<Instance> MostFreeKv(const std::vector<InstanceLoad>& decoders) {
  std::vector<uint64_t> pressure;
  for (const InstanceLoad& d : decoders) {
    const uint64_t block = std::max<uint32_t>(1, d.instance->info.capacity().kv_block_size());
    // A placed request takes at least one block.
    const uint64_t placed_blocks =
        (d.unreported.tokens + block - 1) / block + d.unreported.requests;
    const uint64_t free =
        d.report.kv_blocks_free() - std::min<uint64_t>(d.report.kv_blocks_free(), placed_blocks);
    pressure.push_back((uint64_t{0xffffffff} - free) << 24 |
                       std::min<uint64_t>(d.requests(), 0xffffff));
  }
  return decoders[scheduler::LeastLoaded(pressure)].instance;
}

uint64_t TextTokens(size_t bytes) { return (bytes + 3) / 4; }

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

uint64_t EstimatePromptTokens(const PlaceRequest& request) {
  uint64_t tokens = 0;
  const mmserve::v1::GenerateRequest& r = *request.request;
  if (r.has_chat()) {
    for (const auto& m : r.chat().messages()) {
      for (const auto& p : m.content()) tokens += TextTokens(p.text().size());
      for (const auto& call : m.tool_calls()) tokens += TextTokens(call.arguments().size());
    }
  } else if (r.raw().token_ids_size() > 0) {
    tokens += static_cast<uint64_t>(r.raw().token_ids_size());
  } else {
    tokens += TextTokens(r.raw().text().size());
  }
  if (request.images != nullptr) {
    for (const PreparedMedia& m : *request.images) {
      tokens += m.grid ? static_cast<uint64_t>(m.grid->num_tokens()) : kUnsizedMediaTokens;
    }
  }
  return tokens;
}

void TablePlacer::Charge(const PlaceRequest& request, uint64_t tokens,
                         const std::vector<std::shared_ptr<Instance>>& instances) {
  absl::MutexLock lock(&mu_);
  for (const auto& i : instances) {
    table_.Charge(i->id, request.id, tokens);
    charged_.push_back(i->id);
  }
}

void TablePlacer::Computes(const std::string& instance, const scheduler::PrefixKeys& prefix,
                           uint64_t tokens) {
  if (prefix.keys.empty() || table_.prefix_index().options().weight <= 0) return;
  table_.prefix_index().Insert(instance, prefix.keys.back(),
                               static_cast<uint64_t>(prefix.covered * tokens), absl::Now());
}

void TablePlacer::Released(const std::string& id) {
  std::vector<std::string> charged;
  {
    absl::MutexLock lock(&mu_);
    charged.swap(charged_);
  }
  for (const std::string& instance : charged) table_.Discharge(instance, id);
}

bool BothPlacer::CanPlace() const { return !table_.Healthy(Role::kLanguage).empty(); }

void BothPlacer::Place(const PlaceRequest& request, OnPlaced on_placed) {
  const Prompt prompt = PromptOf(request);
  std::shared_ptr<Instance> chosen;
  uint32_t held_media = 0;
  {
    absl::MutexLock hold(table_.placement_mutex());
    std::vector<InstanceLoad> both = table_.Loads(Role::kLanguage);
    // A migrating call leaves out the instances it lost.
    both.erase(std::remove_if(both.begin(), both.end(),
                              [&](const InstanceLoad& l) {
                                return std::find(request.exclude.begin(), request.exclude.end(),
                                                 l.instance->id) != request.exclude.end();
                              }),
               both.end());
    if (!both.empty()) {
      chosen = Cheapest(both, prompt, table_.prefix_index());
      held_media = MediaOnHeldPrefix(request, prompt, *chosen, table_.prefix_index());
      Charge(request, prompt.tokens, {chosen});
      Computes(chosen->id, prompt.prefix, prompt.tokens);
    }
  }
  if (chosen == nullptr) {
    on_placed(NoLanguageInstance());
    return;
  }
  on_placed(Placement{.instances = {std::move(chosen)},
                      .carriers = {{.instance = 0}},
                      .media_on_held_prefix = held_media});
}

bool PdPlacer::CanPlace() const {
  return !table_.Healthy(Role::kPrefill).empty() && !table_.Healthy(Role::kDecode).empty();
}

void PdPlacer::Place(const PlaceRequest& request, OnPlaced on_placed) {
  const Prompt prompt = PromptOf(request);
  std::vector<std::shared_ptr<Instance>> pair;
  uint32_t held_media = 0;
  {
    absl::MutexLock hold(table_.placement_mutex());
    const std::vector<InstanceLoad> decoders = table_.Loads(Role::kDecode);
    const std::vector<InstanceLoad> prefills = table_.Loads(Role::kPrefill);
    if (!decoders.empty() && !prefills.empty()) {
      pair = {Cheapest(prefills, prompt, table_.prefix_index()), MostFreeKv(decoders)};
      held_media = MediaOnHeldPrefix(request, prompt, *pair[0], table_.prefix_index());
      Charge(request, prompt.tokens, pair);
      Computes(pair[0]->id, prompt.prefix, prompt.tokens);
    }
  }
  if (pair.empty()) {
    on_placed(NoLanguageInstance());
    return;
  }
  on_placed(
      Placement{.flow = Placement::Flow::kDisaggregated,
                .instances = std::move(pair),
                .carriers = {{.instance = 0, .hand_over = HandOver::kKvHandedOff}, {.instance = 1}},
                .media_on_held_prefix = held_media});
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
