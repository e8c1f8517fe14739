#include "worker/model_runner.h"

#include <time.h>

#include <limits>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/tp_step_loop.h"

namespace mmserve::worker {
namespace {

// CPU time of the calling thread: what the work cost the loop, without the
// time the thread was descheduled (these machines are shared).
int64_t ThreadCpuNanos() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

// Whether prompt position `pos` is an image token: then *o is its row's
// override and *hash its image's content hash.
bool ImageRow(const RunnerRequestState& st, int pos, int64_t row, int hidden,
              model::EmbeddingOverride* o, uint64_t* hash) {
  for (size_t k = 0; k < st.image_offsets.size(); ++k) {
    const int rel = pos - st.image_offsets[k];
    if (rel >= 0 && rel < st.image_lengths[k]) {
      *hash = k < st.image_hashes.size() ? st.image_hashes[k] : 0;
      *o = ImageOverride(st, k, rel, row, hidden);
      return true;
    }
  }
  return false;
}

// Whether the override's floats (with its DeepStack features) lie in `buffer`.
bool Inside(absl::Span<const uint8_t> buffer, const model::EmbeddingOverride& o, int hidden) {
  const uint8_t* p = reinterpret_cast<const uint8_t*>(o.values);
  const size_t bytes = static_cast<size_t>(hidden) * (1 + o.deepstack_layers) * sizeof(float);
  return !buffer.empty() && p >= buffer.data() && bytes <= buffer.size() &&
         p <= buffer.data() + buffer.size() - bytes;
}

}  // namespace

model::EmbeddingOverride ImageOverride(const RunnerRequestState& st, size_t k, int64_t at,
                                       int64_t row, int64_t hidden) {
  const int levels = st.deepstack_levels;
  const float* values = st.image_embeddings[k] + at * hidden * (1 + levels);
  return {row, values, levels > 0 ? values + hidden : nullptr, levels};
}

absl::StatusOr<std::vector<model::SampleResult>> ModelRunner::Step(
    const scheduler::SchedulerOutput& out, const kvpool::KvCacheManager& kv_manager,
    const RunnerLookup& lookup, model::SpanAttentionPeers* peers, absl::Status* spread_status) {
  batch_.on_layers_written = std::move(layer_hook_);
  layer_hook_ = nullptr;
  absl::Cleanup unhook = [this] { batch_.on_layers_written = nullptr; };
  RETURN_IF_ERROR(BuildBatch(out, kv_manager, lookup, /*with_spread=*/peers != nullptr));
  spread_.peers = peers;
  if (peers == nullptr && spread_status != nullptr && spread_status->ok()) {
    for (size_t i = 0; i < out.scheduled.size(); ++i) {
      if (!in_batch_[i]) *spread_status = absl::FailedPreconditionError("no span peers");
    }
  }
  std::vector<RequestGrammar*> grammars;
  for (size_t i = 0; i < out.scheduled.size(); ++i) {
    if (in_batch_[i] && out.scheduled[i].samples && states_[i]->grammar != nullptr) {
      grammars.push_back(states_[i]->grammar.get());
    }
  }
  if (!grammars.empty() && masks_ == nullptr) masks_ = std::make_unique<MaskWorker>();
  if (masks_ != nullptr) masks_->Start(std::move(grammars));
  absl::Status forward = ring_ != nullptr ? PublishToRanks() : absl::OkStatus();
  if (forward.ok() && batch_.num_tokens() > 0) {  // none: only kMastering entries, left out
    forward = spread_.sequences.empty() ? model_.Forward(batch_, kv_, &logits_)
                                        : model_.ForwardSpread(batch_, kv_, spread_, &logits_);
  }
  // Joined on every path: the requests must not change under the helper.
  if (masks_ != nullptr) masks_->Wait();
  if (!forward.ok() && !spread_.sequences.empty() && spread_status != nullptr) {
    // The span holders failed the spread rows: the step again without them
    // (it rewrites the others' K/V with the same values).
    *spread_status = forward;
    RETURN_IF_ERROR(BuildBatch(out, kv_manager, lookup, /*with_spread=*/false));
    forward = batch_.num_tokens() > 0 ? model_.Forward(batch_, kv_, &logits_) : absl::OkStatus();
  }
  RETURN_IF_ERROR(forward);
  return SampleAll(out);
}

absl::Status ModelRunner::BuildBatch(const scheduler::SchedulerOutput& out,
                                     const kvpool::KvCacheManager& kv_manager,
                                     const RunnerLookup& lookup, bool with_spread) {
  model::ForwardBatch& b = batch_;
  b.token_ids.clear();
  b.positions.clear();
  b.slot_mapping.clear();
  b.sequences.clear();
  b.logits_rows.clear();
  b.embedding_overrides.clear();
  row_hashes_.clear();
  states_.clear();
  in_batch_.clear();
  spread_.sequences.clear();
  const int hidden = model_.config().hidden_size;
  std::vector<int64_t> pos_t, pos_h, pos_w;
  for (const scheduler::ScheduledRequest& s : out.scheduled) {
    RunnerRequestState* st = lookup(s.request->id());
    if (st == nullptr) {
      return absl::InternalError(
          absl::StrCat("no runner state for request ", s.request->id().value));
    }
    states_.push_back(st);
    const bool spread = s.request->status() == scheduler::RequestStatus::kMastering;
    in_batch_.push_back(with_spread || !spread);
    if (!in_batch_.back()) continue;
    if (spread) spread_.sequences.push_back(static_cast<int64_t>(b.sequences.size()));
    const auto tokens = s.request->token_ids();
    const auto table = kv_manager.block_table(s.request->block_table());
    // A master's block table starts at its span's first token.
    const int offset = s.request->kv_offset();
    model::SequenceChunk chunk;
    chunk.query_start = b.num_tokens();
    chunk.query_len = s.num_tokens;
    chunk.context_len = s.num_computed_tokens + s.num_tokens - offset;
    chunk.block_table.reserve(table.size());
    for (kvpool::BlockId id : table) chunk.block_table.push_back(id.value);
    const model::MropePositions& pp = *st->prompt_positions;
    const int prompt_len = static_cast<int>(pp.t.size());
    for (int p = s.num_computed_tokens; p < s.num_computed_tokens + s.num_tokens; ++p) {
      const int64_t row = b.num_tokens();
      b.token_ids.push_back(tokens[p]);
      if (p < prompt_len) {
        pos_t.push_back(pp.t[p]);
        pos_h.push_back(pp.h[p]);
        pos_w.push_back(pp.w[p]);
        uint64_t hash = 0;
        model::EmbeddingOverride o;
        if (ImageRow(*st, p, row, hidden, &o, &hash)) {
          b.embedding_overrides.push_back(o);
          row_hashes_.push_back(hash);
        }
      } else {
        const int64_t q = p + pp.delta;
        pos_t.push_back(q);
        pos_h.push_back(q);
        pos_w.push_back(q);
      }
      b.slot_mapping.push_back(kv_manager.Slot(s.request->block_table(), p - offset));
    }
    if (s.samples) b.logits_rows.push_back(b.num_tokens() - 1);
    b.sequences.push_back(std::move(chunk));
  }
  b.positions = pos_t;
  b.positions.insert(b.positions.end(), pos_h.begin(), pos_h.end());
  b.positions.insert(b.positions.end(), pos_w.begin(), pos_w.end());
  return absl::OkStatus();
}

absl::Status ModelRunner::PublishToRanks() {
  // ForwardOnAllRanks, with the hand-off of image rows timed: the step
  // without them, then their descriptors or their floats.
  model::ForwardBatch& b = batch_;
  const int hidden = model_.config().hidden_size;
  bool shared = !shared_input_.empty();
  for (const model::EmbeddingOverride& o : b.embedding_overrides) {
    shared = shared && Inside(shared_input_, o, hidden);
  }
  rows_.embedding_overrides.swap(b.embedding_overrides);  // rows_: the image rows alone
  absl::StatusOr<StepMessage> m = StepMessageFromBatch(b, hidden, EmbeddingPlacement::kInline);
  b.embedding_overrides.swap(rows_.embedding_overrides);
  if (!m.ok()) return m.status();
  if (!b.embedding_overrides.empty()) {
    const int64_t cpu_start = ThreadCpuNanos();
    rows_.embedding_overrides.swap(b.embedding_overrides);
    absl::StatusOr<StepMessage> r = StepMessageFromBatch(
        rows_, hidden, shared ? EmbeddingPlacement::kSharedBuffer : EmbeddingPlacement::kInline,
        shared_input_);
    b.embedding_overrides.swap(rows_.embedding_overrides);
    if (!r.ok()) return r.status();
    m->embeddings = std::move(r->embeddings);
    m->inline_floats = std::move(r->inline_floats);
    for (size_t i = 0; i < m->embeddings.size(); ++i) {
      m->embeddings[i].content_hash = row_hashes_[i];
    }
    handoff_seconds_ += (ThreadCpuNanos() - cpu_start) * 1e-9;
    (shared ? rows_by_descriptor_ : rows_inline_) += static_cast<int64_t>(m->embeddings.size());
  }
  return ring_->Publish(*m);
}

std::vector<model::SampleResult> ModelRunner::SampleAll(const scheduler::SchedulerOutput& out) {
  const int vocab = model_.config().vocab_size;
  std::vector<model::SampleResult> sampled(out.scheduled.size());
  size_t row = 0;
  for (size_t i = 0; i < out.scheduled.size(); ++i) {
    const scheduler::ScheduledRequest& s = out.scheduled[i];
    if (!s.samples) continue;
    if (!in_batch_[i]) {
      sampled[i].token = kvpool::kNoToken;
      continue;
    }
    float* logits = logits_.data() + row++ * vocab;
    sampled[i] =
        SampleNext(*states_[i], s.request->prompt_token_ids(), s.request->output_token_ids(),
                   absl::MakeSpan(logits, vocab), &processed_);
  }
  return sampled;
}

model::SampleResult SampleNext(const RunnerRequestState& st, absl::Span<const int32_t> prompt,
                               absl::Span<const int32_t> output, absl::Span<float> logits,
                               std::vector<float>* scratch) {
  // Before min_tokens, end-of-sequence and stop tokens are not allowed
  // (a complete constrained output may end all the same).
  const bool complete = st.grammar != nullptr && st.grammar->CanTerminate();
  if (static_cast<int>(output.size()) < st.sampling.min_tokens && !complete) {
    constexpr float kMasked = -std::numeric_limits<float>::infinity();
    for (int32_t id : st.eos_token_ids) logits[id] = kMasked;
    for (int32_t id : st.sampling.stop_token_ids) logits[id] = kMasked;
  }
  if (!st.sampling.processes_logits() && st.grammar == nullptr) {
    return model::Sample(logits, st.sampling, st.sampler);
  }
  scratch->assign(logits.begin(), logits.end());
  model::ApplyLogitsProcessors(absl::MakeSpan(*scratch), st.sampling, prompt, output);
  if (st.grammar != nullptr) st.grammar->Apply(absl::MakeSpan(*scratch));
  return model::Sample(logits, *scratch, st.sampling, st.sampler);
}

absl::StatusOr<bool> AdvanceGrammar(RunnerRequestState& st, int32_t token) {
  if (st.grammar == nullptr) return false;
  for (int32_t eos : st.eos_token_ids) {
    if (token == eos) return false;
  }
  if (!st.grammar->Accept(token)) {
    return absl::InvalidArgumentError(
        "constraint: no token of this model's vocabulary can continue the output");
  }
  return st.grammar->IsFinished();
}

}  // namespace mmserve::worker
