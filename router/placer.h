// Where a Generate call's language side runs, decided before the call opens
// any stream: a Placer returns a Placement (the instances, an elastic
// group's plan, and the carrier order: which of the call's token streams
// carries the tokens, in turn). The call (generate_call.h) then relays
// that chain the same way for every flow:
//
//   colocated (BothPlacer):    [prefill]
//   P/D (PdPlacer):            [prefill -> decode]
//   elastic (ElasticPlacer):       [sampler -> master0 -> master1 ...]
//
//   std::unique_ptr<Placer> placer = ChoosePlacer(context);
//   placer->Place({.id = id, ...}, [call](absl::StatusOr<Placement> p) { ... });
//   placer->PhaseChanged(id, CallPhase::kDecoding, carrier);  // the call moved on
//   placer->Released(id);                                     // the call ended
//
// A placer can place (CanPlace) while the instance table has healthy
// instances of its roles; ChoosePlacer takes the first that can of elastic
// (router --elastic), role both, then prefill and decode.
//
// Thread-safe. on_placed may run inline in Place, or later on another
// thread (elastic: the pool's loop), never under a lock of the placer.
#ifndef MMSERVE_ROUTER_PLACER_H_
#define MMSERVE_ROUTER_PLACER_H_

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "proto/inference.pb.h"
#include "proto/language.pb.h"
#include "router/call_phase.h"
#include "router/instance_table.h"
#include "router/request_validation.h"
#include "scheduler/prompt_prefix.h"

namespace mmserve::router {

class ElasticPool;
struct RouterContext;

// How a carrier gives the tokens to the next one of the order.
enum class HandOver : uint8_t {
  // The last carrier: it carries the final response.
  kNever,
  // P/D prefill: after its batch with kv_handed_off (the KV is on the decode
  // instance).
  kKvHandedOff,
  // Elastic sampler: after its first token, or when it closes OK without one.
  kFirstToken,
  // Elastic master: its batch with elastic_moved (not relayed); the call passes
  // that state to the next master (ElasticMoveMaster).
  kMasterMoved,
};

// One link of the carrier order: the stream of `instance` (an index into
// Placement::instances) and how it hands over.
struct Carrier {
  size_t instance = 0;
  HandOver hand_over = HandOver::kNever;
};

struct Placement {
  // Which streams the call opens on the instances.
  enum class Flow : uint8_t {
    kColocated,      // a Prefill stream on instances[0] (role both, or elastic degree 1)
    kDisaggregated,  // a Decode stream on instances[1]; once it holds the request, Prefill on [0]
    kElastic,        // an ElasticPrefill stream on every member of `plan`
  };
  Flow flow = Flow::kColocated;
  // The language instances, one stream each: charged the call's tokens,
  // and their loss ends it. The first receives the images.
  std::vector<std::shared_ptr<Instance>> instances;
  // Elastic groups only: the plan, each member's endpoint filled in.
  std::optional<internal::v1::ElasticPlan> plan;
  // Non-empty; the last hands over kNever.
  std::vector<Carrier> carriers;
  // Role both and P/D: the images and videos of a chat in the messages
  // whose KV instances[0] holds, by the prefix index (what a repeat turn
  // sends to an encoder again although the instance holds its KV).
  uint32_t media_on_held_prefix = 0;
};

// What a placer knows of the request.
struct PlaceRequest {
  std::string id;
  const mmserve::v1::GenerateRequest* request = nullptr;
  const std::vector<PreparedMedia>* images = nullptr;
  std::chrono::system_clock::time_point deadline;
  // Instance ids not to place on (a call moving off instances it lost).
  std::vector<std::string> exclude;
};

class Placer {
 public:
  using OnPlaced = std::function<void(absl::StatusOr<Placement>)>;
  virtual ~Placer() = default;

  // Whether the placer has usable instances now.
  virtual bool CanPlace() const = 0;
  // Places the request: on_placed runs exactly once (inline or later),
  // unless Released(id) comes first.
  virtual void Place(const PlaceRequest& request, OnPlaced on_placed) = 0;
  // The call `id` entered `phase`; `carrier` (an index into the
  // placement's instances) carries its tokens now.
  virtual void PhaseChanged(const std::string& id, CallPhase phase, size_t carrier) {}
  // The call ended, whatever the way (also before it was placed).
  virtual void Released(const std::string& id) {}
};

// The prompt tokens a request puts on a language instance, as the router
// tells without tokenizing: a token per 4 bytes of text (or its token ids),
// plus each image's or video's embedding rows (kUnsizedMediaTokens when not
// pre-sized).
inline constexpr uint64_t kUnsizedMediaTokens = 64;
// What one request (running, waiting or just placed) weighs in a cost, in
// prompt tokens.
inline constexpr uint64_t kRequestTokens = 64;
uint64_t EstimatePromptTokens(const PlaceRequest& request);

// Placement over the instance table's load (report plus what the router
// placed since, instance_table.h): the chosen instances are charged the
// request's prompt tokens until their reports count it or the call ends.
class TablePlacer : public Placer {
 public:
  explicit TablePlacer(InstanceTable& table) : table_(table) {}
  void Released(const std::string& id) override;

 protected:
  // Charges `instances` with the request (under the table's placement mutex).
  void Charge(const PlaceRequest& request, uint64_t tokens,
              const std::vector<std::shared_ptr<Instance>>& instances);
  // `instance` computes the prompt of `prefix` (`tokens` long): the prefix
  // index counts it there until the instance's report lists it.
  void Computes(const std::string& instance, const scheduler::PrefixKeys& prefix, uint64_t tokens);
  InstanceTable& table_;

 private:
  absl::Mutex mu_;
  std::vector<std::string> charged_ ABSL_GUARDED_BY(mu_);  // instance ids
};

// Role both: the usable instance of the lowest cost: its load (tokens to
// compute, kRequestTokens per request, reported or placed since), less the
// prompt's tokens it holds cached (PrefixIndex, times its weight), plus
// the uncached tokens its free KV cannot hold (docs/routing.md).
class BothPlacer final : public TablePlacer {
 public:
  using TablePlacer::TablePlacer;
  bool CanPlace() const override;
  void Place(const PlaceRequest& request, OnPlaced on_placed) override;
};

// Roles prefill and decode: the decode instance with the most free KV
// blocks (then the fewest sequences), both counting what the router placed
// since its report; the prefill instance of the lowest cost (as BothPlacer).
class PdPlacer final : public TablePlacer {
 public:
  using TablePlacer::TablePlacer;
  bool CanPlace() const override;
  void Place(const PlaceRequest& request, OnPlaced on_placed) override;
};

// router --elastic: the elastic pool (elastic_pool.h) places the request once it
// has KV slots for it, on one instance (degree 1, colocated) or a group.
class ElasticPlacer final : public Placer {
 public:
  ElasticPlacer(ElasticPool& pool, const RouterContext& context) : pool_(pool), context_(context) {}
  bool CanPlace() const override;
  // The request's size (elastic_prompt.h) first: an error is the placement's.
  void Place(const PlaceRequest& request, OnPlaced on_placed) override;
  void PhaseChanged(const std::string& id, CallPhase phase, size_t carrier) override;
  void Released(const std::string& id) override;

 private:
  ElasticPool& pool_;
  const RouterContext& context_;
};

// The placer for a new call: elastic under router --elastic while it has an
// elastic instance, else role both, else P/D (which refuses with
// UNAVAILABLE when it has no pair either).
std::unique_ptr<Placer> ChoosePlacer(const RouterContext& context);

}  // namespace mmserve::router

#endif  // MMSERVE_ROUTER_PLACER_H_
