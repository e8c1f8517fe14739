// The router's global manager of elastic sequence parallelism (router --elastic;
// docs/elastic.md): the pool of elastic instances, the queue of
// requests waiting for KV slots, the slots promised to placed requests and
// each placed request's members (the span map).
//
//   EventLoop loop({.name = "router"});   // shared with the instance table
//   ElasticPool pool(table, metrics, loop, options);
//   pool.Start();
//   RETURN_IF_ERROR(pool.Submit({.id = id, .prompt_tokens = n, .max_tokens = m,
//                                .deadline = d, .on_placed = ...}));
//   ... on_placed(ElasticPlacement) runs on the loop: one member (degree
//   1: an ordinary Prefill call) or a group (an ElasticPrefill call to each)
//   pool.PhaseChanged(id, CallPhase::kDecoding, member);  // from the call
//   pool.Finished(id);   // the call ended: slots freed, Abort to a group
//
// The pool is the elastic placement policy (placer.h ElasticPlacer) and runs
// on the router's EventLoop: each iteration (an arrival, a finish, a first
// token, or every `tick`, a timer on the loop) runs
// scheduler::PlanElasticIteration over the pending requests, first come first
// served, and the healthy elastic instances not in a group prefill, with
// the step-time models refitted from the pool's own prefills (ElasticStepFit:
// the seconds from placement to first token of each text request placed on
// instances with nothing else live). What a
// placed request is doing (decoding yet, which member decodes it) it
// learns from the call's phase changes.
// An instance's free slots are the least of (a) its latest load report's
// free slots less what was promised on it since that report and (b) its
// capacity less every promise of a live request on it. A promise is the
// request's whole future KV (prompt + max_tokens - 1, in blocks) where the
// retention plan puts it, held until the call ends, so decode growth is
// reserved up front (the manager's decode_growth_blocks stays 0).
//
// A batch at degree 1 places each of its requests on its instance. A batch
// at degree d > 1 places its first request on the d instances as a group;
// the others stay pending for a later iteration (a member runs one group
// prefill at a time). A group's instances leave the pool until its first
// token (or its end).
//
// Refusals: Submit answers RESOURCE_EXHAUSTED at once for a request whose
// KV exceeds the slots of the largest group the pool could ever form (the
// same code a role-both instance gives a request beyond its pool) or when
// the queue is full, UNAVAILABLE without a healthy elastic instance. A
// queued request gets DEADLINE_EXCEEDED at its deadline and
// RESOURCE_EXHAUSTED after `max_queue_wait`.
//
// Thread-safe. on_placed runs on the loop with no lock of the pool held.
#ifndef MMSERVE_ROUTER_ELASTIC_POOL_H_
#define MMSERVE_ROUTER_ELASTIC_POOL_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/event_loop.h"
#include "common/metrics.h"
#include "proto/language.pb.h"
#include "router/call_phase.h"
#include "router/elastic_step_fit.h"
#include "router/instance_table.h"
#include "scheduler/elastic_manager.h"

namespace mmserve::router {

struct ElasticPoolOptions {
  // The manager's configuration. block_size is replaced by the elastic
  // instances' registered block size when they give one.
  scheduler::ElasticConfig config;
  absl::Duration tick = absl::Milliseconds(20);
  absl::Duration max_queue_wait = absl::Seconds(60);
  size_t max_pending = 1024;
  // Deadline of each Abort sent to a group's members.
  absl::Duration abort_timeout = absl::Seconds(2);
};

// Where a request runs.
struct ElasticPlacement {
  // In plan order; one instance at degree 1.
  std::vector<std::shared_ptr<Instance>> members;
  // Groups only: the plan, each member's endpoint copied from its
  // registration.
  std::optional<internal::v1::ElasticPlan> plan;
};

struct ElasticDemand {
  std::string id;
  int64_t prompt_tokens = 0;
  // Images to gather first: such a request's time to its first token is no
  // sample of the prefill's (ElasticStepFit).
  size_t images = 0;
  int64_t max_tokens = 1;  // tokens to generate at most, >= 1
  std::chrono::system_clock::time_point deadline = std::chrono::system_clock::time_point::max();
  std::function<void(absl::StatusOr<ElasticPlacement>)> on_placed;
};

class ElasticPool {
 public:
  // `loop` outlives the pool (or is stopped after it).
  ElasticPool(InstanceTable& table, metrics::Registry& metrics, EventLoop& loop,
              ElasticPoolOptions options);
  ~ElasticPool();
  ElasticPool(const ElasticPool&) = delete;
  ElasticPool& operator=(const ElasticPool&) = delete;

  // Starts the manager's tick on the loop; Stop ends it and refuses what is
  // queued (UNAVAILABLE). Nothing of the pool runs on the loop after Stop.
  void Start();
  void Stop();

  // Whether the pool has a healthy elastic instance.
  bool CanPlace() const;

