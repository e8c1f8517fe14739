#include "worker/engine.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/hash.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "model/image_preprocess.h"
#include "model/mrope_positions.h"
#include "worker/kv_sizing.h"
#include "worker/tp_step_loop.h"

namespace mmserve::worker {
namespace {

constexpr int kMaxModelLenCap = 8192;

// A /proc value in kB ("VmRSS:" in /proc/self/status, "MemAvailable:" in
// /proc/meminfo), in bytes; 0 when unreadable.
int64_t ProcBytes(const char* file, const char* key) {
  std::ifstream in(file);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key, 0) == 0) return std::atoll(line.c_str() + std::strlen(key)) * 1024;
  }
  return 0;
}

// The largest step the scheduler can make, encoded (step_message.h): every
// row an image row with its embedding inline, every sequence's block table
// as long as max_model_len needs.
int64_t StepSlotBytes(const EngineOptions& o, int64_t hidden, int64_t max_model_len) {
  const int64_t rows = o.max_num_batched_tokens;
  const int64_t blocks_per_seq = (max_model_len + o.block_size - 1) / o.block_size + 1;
  // Per row: token id, 3 positions, slot, logits row, embedding descriptor
  // and values; per sequence: its chunk and block table; and the header.
  const int64_t bytes = 1024 + rows * (4 + 3 * 8 + 8 + 8 + 48 + hidden * 4) +
                        o.max_num_seqs * (32 + blocks_per_seq * 4);
  return (bytes + 63) / 64 * 64;
}

}  // namespace

// A request's state outside the scheduler.
struct LlmEngine::Live {
  std::string id;
  scheduler::RequestId sched_id;
  StreamCallback callback;
  model::SamplerState sampler{0};
  RunnerRequestState runner;
  model::MropePositions positions;
  std::vector<std::vector<float>> image_embeddings;    // owned rows (empty: shared)
  std::vector<const float*> image_rows;                // per image: its first row
  std::vector<std::optional<ContentHash>> image_keys;  // per image; unset: hash the floats
  std::unique_ptr<model::TextStreamer> streamer;
  int prompt_tokens = 0;
  int completion_tokens = 0;
  bool kv_handoff = false;
  // Role prefill: what the decode engine needs (grids kept from
  // PrepareImages). Role decode: set when the prompt's images came as
  // HandoffImage (no embeddings: the request cannot be recomputed).
  std::vector<model::ImageGrid> grids;
  HandoffPrompt handoff;
  bool handoff_images = false;
};

LlmEngine::~LlmEngine() = default;

absl::StatusOr<std::unique_ptr<LlmEngine>> LlmEngine::Create(const EngineOptions& options) {
  std::unique_ptr<LlmEngine> e(new LlmEngine());
  RETURN_IF_ERROR(e->Load(options));
  RETURN_IF_ERROR(e->SizeKvCache(options));
  return e;
}

