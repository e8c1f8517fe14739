#include "router/instance_table.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/grpc_server.h"
#include "common/logging.h"

namespace mmserve::router {

InstanceTable::~InstanceTable() { Stop(); }

absl::Status InstanceTable::Admit(const iv1::InstanceInfo& info) const {
  if (info.ucx().transport_profile() != "shm" || info.ucx().host().empty()) {
    return absl::OkStatus();
  }
  absl::MutexLock lock(&mu_);
  for (const auto& [id, e] : entries_) {
    if (e.instance == nullptr) continue;
    const iv1::UcxPeer& peer = e.instance->info.ucx();
    if (id == info.instance_id() || peer.transport_profile() != "shm" || peer.host().empty() ||
        peer.host() == info.ucx().host()) {
      continue;
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "transport profile shm needs every instance on one host and IPC namespace, but ",
        info.instance_id(), " runs on another host than ", id,
        ": across hosts start every process with --profile=tcp"));
  }
  return absl::OkStatus();
}

void InstanceTable::Upsert(const iv1::InstanceInfo& info, bool registered) {
  absl::MutexLock lock(&mu_);
  Entry& e = entries_[info.instance_id()];
  e.registered = registered;
  if (registered) e.heartbeat_due = absl::Now() + options_.heartbeat_timeout;
  if (e.instance == nullptr || e.instance->address != info.grpc_address()) {
    auto inst = std::make_shared<Instance>();
    inst->id = info.instance_id();
    switch (info.role()) {
      case iv1::INSTANCE_ROLE_ENCODER:
        inst->role = Role::kEncoder;
        break;
      case iv1::INSTANCE_ROLE_PREFILL:
        inst->role = Role::kPrefill;
        break;
      case iv1::INSTANCE_ROLE_DECODE:
        inst->role = Role::kDecode;
        break;
      case iv1::INSTANCE_ROLE_ELASTIC:
        inst->role = options_.pool_elastic ? Role::kElastic : Role::kLanguage;
        break;
      default:
        inst->role = Role::kLanguage;
    }
    inst->address = info.grpc_address();
    inst->info = info;
    inst->channel = InternalChannel(info.grpc_address());
    if (inst->role == Role::kEncoder) {
      inst->encoder = iv1::Encoder::NewStub(inst->channel);
    } else {
      inst->language = iv1::Language::NewStub(inst->channel);
    }
    if (e.healthy) MarkDown(info.instance_id(), e, "registered again at a new address");
    e.instance = std::move(inst);
    e.unreported.clear();
    prefix_index_.Remove(info.instance_id());
    e.failures = 0;
    LOG(INFO) << "instance " << info.instance_id() << " at " << info.grpc_address() << " ("
              << iv1::InstanceRole_Name(info.role()) << ")";
  }
}

bool InstanceTable::Report(const iv1::LoadReport& load) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(load.instance_id());
  if (it == entries_.end()) return false;
  it->second.load = load;
  it->second.load_at = absl::Now();
  CatchUp(it->second, it->second.load_at);
  prefix_index_.Update(load.instance_id(), load, it->second.load_at);
  if (it->second.registered) it->second.heartbeat_due = absl::Now() + options_.heartbeat_timeout;
  return true;
}

void InstanceTable::Remove(const std::string& id) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(id);
  if (it == entries_.end()) return;
  if (it->second.healthy) MarkDown(id, it->second, "deregistered");
  entries_.erase(it);
  prefix_index_.Remove(id);
  LOG(INFO) << "instance " << id << " deregistered";
}

std::vector<std::shared_ptr<Instance>> InstanceTable::Healthy(Role role) const {
  std::vector<std::shared_ptr<Instance>> out;
  absl::MutexLock lock(&mu_);
  for (const auto& [id, e] : entries_) {
    if (e.healthy && e.instance->role == role) out.push_back(e.instance);
  }
  return out;
}

std::shared_ptr<Instance> InstanceTable::Get(const std::string& id) const {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(id);
  return it == entries_.end() ? nullptr : it->second.instance;
}

iv1::LoadReport InstanceTable::LastLoad(const std::string& id) const {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(id);
  return it == entries_.end() ? iv1::LoadReport() : it->second.load;
}

LoadSnapshot InstanceTable::LastLoadSnapshot(const std::string& id) const {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(id);
  if (it == entries_.end()) return {};
  return {it->second.load, it->second.load_at};
}

bool InstanceTable::IsHealthy(const std::string& id) const {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(id);
  return it != entries_.end() && it->second.healthy;
}

std::vector<InstanceLoad> InstanceTable::Loads(Role role) const {
  std::vector<InstanceLoad> out;
  absl::MutexLock lock(&mu_);
  for (const auto& [id, e] : entries_) {
    if (!e.healthy || e.instance->role != role) continue;
    InstanceLoad& l = out.emplace_back(InstanceLoad{.instance = e.instance, .report = e.load});
    for (const Charged& c : e.unreported) {
      ++l.unreported.requests;
      l.unreported.tokens += c.tokens;
    }
  }
  return out;
}

void InstanceTable::Charge(const std::string& id, const std::string& call_id, uint64_t tokens) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(id);
  if (it == entries_.end()) return;
  it->second.unreported.push_back({.call_id = call_id, .tokens = tokens, .at = absl::Now()});
}

