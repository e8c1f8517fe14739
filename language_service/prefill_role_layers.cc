// Role prefill's layer-wise hand-off (prefill_role.h): AllocateKv when the
// forward of the prompt's last rows is past its first layer, each layer
// group written to the decode ranks while the forward computes the next
// ones, CommitKv once the first token is out.
//
// Who touches a LayerStream: the loop thread (the hooks, TakeEvent,
// Release) and one hand-off thread at a time (Allocate, then StreamLayers);
// `mu` orders them. The loop never waits on a hand-off thread but in
// OnPromptEnded of a request that finished without a hand-off while its
// groups were being written (its blocks are freed when that returns).
#include <algorithm>
#include <chrono>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "common/grpc_server.h"
#include "common/grpc_status.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "language_service/kv_bytes_moved.h"
#include "language_service/prefill_role.h"

namespace mmserve::language {
namespace {

// Role prefill's connector with the layer-wise hooks: they go to the role.
class LayerwiseConnector final : public worker::PrefillKvConnector {
 public:
  explicit LayerwiseConnector(PrefillRole& role) : role_(role) {}
  void OnPromptQueued(absl::string_view id, const worker::HandoffPrompt& prompt) override {
    role_.OnPromptQueued(std::string(id), prompt);
  }
  bool WantsLayers() const override { return true; }
  void OnLayersWritten(const worker::KvLayersWritten& written) override {
    role_.OnLayersWritten(written);
  }
  bool OnPromptDone(const worker::KvPromptDone& done) override {
    const bool hand_off = PrefillKvConnector::OnPromptDone(done);
    if (hand_off) handed_off_.emplace(done.id);
    return hand_off;
  }
  void OnFinished(absl::string_view id) override {
    role_.OnPromptEnded(std::string(id), handed_off_.erase(id) > 0);
  }