absl::Status LlmEngine::Load(const EngineOptions& options) {
  if (options.num_threads < 0 || options.kv_cache_bytes < 0 || options.block_size <= 0 ||
      options.max_num_seqs <= 0 || options.max_num_batched_tokens <= 0 ||
      options.max_model_len < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("engine options out of range: num_threads ", options.num_threads,
                     " (>= 0), kv_cache_bytes ", options.kv_cache_bytes, " (>= 0), block_size ",
                     options.block_size, " (> 0), max_num_seqs ", options.max_num_seqs,
                     " (> 0), max_num_batched_tokens ", options.max_num_batched_tokens,
                     " (> 0), max_model_len ", options.max_model_len, " (>= 0)"));
  }
  ASSIGN_OR_RETURN(config_, model::LoadModelConfig(options.model_dir));
  ASSIGN_OR_RETURN(tokenizer_, model::Tokenizer::FromFile(options.model_dir + "/tokenizer.json"));
  if (tokenizer_->vocab_size() > config_.text.vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat("tokenizer has ", tokenizer_->vocab_size(),
                                                   " tokens, the model's vocab_size is ",
                                                   config_.text.vocab_size));
  }
  ASSIGN_OR_RETURN(model::Qwen2WeightsOptions weight_options,
                   model::ParseQuantize(options.quantize));
  if (options.tp_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor-parallel size ", options.tp_size, " must be >= 1"));
  }
  const int threads =
      options.num_threads > 0
          ? options.num_threads
          // Every rank runs on this host: share the cores between them.
          : std::max(1, model::cpu::ThreadPool::DefaultThreads() / std::max(1, options.tp_size));
  sizing_.max_model_len =
      options.max_model_len > 0
          ? options.max_model_len
          : std::min(config_.text.max_position_embeddings > 0 ? config_.text.max_position_embeddings
                                                              : kMaxModelLenCap,
                     kMaxModelLenCap);
  if (options.tp_size > 1) {
    weight_options.shard = {0, options.tp_size};
    // Refuse a model that does not split before any rank starts.
    RETURN_IF_ERROR(model::CheckTensorParallel(config_.text, weight_options.shard));
    if (weight_options.quantize != model::Quantization::kNone) {
      return absl::InvalidArgumentError("--quantize is not supported with tensor parallelism");
    }
    TpGroupOptions g;
    g.size = options.tp_size;
    g.instance_id =
        options.tp_instance_id.empty() ? absl::StrCat("engine-", getpid()) : options.tp_instance_id;
    g.shard_binary = options.tp_shard_binary;
    g.model_dir = options.model_dir;
    g.threads_per_rank = threads;
    g.ring_slot_bytes = StepSlotBytes(options, config_.text.hidden_size, sizing_.max_model_len);
    g.extra_args = options.tp_shard_args;
    if (options.shared_input != nullptr) {
      g.shared_input_fd = options.shared_input_fd;
      g.shared_input_bytes = options.shared_input_bytes;
    }
    ASSIGN_OR_RETURN(tp_group_, TpGroup::Start(g));
  }
  ASSIGN_OR_RETURN(checkpoint_, model::SafetensorsCheckpoint::Open(options.model_dir));
  ASSIGN_OR_RETURN(weights_, model::Qwen2Weights::Load(*checkpoint_, config_.text, weight_options));
  sizing_.weights_bytes = weights_->TotalWeightBytes();
  pool_ = std::make_unique<model::cpu::ThreadPool>(threads);
  if (config_.vision && options.load_vision) {
    model::VisionTowerOptions vision_options;
    vision_options.pool = pool_.get();
    // --quantize covers the vision tower's linear layers too.
    if (weight_options.quantize == model::Quantization::kInt8) {
      vision_options.int8_group = weight_options.int8_group;
    }
    ASSIGN_OR_RETURN(vision_, model::VisionTower::Load(*checkpoint_, config_, vision_options));
    sizing_.vision_bytes = vision_->weight_bytes();
  }
  model::Qwen2ModelOptions model_options;
  if (tp_group_ != nullptr) model_options.comm = tp_group_->comm();
  model_ = std::make_unique<model::Qwen2Model>(config_.text, *weights_, *pool_, model_options);
  for (int id : config_.tokens.eos) eos_ids_.push_back(id);
  for (int id : config_.generation.eos_token_ids) {
    if (std::find(eos_ids_.begin(), eos_ids_.end(), id) == eos_ids_.end()) eos_ids_.push_back(id);
  }
  image_pad_id_ = config_.tokens.image_pad >= 0 ? config_.tokens.image_pad
                                                : tokenizer_->TokenToId("<|image_pad|>");
  return absl::OkStatus();
}

