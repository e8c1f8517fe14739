// The router's view of every instance: registered through Registry (or given
// by flags), polled with GetLoad every `poll_interval`, and healthy while the
// poll succeeds and the instance accepts work. An instance that misses
// `down_after` polls in a row (or deregisters) leaves placement at once and
// the down listener hears of it, so calls that used it can move on.
//
//   EventLoop loop({.name = "router"});   // outlives the table
//   InstanceTable table({.poll_interval = absl::Milliseconds(250)});
//   table.SetDownListener([&](const Instance& i) { calls.OnInstanceDown(i); });
//   table.Start(loop);
//   for (const auto& e : table.Healthy(Role::kEncoder)) ...
//
// The polls are a timer on the router's EventLoop: every instance is
// polled at once (one slow instance must not delay the detection of
// another), the answers are applied on the loop, and the next round is
// `poll_interval` after that. The down listener runs on the loop.
//
// A report lags the router's own placements (a burst placed in one poll
// interval would all see the same report), so the table also remembers what
// the router placed on each instance since: Loads adds those charges to the
// last report, and a charge leaves once a report taken `report_catch_up`
// after it has come (the instance counts the request by then) or the call
// ends (Discharge). A placer holds placement_mutex() from Loads to Charge,
// so that concurrent placements see each other.
//
//   absl::MutexLock hold(table.placement_mutex());
//   std::vector<InstanceLoad> loads = table.Loads(Role::kLanguage);
//   ...  // choose
//   table.Charge(chosen->id, call_id, prompt_tokens);
//
// Thread-safe. Lock order: placement_mutex() before the table's own lock.
#ifndef MMSERVE_ROUTER_INSTANCE_TABLE_H_
#define MMSERVE_ROUTER_INSTANCE_TABLE_H_

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/event_loop.h"
#include "grpcpp/grpcpp.h"
#include "proto/encoder.grpc.pb.h"
#include "proto/language.grpc.pb.h"
#include "proto/registry.grpc.pb.h"
#include "router/prefix_index.h"

namespace mmserve::router {

namespace iv1 = ::mmserve::internal::v1;

// kLanguage: role both; kPrefill and kDecode: the disaggregated roles;
// kElastic: role elastic pooled for the elastic manager (router --elastic; without
// it an elastic instance is kLanguage).
enum class Role { kEncoder, kLanguage, kPrefill, kDecode, kElastic };

struct Instance {
  std::string id;
  Role role = Role::kEncoder;
  std::string address;
  iv1::InstanceInfo info;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<iv1::Encoder::Stub> encoder;    // role kEncoder
  std::unique_ptr<iv1::Language::Stub> language;  // the other roles
};

struct InstanceTableOptions {
  absl::Duration poll_interval = absl::Milliseconds(250);
  absl::Duration poll_timeout = absl::Milliseconds(500);
  int down_after = 2;
  absl::Duration heartbeat_timeout = absl::Seconds(3);
  // Role elastic instances become kElastic (else kLanguage).
  bool pool_elastic = false;
  // How long after a placement a report is sure to count the request (its
  // Prefill or Decode call has reached the instance).
  absl::Duration report_catch_up = absl::Milliseconds(50);
  // The prompts each instance holds (fed by the reports).
  PrefixIndexOptions prefix;
};

// An instance's latest load report and when the router got it.
struct LoadSnapshot {
  iv1::LoadReport load;
  absl::Time at = absl::InfinitePast();
};

// What the router placed on an instance that its last report does not count yet.
struct Unreported {
  uint32_t requests = 0;
  uint64_t tokens = 0;  // their prompt tokens (the router's estimate)
};

// A healthy instance's load as placement weighs it.
struct InstanceLoad {
  std::shared_ptr<Instance> instance;
  iv1::LoadReport report;  // the last one
  Unreported unreported;
  // Running, waiting and placed since the report.
  uint64_t requests() const {
    return uint64_t{report.running()} + report.waiting() + unreported.requests;
  }
  // Prompt tokens not yet computed, reported and placed since.
  uint64_t tokens() const { return report.outstanding_tokens() + unreported.tokens; }
};

class InstanceTable {
 public:
  explicit InstanceTable(const InstanceTableOptions& options) : options_(options) {}
  ~InstanceTable();
  InstanceTable(const InstanceTable&) = delete;
  InstanceTable& operator=(const InstanceTable&) = delete;