  // Queues a request (see the refusals above); on_placed runs exactly once
  // later unless Finished(id) comes first.
  [[nodiscard]] absl::Status Submit(ElasticDemand demand) ABSL_LOCKS_EXCLUDED(mu_);
  // The call `id` entered `phase` with member `carrier` carrying its
  // tokens. Past kPrefilling it decodes: its group's instances rejoin the
  // pool, and it counts in its master's decode batch. In kHandedOver a
  // carrier other than the master is the next master (its decode batch is
  // that instance's from now on; mmserve_router_elastic_master_moves_total).
  void PhaseChanged(const std::string& id, CallPhase phase, size_t carrier)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The call ended, whatever the way: drops it from the queue or frees its
  // promises, and sends Abort(id) to every member of its group (bounded by
  // abort_timeout, not waited for). Idempotent.
  void Finished(const std::string& id) ABSL_LOCKS_EXCLUDED(mu_);

  // One iteration now (the loop runs them; tests call it too).
  void RunIteration() ABSL_LOCKS_EXCLUDED(mu_);

  struct Stats {
    size_t pending = 0;
    int64_t promised_slots = 0;
    // Live requests and the members of each (the span map).
    std::map<std::string, std::vector<std::string>> members;
    std::map<std::string, int64_t> promised_by_instance, capacity_by_instance;
    // The step-time models the next iteration plans by, and the degrees
    // among them fitted to the pool's measured prefills.
    std::vector<scheduler::StepTimeModel> step_models;
    std::vector<int> fitted_degrees;
  };
  Stats stats() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Pending {
    ElasticDemand demand;
    absl::Time since;
  };
  // A placed request, until Finished.
  struct Live {
    std::vector<std::shared_ptr<Instance>> members;
    std::vector<int64_t> promised;  // slots, per member
    size_t master = 0;              // the member that decodes it
    bool group = false;
    absl::Time placed_at;
    CallPhase phase = CallPhase::kPlacing;  // the call's, as it last said
    absl::Time first_token_at;
    int64_t max_tokens = 1;  // its output length at most
    int64_t prompt_tokens = 0;
    // Its time to the first token is a prefill sample: a text request placed
    // on instances with no other live request.
    bool sample = false;
  };
  using Delivery = std::pair<std::function<void(absl::StatusOr<ElasticPlacement>)>,
                             absl::StatusOr<ElasticPlacement>>;

  // Runs an iteration on the loop soon (one at a time however many ask).
  void Wake() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The next tick, `tick` from now.
  void ScheduleTick();
  static bool Decoding(const Live& live) { return live.phase > CallPhase::kPrefilling; }
  int64_t BlockSize(const std::vector<std::shared_ptr<Instance>>& pool) const;
  int64_t CapacitySlots(const Instance& instance) const;
  int64_t FreeSlots(const Instance& instance) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool InGroupPrefill(const std::string& instance_id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether a live request has the instance among its members.
  bool Busy(const std::string& instance_id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Queued requests past their deadline or the queue wait.
  void Expire(std::vector<Delivery>& out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs the manager over the queue and places what it dispatches.
  void Plan(std::vector<Delivery>& out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  scheduler::ElasticPoolState PoolState(const std::vector<std::shared_ptr<Instance>>& pool,
                                        int64_t block_size) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Records `live` under `id` and its delivery.
  void Place(Pending& pending, Live live, std::optional<internal::v1::ElasticPlan> plan,
             std::vector<Delivery>& out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SetGauges() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SendAborts(const std::string& id, const std::vector<std::shared_ptr<Instance>>& members);

  InstanceTable& table_;
  EventLoop& loop_;
  // Resolved once.
  std::vector<metrics::Counter*> requests_by_degree_;  // [degree - 1]
  metrics::Counter& master_moves_;
  metrics::Counter& aborts_sent_;
  metrics::Gauge& pending_gauge_;
  metrics::Gauge& promised_gauge_;
  const ElasticPoolOptions options_;
  mutable absl::Mutex mu_;
  std::deque<Pending> pending_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Live> live_ ABSL_GUARDED_BY(mu_);
  // Seconds a request decodes, on average (weight 0.2 for the newest).
  double avg_decode_seconds_ ABSL_GUARDED_BY(mu_) = 0;
  ElasticStepFit step_fit_ ABSL_GUARDED_BY(mu_);
  // The last group placed (ElasticPlan.group): each group's is new.
  uint64_t last_group_ ABSL_GUARDED_BY(mu_) = 0;
  bool wake_ ABSL_GUARDED_BY(mu_) = false;  // an iteration is posted
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // False from Stop on, set on the loop: the pool's tasks still queued
  // there do nothing.
  const std::shared_ptr<std::atomic<bool>> alive_ = std::make_shared<std::atomic<bool>>(true);
};

}  // namespace mmserve::router

#endif  // MMSERVE_ROUTER_ELASTIC_POOL_H_