absl::Status LlmEngine::SizeKvCache(const EngineOptions& options) {
  const int bs = options.block_size;
  const int warm_tokens = options.max_num_batched_tokens;
  const int warm_blocks = (warm_tokens + bs - 1) / bs;
  // Warm-up: the largest step the scheduler can produce, so every scratch
  // buffer reaches its peak before the KV budget is measured.
  {
    ASSIGN_OR_RETURN(auto warm_kv, model::KvCache::Create(model_->KvShape(warm_blocks, bs)));
    model::ForwardBatch b;
    model::SequenceChunk chunk;
    chunk.query_len = chunk.context_len = warm_tokens;
    for (int i = 0; i < warm_blocks; ++i) chunk.block_table.push_back(i);
    b.sequences.push_back(chunk);
    for (int t = 0; t < warm_tokens; ++t) {
      b.token_ids.push_back(0);
      b.slot_mapping.push_back(t);
    }
    for (int c = 0; c < 3; ++c) {
      for (int t = 0; t < warm_tokens; ++t) b.positions.push_back(t);
    }
    b.logits_rows.push_back(warm_tokens - 1);
    const int64_t rss_before = ProcBytes("/proc/self/status", "VmRSS:");
    std::vector<float> logits;
    if (tp_group_ != nullptr) {
      StepRing& ring = *tp_group_->ring();
      RETURN_IF_ERROR(AllocateKvOnAllRanks(ring, warm_blocks, bs));
      RETURN_IF_ERROR(
          ForwardOnAllRanks(ring, *model_, *warm_kv, b, EmbeddingPlacement::kInline, &logits));
    } else {
      RETURN_IF_ERROR(model_->Forward(b, *warm_kv, &logits));
    }
    sizing_.warmup_rss_growth_bytes = ProcBytes("/proc/self/status", "VmRSS:") - rss_before;
  }
  KvSizingInputs in;
  in.block_size = bs;
  in.max_num_seqs = options.max_num_seqs;
  in.max_model_len = sizing_.max_model_len;
  in.block_bytes = model_->KvShape(1, bs).TotalBytes();
  in.requested_bytes = static_cast<size_t>(options.kv_cache_bytes);
  // Every rank allocates a cache of num_blocks blocks of its own heads on
  // this host: each gets its share of the memory.
  in.available_bytes = ProcBytes("/proc/meminfo", "MemAvailable:") / std::max(1, options.tp_size);
  in.memory_fraction = options.kv_memory_fraction;
  ASSIGN_OR_RETURN(KvSizing kv_sizing, DecideKvBlocks(in));
  const int num_blocks = kv_sizing.num_blocks;
  LOG(INFO) << "engine: " << kv_sizing.Describe();
  if (static_cast<int64_t>(num_blocks) * bs < sizing_.max_model_len) {
    LOG(WARNING) << "KV cache holds " << num_blocks * bs << " tokens; max_model_len lowered from "
                 << sizing_.max_model_len;
    sizing_.max_model_len = num_blocks * bs;
  }
  ASSIGN_OR_RETURN(kv_, model::KvCache::Create(model_->KvShape(num_blocks, bs)));
  if (tp_group_ != nullptr) {
    RETURN_IF_ERROR(AllocateKvOnAllRanks(*tp_group_->ring(), num_blocks, bs));
  }
  sizing_.num_kv_blocks = num_blocks;
  sizing_.kv_bytes = kv_->shape().TotalBytes();

  scheduler::SchedulerConfig sc;
  sc.max_num_batched_tokens = options.max_num_batched_tokens;
  sc.max_num_seqs = options.max_num_seqs;
  sc.max_prefill_tokens = options.max_prefill_tokens;
  sc.enable_chunked_prefill = options.enable_chunked_prefill;
  sc.kv.num_blocks = num_blocks;
  sc.kv.block_size = bs;
  sc.kv.enable_prefix_caching = options.enable_prefix_caching;
  ASSIGN_OR_RETURN(scheduler_, scheduler::Scheduler::Create(sc));
  runner_ = std::make_unique<ModelRunner>(
      *model_, *kv_, tp_group_ != nullptr ? tp_group_->ring() : nullptr,
      absl::Span<const uint8_t>(options.shared_input,
                                options.shared_input != nullptr ? options.shared_input_bytes : 0));
  auto mib = [](double bytes) { return absl::StrFormat("%.1f MiB", bytes / (1 << 20)); };
  LOG(INFO) << "engine: weights " << mib(sizing_.weights_bytes) << ", vision "
            << mib(sizing_.vision_bytes) << ", warm-up activations "
            << mib(sizing_.warmup_rss_growth_bytes) << ", KV " << num_blocks << " blocks x " << bs
            << " tokens = " << mib(sizing_.kv_bytes) << ", max_model_len " << sizing_.max_model_len;
  return absl::OkStatus();
}