  // Adds or refreshes an instance (Registry.Register, or a flag). A new
  // address replaces the channel. Healthy from its first good poll on; a
  // registered instance also leaves placement when its heartbeats stop for
  // `heartbeat_timeout`.
  void Upsert(const iv1::InstanceInfo& info, bool registered = false);
  // FAILED_PRECONDITION when `info` runs the shm transport profile and a
  // known shm instance advertises another host (UcxPeer.host): shm peers
  // must share a host and IPC namespace (docs/deployment.md).
  [[nodiscard]] absl::Status Admit(const iv1::InstanceInfo& info) const;
  // Heartbeat: false when the instance is unknown (it should register again).
  bool Report(const iv1::LoadReport& load);
  void Remove(const std::string& id);

  // Healthy instances of a role, in id order.
  std::vector<std::shared_ptr<Instance>> Healthy(Role role) const;
  std::shared_ptr<Instance> Get(const std::string& id) const;
  iv1::LoadReport LastLoad(const std::string& id) const;
  LoadSnapshot LastLoadSnapshot(const std::string& id) const;
  bool IsHealthy(const std::string& id) const;

  // Healthy instances of a role with their load, in id order.
  std::vector<InstanceLoad> Loads(Role role) const;
  // Held by placers from Loads to Charge.
  absl::Mutex* placement_mutex() ABSL_LOCK_RETURNED(placement_mu_) { return &placement_mu_; }
  // Call `call_id` was placed on instance `id` with `tokens` prompt tokens.
  void Charge(const std::string& id, const std::string& call_id, uint64_t tokens);
  // Call `call_id` ended: its charge on `id`, if any is left, goes.
  void Discharge(const std::string& id, const std::string& call_id);
  // The prompts each instance holds, from its reports.
  PrefixIndex& prefix_index() { return prefix_index_; }

  void SetDownListener(std::function<void(const std::string& id)> listener);
  // Polls on `loop` until Stop; `loop` outlives the table (or is stopped
  // after it).
  void Start(EventLoop& loop);
  // Nothing of the table runs on the loop once this returns (it waits for
  // a round under way, at most poll_timeout). Idempotent.
  void Stop();

 private:
  struct Charged {
    std::string call_id;
    uint64_t tokens = 0;
    absl::Time at;
  };
  struct Entry {
    std::shared_ptr<Instance> instance;
    // Placements no report counts yet, oldest first.
    std::vector<Charged> unreported;
    iv1::LoadReport load;
    absl::Time load_at = absl::InfinitePast();
    bool healthy = false;
    int failures = 0;
    bool registered = false;
    absl::Time heartbeat_due = absl::InfiniteFuture();
  };
  struct PollRound;
  // Loop: the next round `poll_interval` from now.
  void SchedulePoll();
  // Loop: GetLoad to every instance at once; the last answer posts Apply.
  void Poll();
  // Loop: the round's answers; tells the down listener.
  void Apply(const PollRound& round);
  void MarkDown(const std::string& id, Entry& e, absl::string_view why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A report asked for at `asked` came: the charges it counts go.
  void CatchUp(Entry& e, absl::Time asked) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const InstanceTableOptions options_;
  PrefixIndex prefix_index_{options_.prefix};
  absl::Mutex placement_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  mutable absl::Mutex mu_;
  std::map<std::string, Entry> entries_ ABSL_GUARDED_BY(mu_);
  std::function<void(const std::string&)> on_down_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> down_events_ ABSL_GUARDED_BY(mu_);
  EventLoop* loop_ = nullptr;  // set by Start
  // Rounds whose GetLoad calls have not all answered (0 or 1).
  int polls_in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  // False from Stop on, set on the loop: the table's tasks still queued
  // there do nothing.
  const std::shared_ptr<std::atomic<bool>> alive_ = std::make_shared<std::atomic<bool>>(true);
};

}  // namespace mmserve::router

#endif  // MMSERVE_ROUTER_INSTANCE_TABLE_H_