void InstanceTable::Discharge(const std::string& id, const std::string& call_id) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(id);
  if (it == entries_.end()) return;
  std::vector<Charged>& u = it->second.unreported;
  u.erase(
      std::remove_if(u.begin(), u.end(), [&](const Charged& c) { return c.call_id == call_id; }),
      u.end());
}

void InstanceTable::CatchUp(Entry& e, absl::Time asked) {
  const absl::Time counted = asked - options_.report_catch_up;
  std::vector<Charged>& u = e.unreported;
  u.erase(u.begin(),
          std::find_if(u.begin(), u.end(), [&](const Charged& c) { return c.at > counted; }));
}

void InstanceTable::SetDownListener(std::function<void(const std::string&)> listener) {
  absl::MutexLock lock(&mu_);
  on_down_ = std::move(listener);
}

void InstanceTable::Start(EventLoop& loop) {
  loop_ = &loop;
  SchedulePoll();
}

void InstanceTable::Stop() {
  if (loop_ == nullptr) return;
  // Once this returns no task of the table runs on the loop (a stopped
  // loop runs none).
  const absl::Status s = loop_->RunAndWait([alive = alive_] {
    *alive = false;
    return absl::OkStatus();
  });
  if (!s.ok()) *alive_ = false;
  // A round under way touches the table until its last answer.
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](int* n) { return *n == 0; }, &polls_in_flight_));
}

void InstanceTable::MarkDown(const std::string& id, Entry& e, absl::string_view why) {
  e.healthy = false;
  down_events_.push_back(id);
  LOG(WARNING) << "instance " << id << " is unhealthy: " << why;
}

// One round of GetLoad calls, shared by their callbacks.
struct InstanceTable::PollRound {
  struct Poll {
    grpc::ClientContext ctx;
    iv1::LoadRequest request;
    iv1::LoadReport load;
    grpc::Status status;
  };
  std::vector<std::shared_ptr<Instance>> instances;
  std::vector<std::unique_ptr<Poll>> polls;  // one per instance
  absl::Time asked = absl::Now();
  std::atomic<size_t> outstanding{0};
};

void InstanceTable::SchedulePoll() {
  loop_->PostAfter(options_.poll_interval, [this, alive = alive_] {
    if (*alive) Poll();
  });
}

void InstanceTable::Poll() {
  auto round = std::make_shared<PollRound>();
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, e] : entries_) round->instances.push_back(e.instance);
    ++polls_in_flight_;
  }
  const auto deadline =
      std::chrono::system_clock::now() + absl::ToChronoNanoseconds(options_.poll_timeout);
  round->outstanding = round->instances.size() + 1;  // + this function's share
  // The last to finish (a callback or this function) applies the round.
  auto finish = [this, alive = alive_](const std::shared_ptr<PollRound>& r) {
    if (--r->outstanding > 0) return;
    loop_->Post([this, alive, r] {
      if (!*alive) return;
      Apply(*r);
      SchedulePoll();
    });
    absl::MutexLock lock(&mu_);
    --polls_in_flight_;
  };
  for (const auto& inst : round->instances) {
    round->polls.push_back(std::make_unique<PollRound::Poll>());
    PollRound::Poll* p = round->polls.back().get();
    p->ctx.set_deadline(deadline);
    auto cb = [p, round, finish](grpc::Status s) {
      p->status = std::move(s);
      finish(round);
    };
    if (inst->role == Role::kEncoder) {
      inst->encoder->async()->GetLoad(&p->ctx, &p->request, &p->load, cb);
    } else {
      inst->language->async()->GetLoad(&p->ctx, &p->request, &p->load, cb);
    }
  }
  finish(round);
}

void InstanceTable::Apply(const PollRound& round) {
  std::vector<std::string> down;
  std::function<void(const std::string&)> listener;
  {
    absl::MutexLock lock(&mu_);
    for (size_t i = 0; i < round.instances.size(); ++i) {
      const std::shared_ptr<Instance>& inst = round.instances[i];
      auto it = entries_.find(inst->id);
      if (it == entries_.end() || it->second.instance != inst) continue;
      Entry& e = it->second;
      const PollRound::Poll& p = *round.polls[i];
      if (p.status.ok() && p.load.instance_id() == inst->id) {
        e.failures = 0;
        e.load = p.load;
        e.load_at = absl::Now();
        CatchUp(e, round.asked);
        prefix_index_.Update(inst->id, p.load, e.load_at);
        const bool ok = p.load.accepting() && absl::Now() < e.heartbeat_due;
        if (ok && !e.healthy) LOG(INFO) << "instance " << inst->id << " is healthy";
        if (!ok && e.healthy) {
          MarkDown(inst->id, e,
                   p.load.accepting() ? "its heartbeats stopped" : "it stopped accepting work");
        }
        e.healthy = ok;
      } else if (++e.failures >= options_.down_after && e.healthy) {
        MarkDown(inst->id, e,
                 absl::StrCat(e.failures, " load polls failed in a row, the last ",
                              p.status.error_message()));
      }
    }
    down.swap(down_events_);
    listener = on_down_;
  }
  if (listener) {
    for (const std::string& id : down) listener(id);
  }
}

}  // namespace mmserve::router