absl::Status LlmEngine::PrepareHandoffImages(EngineRequest& request, Live& live,
                                             const std::vector<int32_t>& ids) {
  if (!request.images.empty() || !request.image_embeddings.empty()) {
    return absl::InvalidArgumentError("a KV hand-off carries image spans, not images");
  }
  if (!config_.vision) return absl::InvalidArgumentError("this model does not accept images");
  const int merge = config_.vision->spatial_merge_size;
  const int64_t n = static_cast<int64_t>(ids.size());
  std::vector<model::ImageGrid> grids;
  int64_t end = 0, image_tokens = 0;  // end of the previous run
  for (size_t k = 0; k < request.handoff_images.size(); ++k) {
    HandoffImage& h = request.handoff_images[k];
    h.grid.merge_size = merge;
    const model::ImageGrid& g = h.grid;
    const bool sane = g.grid_t > 0 && g.grid_h > 0 && g.grid_w > 0 && g.grid_t <= n &&
                      g.grid_h <= n * merge && g.grid_w <= n * merge && g.grid_h % merge == 0 &&
                      g.grid_w % merge == 0;
    if (!sane || h.offset < end || h.offset + g.num_tokens() > n) {
      return absl::InvalidArgumentError(absl::StrCat(
          "hand-off image ", k, " (offset ", h.offset, ", grid ", g.grid_t, "x", g.grid_h, "x",
          g.grid_w, ") does not fit a prompt of ", n, " tokens after the previous image"));
    }
    for (int64_t i = h.offset; i < h.offset + g.num_tokens(); ++i) {
      if (ids[i] != image_pad_id_) {
        return absl::InvalidArgumentError(absl::StrCat("hand-off image ", k, " at offset ",
                                                       h.offset, " is not a run of image pads"));
      }
    }
    end = h.offset + g.num_tokens();
    image_tokens += g.num_tokens();
    grids.push_back(g);
  }
  if (std::count(ids.begin(), ids.end(), image_pad_id_) != image_tokens) {
    return absl::InvalidArgumentError("the prompt has image pads outside its hand-off images");
  }
  ASSIGN_OR_RETURN(live.positions, model::ComputeMropePositions(ids, image_pad_id_, grids, merge));
  live.handoff_images = !grids.empty();
  return absl::OkStatus();
}