 private:
  PrefillRole& role_;
  absl::flat_hash_set<std::string> handed_off_;  // OnPromptDone said yes; OnFinished next
};

}  // namespace

struct PrefillRole::LayerStream {
  HandOffRequest request;  // kv_blocks and first_token: set under mu (StartStream, Committable)
  int num_layers = 0;
  int group = 1;
  bool started = false;  // loop thread only: StreamLayers is posted (false: shutting down)
  absl::Mutex mu;
  bool allocated ABSL_GUARDED_BY(mu) = false;  // `alloc` holds AllocateKv's answer
  absl::StatusOr<v1::KvAllocation> alloc ABSL_GUARDED_BY(mu);
  int layers_written ABSL_GUARDED_BY(mu) = 0;    // final in the prefill cache
  bool committable ABSL_GUARDED_BY(mu) = false;  // the first token is out
  bool cancelled ABSL_GUARDED_BY(mu) = false;
  bool reading ABSL_GUARDED_BY(mu) = false;  // a group's write reads the blocks
};

std::unique_ptr<worker::KvConnector> PrefillRole::MakeConnector() const {
  if (options_.handoff_layer_group <= 0) return std::make_unique<worker::PrefillKvConnector>();
  return std::make_unique<LayerwiseConnector>(*self_);
}

PrefillRole::~PrefillRole() {
  // Hand-off threads waiting on a stream give up now (the pool joins them).
  for (auto& [id, s] : streams_) Cancel(*s, /*await_reads=*/false);
  for (auto& [id, p] : handing_off_) {
    if (p.stream != nullptr) Cancel(*p.stream, /*await_reads=*/false);
  }
}

void PrefillRole::Cancel(LayerStream& s, bool await_reads) {
  absl::MutexLock lock(&s.mu);
  s.cancelled = true;
  if (!await_reads) return;
  auto idle = [&s]() ABSL_SHARED_LOCKS_REQUIRED(s.mu) { return !s.reading; };
  s.mu.Await(absl::Condition(&idle));
}

void PrefillRole::OnPromptQueued(const std::string& id, const worker::HandoffPrompt& prompt) {
  LiveRequest* r = host_ != nullptr ? host_->Find(id) : nullptr;
  if (r == nullptr || r->engine_request.sampling.max_tokens == 1 ||
      prompt.token_ids.size() < static_cast<size_t>(options_.handoff_layerwise_min_tokens)) {
    return;  // whole, after the forward (or no hand-off at all)
  }
  auto s = std::make_shared<LayerStream>();
  s->request = HandOffRequest{.request_id = id,
                              .decode = r->decode,
                              .max_tokens = r->engine_request.sampling.max_tokens,
                              .seed = r->engine_request.sampling.seed,
                              .prompt = prompt};
  s->num_layers = static_cast<int>(engine_->config().text.num_hidden_layers);
  s->group = options_.handoff_layer_group;
  // AllocateKv goes when the forward of its last rows starts (StartStream),
  // not now: the decode reservation then need not outlast the prompt's wait
  // in the queue and its earlier chunks (--kv_commit_timeout_ms).
  streams_[id] = std::move(s);
}

void PrefillRole::OnLayersWritten(const worker::KvLayersWritten& written) {
  for (const worker::KvLayersWritten::Prompt& p : *written.prompts) {
    auto it = streams_.find(p.id);
    if (it == streams_.end()) continue;
    if (!it->second->started) StartStream(it->second, p.blocks);
    absl::MutexLock lock(&it->second->mu);
    it->second->layers_written = std::max(it->second->layers_written, written.layers_written);
  }
}

void PrefillRole::OnPromptEnded(const std::string& id, bool handed_off) {
  if (handed_off) return;  // TakeEvent takes the stream
  auto it = streams_.find(id);
  if (it == streams_.end()) return;
  // Its blocks are freed once this returns; its decode reservation at its
  // commit deadline (or when the router cancels the decode stream).
  Cancel(*it->second, /*await_reads=*/true);
  streams_.erase(it);
}

bool PrefillRole::StartStream(const std::shared_ptr<LayerStream>& s, std::vector<int32_t> blocks) {
  {
    absl::MutexLock lock(&s->mu);
    s->request.kv_blocks = std::move(blocks);
  }
  const std::string id = s->request.request_id;
  // AllocateKv first: StreamLayers waits for its answer (the forward is at
  // its first layer, the first group is still computing).
  const bool posted =
      handoff_threads_->Post([this, s] { Allocate(*s); }) && handoff_threads_->Post([this, s, id] {
        absl::StatusOr<HandOffResult> done = StreamLayers(*s);
        host_->RunOnLoop([this, id, done = std::move(done)](bool) { Finished(id, done); });
      });
  s->started = posted;  // else shutting down
  return posted;
}

bool PrefillRole::Committable(const std::shared_ptr<LayerStream>& s,
                              const std::vector<int32_t>& blocks, int32_t first_token) {
  if (!s->started && !StartStream(s, blocks)) return false;
  absl::MutexLock lock(&s->mu);
  s->layers_written = s->num_layers;
  s->request.first_token = first_token;
  s->committable = true;
  return true;
}

void PrefillRole::Allocate(LayerStream& s) {
  {
    absl::MutexLock lock(&s.mu);
    if (s.cancelled) {
      s.alloc = absl::CancelledError("the request ended before its hand-off");
      s.allocated = true;
      return;
    }
  }
  v1::KvAllocation alloc;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() +
                   absl::ToChronoNanoseconds(options_.kv_handoff_timeout));
  absl::Status status = FromGrpcStatus(
      DecodeStub(s.request.decode.address()).AllocateKv(&ctx, AllocateRequest(s.request), &alloc));
  absl::MutexLock lock(&s.mu);
  if (status.ok()) {
    s.alloc = std::move(alloc);
  } else {
    s.alloc = status;
  }
  s.allocated = true;
}