absl::Status LlmEngine::PrepareImages(EngineRequest& request, Live& live,
                                      std::vector<int32_t>* ids) {
  if (!request.handoff_images.empty()) return PrepareHandoffImages(request, live, *ids);
  std::vector<model::ImageGrid> grids;
  if (!request.image_embeddings.empty()) {
    if (!request.images.empty()) {
      return absl::InvalidArgumentError("give images or image embeddings, not both");
    }
    if (!config_.vision) return absl::InvalidArgumentError("this model does not accept images");
    const size_t hidden = static_cast<size_t>(config_.text.hidden_size);
    for (ImageEmbedding& e : request.image_embeddings) {
      if (e.shared_values != nullptr) {
        if (e.grid.num_tokens() <= 0 || !e.values.empty() || !e.key.has_value()) {
          return absl::InvalidArgumentError(
              "an image embedding in shared memory needs a grid and a key, and no values");
        }
        grids.push_back(e.grid);
        live.image_keys.push_back(e.key);
        live.image_embeddings.emplace_back();
        live.image_rows.push_back(e.shared_values);
        continue;
      }
      if (e.grid.num_tokens() <= 0 ||
          e.values.size() != static_cast<size_t>(e.grid.num_tokens()) * hidden) {
        return absl::InvalidArgumentError(absl::StrCat("image embedding holds ", e.values.size(),
                                                       " floats; its grid needs ",
                                                       e.grid.num_tokens(), " tokens of ", hidden));
      }
      grids.push_back(e.grid);
      live.image_keys.push_back(e.key);
      live.image_embeddings.push_back(std::move(e.values));
      live.image_rows.push_back(live.image_embeddings.back().data());
    }
  } else if (!request.images.empty()) {
    if (!vision_ || !config_.preprocessor) {
      return absl::InvalidArgumentError("this model does not accept images");
    }
    for (const model::RgbImage& img : request.images) {
      ASSIGN_OR_RETURN(model::ImagePatches p, model::PreprocessImage(img, *config_.preprocessor));
      std::vector<model::ImageGrid> one = {p.grid};
      ASSIGN_OR_RETURN(std::vector<float> emb, vision_->Forward(p.values, one));
      grids.push_back(p.grid);
      live.image_keys.push_back(std::nullopt);
      live.image_embeddings.push_back(std::move(emb));
      live.image_rows.push_back(live.image_embeddings.back().data());
    }
  }
  ASSIGN_OR_RETURN(*ids, model::ExpandImagePlaceholders(*ids, image_pad_id_, grids));
  live.grids = grids;
  ASSIGN_OR_RETURN(live.positions, model::ComputeMropePositions(
                                       *ids, image_pad_id_, grids,
                                       config_.vision ? config_.vision->spatial_merge_size : 2));
  // Where each image's tokens sit in the expanded prompt.
  size_t k = 0;
  for (size_t i = 0; i < ids->size() && k < grids.size();) {
    if ((*ids)[i] != image_pad_id_) {
      ++i;
      continue;
    }
    const int len = static_cast<int>(grids[k].num_tokens());
    live.runner.image_offsets.push_back(static_cast<int>(i));
    live.runner.image_lengths.push_back(len);
    live.runner.image_embeddings.push_back(live.image_rows[k]);
    live.runner.image_hashes.push_back(live.image_keys[k].has_value() ? live.image_keys[k]->low
                                                                      : 0);
    i += len;
    ++k;
  }
  return absl::OkStatus();
}

absl::Status LlmEngine::AddRequest(EngineRequest request, StreamCallback callback) {
  if (!request.handoff_images.empty()) {
    return absl::InvalidArgumentError("hand-off images are for ReserveRemoteKv only");
  }
  scheduler::RequestParams p;
  ASSIGN_OR_RETURN(std::unique_ptr<Live> live, Prepare(request, std::move(callback), &p));
  if (request.kv_handoff) {
    if (tp_group_ != nullptr) {
      return absl::FailedPreconditionError("KV hand-off needs tp_size 1");
    }
    live->kv_handoff = true;
    p.max_tokens = 1;  // the decode engine produces the rest
    live->handoff.token_ids = p.prompt_token_ids;
    for (size_t k = 0; k < p.mm_spans.size(); ++k) {
      live->handoff.images.push_back(
          {p.mm_spans[k].offset, live->grids[k], p.mm_spans[k].content_hash});
    }
    live->handoff.mrope_position_delta = live->positions.delta;
  }
  RETURN_IF_ERROR(scheduler_->AddRequest(std::move(p)));
  by_scheduler_id_[live->sched_id.value] = live.get();
  requests_[request.id] = std::move(live);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<LlmEngine::Live>> LlmEngine::Prepare(
    EngineRequest& request, StreamCallback callback, scheduler::RequestParams* params) {
  if (request.id.empty() || requests_.contains(request.id)) {
    return absl::InvalidArgumentError(
        absl::StrCat("request id \"", request.id, "\" is empty or already in use"));
  }
  RETURN_IF_ERROR(model::ValidateSamplingParams(request.sampling, config_.text.vocab_size));
  std::vector<int32_t> ids = request.prompt_token_ids;
  if (!request.prompt.empty()) {
    if (!ids.empty()) return absl::InvalidArgumentError("give a prompt or token ids, not both");
    ASSIGN_OR_RETURN(ids, tokenizer_->Encode(request.prompt));
  }
  if (ids.empty()) return absl::InvalidArgumentError("the prompt is empty");
  for (int32_t id : ids) {
    if (id < 0 || id >= config_.text.vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("token id ", id, " is outside the vocabulary"));
    }
  }
  auto live = std::make_unique<Live>();
  RETURN_IF_ERROR(PrepareImages(request, *live, &ids));
  if (request.max_tokens_to_context) {
    request.sampling.max_tokens = sizing_.max_model_len - static_cast<int>(ids.size());
    if (request.sampling.max_tokens < std::max(1, request.sampling.min_tokens)) {
      return absl::InvalidArgumentError(
          absl::StrCat("prompt (", ids.size(), " tokens) leaves no room below the context length ",
                       sizing_.max_model_len));
    }
  }
  const int total = static_cast<int>(ids.size()) + request.sampling.max_tokens;
  if (total > sizing_.max_model_len) {
    return absl::InvalidArgumentError(
        absl::StrCat("prompt (", ids.size(), " tokens) + max_tokens (", request.sampling.max_tokens,
                     ") exceeds the context length ", sizing_.max_model_len));
  }
  scheduler::RequestParams& p = *params;
  p.id = scheduler::RequestId{next_id_++};
  p.prompt_token_ids.assign(ids.begin(), ids.end());
  p.max_tokens = request.sampling.max_tokens;
  p.ignore_eos = request.sampling.ignore_eos;
  p.stop_token_ids.assign(request.sampling.stop_token_ids.begin(),
                          request.sampling.stop_token_ids.end());
  if (!eos_ids_.empty()) {
    p.eos_token_id = eos_ids_.front();
    if (!request.sampling.ignore_eos) {
      p.stop_token_ids.insert(p.stop_token_ids.end(), eos_ids_.begin() + 1, eos_ids_.end());
    }
  }
  for (size_t k = 0; k < live->runner.image_offsets.size(); ++k) {
    // Prefix-cache keys: the image's content, so equal placeholders with
    // different pictures never share KV.
    const auto& emb = live->image_embeddings[k];
    ContentHash h = live->image_keys[k].has_value()
                        ? *live->image_keys[k]
                        : HashBytes(absl::string_view(reinterpret_cast<const char*>(emb.data()),
                                                      emb.size() * sizeof(float)));
    p.mm_spans.push_back({live->runner.image_offsets[k], live->runner.image_lengths[k], h});
  }
  for (const HandoffImage& h : request.handoff_images) {
    p.mm_spans.push_back({h.offset, static_cast<int32_t>(h.grid.num_tokens()), h.key});
  }
  live->id = request.id;
  live->sched_id = p.id;
  live->callback = std::move(callback);
  live->sampler = model::SamplerState(request.sampling.seed);
  live->runner.sampling = request.sampling;
  live->runner.sampler = &live->sampler;
  live->runner.eos_token_ids = request.sampling.ignore_eos ? std::vector<int32_t>() : eos_ids_;
  live->streamer = std::make_unique<model::TextStreamer>(*tokenizer_, request.sampling);
  live->prompt_tokens = static_cast<int>(ids.size());
  live->runner.prompt_positions = &live->positions;
  return live;
}

void LlmEngine::Finish(Live& live, FinishReason reason, StreamEvent& event) {
  event.finish_reason = reason;
  // A hand-off leaves held-back text to the decode engine's streamer.
  if (reason != FinishReason::kStopString && reason != FinishReason::kHandoff) {
    event.text += live.streamer->Finish();
  }
  event.prompt_tokens = live.prompt_tokens;
  event.completion_tokens = live.completion_tokens;
  const std::string id = live.id;
  by_scheduler_id_.erase(live.sched_id.value);
  StreamCallback cb = std::move(live.callback);
  requests_.erase(id);  // `live` is gone from here on
  cb(event);
}