absl::StatusOr<HandOffResult> PrefillRole::StreamLayers(LayerStream& s) {
  // Waiting for the forward (the layers, the first token) is bounded by
  // the decode reservation, which lasts kv_commit_timeout from AllocateKv
  // (a long prompt's last chunk may compute for longer than a hand-off's
  // own steps take); each write, and CommitKv, by kv_handoff_timeout.
  const absl::Time until =
      absl::Now() + std::max(options_.kv_commit_timeout, options_.kv_handoff_timeout);
  HandOffRequest request;
  v1::KvAllocation alloc;
  {
    absl::MutexLock lock(&s.mu);
    auto answered = [&s]() ABSL_SHARED_LOCKS_REQUIRED(s.mu) { return s.allocated || s.cancelled; };
    if (!s.mu.AwaitWithDeadline(absl::Condition(&answered), until)) {
      return absl::DeadlineExceededError("the decode instance did not answer AllocateKv in time");
    }
    if (s.cancelled) return absl::CancelledError("the request ended during its hand-off");
    RETURN_IF_ERROR(s.alloc.status());
    alloc = *s.alloc;
    request.kv_blocks = s.request.kv_blocks;
  }
  request.request_id = s.request.request_id;
  request.decode = s.request.decode;
  ASSIGN_OR_RETURN(const std::vector<RankPut> ranks, RankPuts(request, alloc));
  HandOffResult result;
  std::vector<uint32_t> crcs;  // per decode rank
  for (int sent = 0; sent < s.num_layers;) {
    int upto = 0;
    {
      absl::MutexLock lock(&s.mu);
      const int want = std::min(sent + s.group, s.num_layers);
      auto ready = [&s, want]() ABSL_SHARED_LOCKS_REQUIRED(s.mu) {
        return s.cancelled || s.layers_written >= want;
      };
      if (!s.mu.AwaitWithDeadline(absl::Condition(&ready), until)) {
        return absl::DeadlineExceededError("the prompt's layers were not computed in time");
      }
      if (s.cancelled) return absl::CancelledError("the request ended during its hand-off");
      upto = want;
      s.reading = true;
    }
    absl::Status st =
        SendGroup(s, ranks, sent, upto, Deadline::After(options_.kv_handoff_timeout), crcs, result);
    {
      absl::MutexLock lock(&s.mu);
      s.reading = false;
    }
    RETURN_IF_ERROR(st);
    if (sent == 0 && upto < s.num_layers && options_.test_kv_handoff_delay > absl::ZeroDuration()) {
      LOG(WARNING) << "request " << request.request_id << ": test-only hand-off delay of "
                   << options_.test_kv_handoff_delay << " after its first layer group";
      absl::SleepFor(options_.test_kv_handoff_delay);
    }
    sent = upto;
  }
  v1::KvCommit commit;
  {
    absl::MutexLock lock(&s.mu);
    auto out = [&s]() ABSL_SHARED_LOCKS_REQUIRED(s.mu) { return s.cancelled || s.committable; };
    if (!s.mu.AwaitWithDeadline(absl::Condition(&out), until)) {
      return absl::DeadlineExceededError("no first token in time");
    }
    if (s.cancelled) return absl::CancelledError("the request ended during its hand-off");
    request = s.request;
  }
  for (uint32_t crc : crcs) commit.add_rank_crc32c(crc);
  // A rank gone since: its last layers may not all be there.
  RETURN_IF_ERROR(RanksAlive());
  RETURN_IF_ERROR(Commit(
      request, commit,
      std::chrono::system_clock::now() + absl::ToChronoNanoseconds(options_.kv_handoff_timeout),
      result));
  return result;
}

absl::Status PrefillRole::SendGroup(LayerStream& s, const std::vector<RankPut>& ranks, int from,
                                    int to, Deadline deadline, std::vector<uint32_t>& crcs,
                                    HandOffResult& result) {
  const transfer::KvLayerRange layers{.first = from, .count = to - from};
  std::vector<uint32_t> group;
  RETURN_IF_ERROR(SendPuts(ranks, layers, deadline, group, result));
  if (from == 0) crcs.assign(group.size(), 0);
  for (size_t d = 0; d < group.size(); ++d) {
    // The decode rank's bytes of this group (the target of any write into it).
    const auto into = std::find_if(ranks.begin(), ranks.end(), [d](const RankPut& p) {
      return p.decode_rank == static_cast<int>(d);
    });
    const uint64_t bytes =
        transfer::KvHandoffBytes(into->target.shape, into->src.size(), to - from);
    crcs[d] = from == 0 ? group[d] : Crc32cCombine(crcs[d], group[d], bytes);
  }
  result.layer_groups += static_cast<int>(ranks.size());
  return absl::OkStatus();
}

}  // namespace mmserve::language