absl::Status LlmEngine::Abort(const std::string& id) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return absl::NotFoundError(absl::StrCat("no request \"", id, "\""));
  RETURN_IF_ERROR(scheduler_->Abort(it->second->sched_id));
  commit_deadlines_.erase(id);
  StreamEvent event;
  event.request_id = id;
  Finish(*it->second, FinishReason::kAbort, event);
  return absl::OkStatus();
}

absl::Status LlmEngine::Step() {
  std::vector<std::string> expired;
  for (const auto& [id, deadline] : commit_deadlines_) {
    if (deadline.Expired()) expired.push_back(id);
  }
  for (const std::string& id : expired) {
    LOG(WARNING) << "request " << id << ": no KV commit before its deadline; freeing its blocks";
    RETURN_IF_ERROR(Abort(id));
  }
  const scheduler::SchedulerOutput& out = scheduler_->Schedule();
  // Handed-off image requests cannot be recomputed (no embeddings here).
  std::vector<std::string> unrecomputable;
  for (scheduler::RequestId id : out.preempted) {
    auto it = by_scheduler_id_.find(id.value);
    if (it != by_scheduler_id_.end() && it->second->handoff_images) {
      unrecomputable.push_back(it->second->id);
    }
  }
  RETURN_IF_ERROR(StepScheduled(out));
  for (const std::string& id : unrecomputable) {
    LOG(WARNING) << "request " << id << ": preempted, and its handed-off images cannot be "
                 << "recomputed here; aborting it";
    auto it = requests_.find(id);
    if (it == requests_.end()) continue;
    RETURN_IF_ERROR(scheduler_->Abort(it->second->sched_id));
    StreamEvent event;
    event.request_id = id;
    event.error = absl::ResourceExhaustedError(
        "the decode instance ran out of KV blocks and cannot recompute a handed-off image prompt");
    Finish(*it->second, FinishReason::kAbort, event);
  }
  return absl::OkStatus();
}

absl::Status LlmEngine::StepScheduled(const scheduler::SchedulerOutput& out) {
  if (out.scheduled.empty()) return scheduler_->UpdateFromOutput({}, nullptr);
  auto lookup = [this](scheduler::RequestId id) -> RunnerRequestState* {
    auto it = by_scheduler_id_.find(id.value);
    return it == by_scheduler_id_.end() ? nullptr : &it->second->runner;
  };
  ASSIGN_OR_RETURN(std::vector<model::SampleResult> sampled,
                   runner_->Step(out, scheduler_->kv_cache(), lookup));
  std::vector<scheduler::TokenId> tokens(out.scheduled.size(), kvpool::kNoToken);
  std::vector<Live*> sampling(out.scheduled.size(), nullptr);
  for (size_t i = 0; i < out.scheduled.size(); ++i) {
    if (!out.scheduled[i].samples) continue;
    tokens[i] = sampled[i].token;
    sampling[i] = by_scheduler_id_.at(out.scheduled[i].request->id().value);
  }
  // Prefill-only requests: their blocks, before UpdateFromOutput frees them.
  absl::flat_hash_map<uint64_t, std::vector<int32_t>> handoff_blocks;
  for (size_t i = 0; i < sampling.size(); ++i) {
    if (sampling[i] == nullptr || !sampling[i]->kv_handoff) continue;
    const scheduler::Request& r = *out.scheduled[i].request;
    std::vector<int32_t>& blocks = handoff_blocks[r.id().value];
    for (kvpool::BlockId b : scheduler_->kv_cache().block_table(r.block_table())) {
      blocks.push_back(b.value);
    }
  }
  std::vector<std::unique_ptr<scheduler::Request>> finished;
  RETURN_IF_ERROR(scheduler_->UpdateFromOutput(tokens, &finished));
  absl::flat_hash_map<uint64_t, scheduler::FinishReason> done;
  for (const auto& r : finished) done[r->id().value] = r->finish_reason();

  for (size_t i = 0; i < sampling.size(); ++i) {
    Live* live = sampling[i];
    if (live == nullptr) continue;
    StreamEvent event;
    event.request_id = live->id;
    event.token_ids.push_back(tokens[i]);
    if (live->runner.sampling.logprobs >= 0) event.logprobs.push_back(sampled[i]);
    ++live->completion_tokens;
    ASSIGN_OR_RETURN(model::TextStreamer::Step text,
                     live->streamer->Push(tokens[i], live->completion_tokens));
    event.text = std::move(text.text);
    auto d = done.find(live->sched_id.value);
    if (text.stopped) {
      if (d == done.end()) RETURN_IF_ERROR(scheduler_->Abort(live->sched_id));
      event.matched_stop = text.matched_stop;
      Finish(*live, FinishReason::kStopString, event);
    } else if (d != done.end() && live->kv_handoff &&
               d->second == scheduler::FinishReason::kLength &&
               live->runner.sampling.max_tokens > 1) {
      event.kv_blocks = std::move(handoff_blocks[live->sched_id.value]);
      event.handoff = std::move(live->handoff);
      Finish(*live, FinishReason::kHandoff, event);
    } else if (d != done.end()) {
      Finish(*live,
             d->second == scheduler::FinishReason::kLength ? FinishReason::kLength
                                                           : FinishReason::kStop,
             event);
    } else {
      live->callback(event);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<RemoteKvBlocks> LlmEngine::ReserveRemoteKv(EngineRequest request,
                                                          StreamCallback callback,
                                                          Deadline commit_by) {
  if (!request.images.empty() || !request.image_embeddings.empty()) {
    return absl::InvalidArgumentError("a KV hand-off carries image spans, not images");
  }
  if (!request.prompt.empty()) {
    return absl::InvalidArgumentError("a KV hand-off carries the prefill's token ids, not text");
  }
  scheduler::RequestParams p;
  ASSIGN_OR_RETURN(std::unique_ptr<Live> live, Prepare(request, std::move(callback), &p));
  ASSIGN_OR_RETURN(scheduler::Scheduler::RemoteKvReservation r,
                   scheduler_->ReserveRemoteKv(std::move(p)));
  RemoteKvBlocks out;
  out.num_cached_tokens = r.num_cached_tokens;
  out.mrope_position_delta = live->positions.delta;
  for (kvpool::BlockId b : r.blocks) out.blocks.push_back(b.value);
  by_scheduler_id_[live->sched_id.value] = live.get();
  commit_deadlines_.emplace(request.id, commit_by);
  requests_[request.id] = std::move(live);
  return out;
}

absl::Status LlmEngine::CommitRemoteKv(const std::string& id, int32_t first_token) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return absl::NotFoundError(absl::StrCat("no request \"", id, "\""));
  if (first_token < 0 || first_token >= config_.text.vocab_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("first token ", first_token, " is outside the vocabulary"));
  }
  Live& live = *it->second;
  std::vector<std::unique_ptr<scheduler::Request>> finished;
  RETURN_IF_ERROR(scheduler_->CommitRemoteKv(live.sched_id, first_token, &finished));
  commit_deadlines_.erase(id);
  // Continue the prefill's random stream (one draw per non-greedy sample)
  // and text stream (its text was streamed there).
  if (!live.runner.sampling.greedy()) live.sampler.Uniform();
  live.completion_tokens = 1;
  ASSIGN_OR_RETURN(model::TextStreamer::Step text, live.streamer->Push(first_token, 1));
  StreamEvent event;
  event.request_id = id;
  if (text.stopped) {
    if (finished.empty()) RETURN_IF_ERROR(scheduler_->Abort(live.sched_id));
    event.matched_stop = text.matched_stop;
    Finish(live, FinishReason::kStopString, event);
  } else if (!finished.empty()) {
    Finish(live,
           finished[0]->finish_reason() == scheduler::FinishReason::kLength ? FinishReason::kLength
                                                                            : FinishReason::kStop,
           event);
  }
  return absl::OkStatus();
}

}  // namespace mmserve::worker
