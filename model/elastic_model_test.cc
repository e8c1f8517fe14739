// Elastic sequence parallelism in Qwen2Model (model/elastic.h), members as
// threads of this process exchanging K/V through InProcessKvGroup:
// - prefill over 2 and 3 members: every row's logits bitwise equal to one
//   instance's prefill of the whole prompt (so within the fp32 tolerance of
//   the transformers goldens, as qwen2_parity_test checks for one instance),
//   with text and with image rows (embedding overrides, M-RoPE positions);
// - scale-down: each member holds exactly its kept range's blocks, whose K/V
//   is bitwise the single instance's for those tokens;
// - decode with the KV spread over 2 members (master + one span holder):
//   greedy ids equal to one instance's (and the golden's), logits within
//   kFp32Tolerance = 1e-3. Why that bound: the merge changes only the
//   rounding of each attention output (split_attention.h; the derived
//   per-element bound is ~1e-4 relative to max |v|, measured ~1e-7), the
//   same kind of reordering as transformers' eager attention against ours,
//   which the parity test bounds by 1e-3 on these logits;
// - a mixed batch (ForwardSpread): an ordinary prefill chunk, an ordinary
//   decode and a spread decode in one step give each the bits it gets alone;
// - a failing member aborts the exchange: the others end UNAVAILABLE.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "model/cpu/split_attention.h"
#include "model/cpu/thread_pool.h"
#include "model/elastic_local_exchange.h"
#include "model/elastic_testing.h"
#include "model/qwen2_golden_testing.h"
#include "model/qwen2_model.h"

namespace mmserve::model {
namespace {

constexpr float kFp32Tolerance = 1e-3f;
constexpr int64_t kBlockSize = kElasticBlockSize;
constexpr int kGreedySteps = 32;

// The group's prefill with the in-process exchange.
std::vector<std::unique_ptr<Member>> RunLocalGroup(const LoadedModel& m, const Prompt& p,
                                                   const std::vector<Share>& shares) {
  const TextConfig& cfg = m.cfg.text;
  InProcessKvGroup group(static_cast<int>(shares.size()), cfg.num_hidden_layers, p.len(),
                         cfg.num_key_value_heads * cfg.head_dim(), absl::Seconds(60));
  std::vector<KvExchange*> exchanges;
  for (size_t i = 0; i < shares.size(); ++i)
    exchanges.push_back(&group.member(static_cast<int>(i)));
  return RunGroup(m, p, shares, exchanges);
}

// Every row's logits and every kept token's K/V against the single run.
void CheckPrefill(const LoadedModel& m, const Prompt& p, const SingleRun& single,
                  Instance& single_inst) {
  const int64_t vocab = m.cfg.text.vocab_size;
  const KvCacheShape& ks = single_inst.kv->shape();
  const int64_t width = ks.num_kv_heads * ks.head_dim;
  for (const std::vector<Share>& plan : Plans(p.len())) {
    INFO("members " << plan.size());
    auto members = RunLocalGroup(m, p, plan);
    int64_t kept_blocks = 0, kept_tokens = 0;
    for (size_t i = 0; i < plan.size(); ++i) {
      Member& mem = *members[i];
      REQUIRE(mem.status.ok());
      for (size_t r = 0; r < plan[i].rows.size(); ++r) {
        CHECK(std::memcmp(&mem.logits[r * vocab], &single.logits[plan[i].rows[r] * vocab],
                          vocab * sizeof(float)) == 0);
      }
      const int64_t keep = plan[i].keep_end - plan[i].keep_begin;
      CHECK(static_cast<int64_t>(mem.inst->blocks.size()) == (keep + kBlockSize - 1) / kBlockSize);
      kept_blocks += static_cast<int64_t>(mem.inst->blocks.size());
      kept_tokens += keep;
      for (int64_t l = 0; l < ks.num_layers; ++l) {
        for (int64_t j = 0; j < keep; ++j) {
          const int64_t mine = mem.inst->Slot(j), theirs = single_inst.Slot(plan[i].keep_begin + j);
          CHECK(std::memcmp(mem.inst->kv->Key(l) + mine * width,
                            single_inst.kv->Key(l) + theirs * width, width * sizeof(float)) == 0);
          CHECK(std::memcmp(mem.inst->kv->Value(l) + mine * width,
                            single_inst.kv->Value(l) + theirs * width, width * sizeof(float)) == 0);
        }
      }
    }
    CHECK(kept_tokens == p.len());  // the KV bytes of one instance, no more
    CHECK(kept_blocks == (p.len() + kBlockSize - 1) / kBlockSize);  // block-aligned ranges
  }
}

TEST_CASE("elastic prefill over 2 and 3 members is bitwise one instance's, KV scaled down",
          "[elastic]") {
  for (const char* name : {"qwen2vl-tiny-gqa2-untied-sharded", "qwen2vl-tiny-mha-tied",
                           "qwen2vl-tiny-mqa-bf16", "qwen2vl-tiny-gqa8-padvocab-nested"}) {
    LoadedModel m = LoadTestModel(name);
    const nlohmann::json g =
        ReadJsonFile(std::string("model/testdata/goldens/") + name + "/lm_golden.json");
    const std::vector<int> masked = g["eos_ids_masked"].get<std::vector<int>>();
    cpu::ThreadPool pool(2);
    Qwen2Model model(m.cfg.text, *m.weights, pool);
    for (const auto& gp : g["prompts"]) {
      if (gp["compute_dtype"] != "fp32" || (gp["name"] != "chat" && gp["name"] != "long")) continue;
      const auto ids = gp["input_ids"].get<std::vector<int32_t>>();
      for (const Prompt& p : {TextPrompt(ids), ImagePrompt(ids, m.cfg.text.hidden_size)}) {
        INFO("model " << name << " prompt " << gp["name"]
                      << (p.overrides.empty() ? "" : " + image"));
        Instance inst(model, 128, 1);
        const SingleRun single = RunSingle(model, inst, p, masked, 1);
        CheckPrefill(m, p, single, inst);
      }
    }
  }
}

TEST_CASE("elastic decode with the KV spread over 2: greedy ids equal, logits within 1e-3",
          "[elastic]") {
  for (const char* name : {"qwen2vl-tiny-gqa2-untied-sharded", "qwen2vl-tiny-mha-tied"}) {
    LoadedModel m = LoadTestModel(name);
    const nlohmann::json g =
        ReadJsonFile(std::string("model/testdata/goldens/") + name + "/lm_golden.json");
    const std::vector<int> masked = g["eos_ids_masked"].get<std::vector<int>>();
    const int64_t vocab = m.cfg.text.vocab_size;
    cpu::ThreadPool pool(2);
    Qwen2Model model(m.cfg.text, *m.weights, pool);
    for (const auto& gp : g["prompts"]) {
      if (gp["compute_dtype"] != "fp32" || (gp["name"] != "chat" && gp["name"] != "long")) continue;
      INFO("model " << name << " prompt " << gp["name"]);
      const Prompt p = TextPrompt(gp["input_ids"].get<std::vector<int32_t>>());
      Instance inst(model, 128, 1);
      const SingleRun single = RunSingle(model, inst, p, masked, kGreedySteps);
      CHECK(single.greedy == gp["greedy_ids"].get<std::vector<int32_t>>());
      // A keeps [0, a); B keeps [a, L) and is the master.
      const int64_t a = Plans(p.len())[0][0].keep_end;
      auto members = RunLocalGroup(m, p, Plans(p.len())[0]);
      REQUIRE(members[1]->status.ok());
      LocalPeers peers(*members[0], a, m.cfg.text);
      const SpreadDecode d = DecodeSpread(*members[1], peers, p, a, masked, kGreedySteps, vocab);
      float worst = 0;
      for (size_t s = 0; s < d.logits.size(); ++s) {
        worst = std::max(worst, MaxAbsDiff(d.logits[s], single.decode_logits[s].data()));
      }
      std::printf("elastic decode %-36s %-5s max|dlogit| vs one instance %.3g\n", name,
                  std::string(gp["name"]).c_str(), worst);
      CHECK(d.greedy == single.greedy);
      CHECK(worst <= kFp32Tolerance);
    }
  }
}

// An ordinary sequence beside the master's spread one, in the master's cache:
// the prompt's first `len` tokens on blocks of its own.
struct Ordinary {
  std::vector<int32_t> blocks;
  ForwardBatch Chunk(const Prompt& p, int64_t begin, int64_t end) const {
    ForwardBatch b;
    for (int64_t i = begin; i < end; ++i) {
      b.token_ids.push_back(p.ids[i]);
      b.slot_mapping.push_back(blocks[i / kBlockSize] * kBlockSize + i % kBlockSize);
    }
    for (int c = 0; c < 3; ++c) {
      for (int64_t i = begin; i < end; ++i) b.positions.push_back(i);
    }
    b.sequences = {{0, end - begin, end, blocks}};
    b.logits_rows = {end - begin - 1};
    return b;
  }
};

// `parts` as one batch, in order (rows, positions, slots and logits rows
// shifted).
ForwardBatch Concat(const std::vector<ForwardBatch>& parts) {
  ForwardBatch out;
  int64_t total = 0;
  for (const ForwardBatch& b : parts) total += b.num_tokens();
  out.positions.assign(3 * total, 0);
  int64_t row = 0;
  for (const ForwardBatch& b : parts) {
    const int64_t n = b.num_tokens();
    for (int c = 0; c < 3; ++c) {
      std::copy_n(&b.positions[c * n], n, &out.positions[c * total + row]);
    }
    out.token_ids.insert(out.token_ids.end(), b.token_ids.begin(), b.token_ids.end());
    out.slot_mapping.insert(out.slot_mapping.end(), b.slot_mapping.begin(), b.slot_mapping.end());
    for (SequenceChunk s : b.sequences) {
      s.query_start += row;
      out.sequences.push_back(std::move(s));
    }
    for (int64_t r : b.logits_rows) out.logits_rows.push_back(r + row);
    row += n;
  }
  return out;
}

TEST_CASE("a mixed batch gives ordinary and spread sequences the bits each gets alone",
          "[elastic]") {
  LoadedModel m = LoadTestModel("qwen2vl-tiny-gqa2-untied-sharded");
  const nlohmann::json g =
      ReadJsonFile("model/testdata/goldens/qwen2vl-tiny-gqa2-untied-sharded/lm_golden.json");
  const std::vector<int> masked = g["eos_ids_masked"].get<std::vector<int>>();
  std::vector<int32_t> ids;
  for (const auto& gp : g["prompts"]) {
    if (gp["compute_dtype"] == "fp32" && gp["name"] == "chat")
      ids = gp["input_ids"].get<std::vector<int32_t>>();
  }
  const Prompt p = TextPrompt(ids);
  const int64_t vocab = m.cfg.text.vocab_size;
  const int64_t a = Plans(p.len())[0][0].keep_end;
  auto members = RunLocalGroup(m, p, Plans(p.len())[0]);
  REQUIRE(members[1]->status.ok());
  Member& master = *members[1];
  LocalPeers peers(*members[0], a, m.cfg.text);
  // Two ordinary sequences on blocks of their own: one prefilled whole
  // first (it decodes in the mixed step), one prefilled in the mixed step.
  Ordinary decoding, prefilling;
  for (Ordinary* o : {&decoding, &prefilling}) {
    for (int64_t i = 0; i < (p.len() + kBlockSize) / kBlockSize; ++i) {
      o->blocks.push_back(master.inst->free.back());
      master.inst->free.pop_back();
    }
  }
  std::vector<float> logits;
  REQUIRE(master.model->Forward(decoding.Chunk(p, 0, p.len()), *master.inst->kv, &logits).ok());
  const int32_t next = GreedyToken(logits, masked);
  const int32_t first =
      GreedyToken(std::vector<float>(master.logits.end() - vocab, master.logits.end()), masked);
  Prompt longer = p;
  longer.ids.push_back(next);
  const std::vector<ForwardBatch> parts = {
      prefilling.Chunk(p, 0, p.len() - 3),
      DecodeBatch(*master.inst, first, p.len(), p.len() - a + 1),
      decoding.Chunk(longer, p.len(), p.len() + 1)};
  // Alone: each part as its own step (a repeated step rewrites the same K/V).
  std::vector<std::vector<float>> alone(3);
  REQUIRE(master.model->Forward(parts[0], *master.inst->kv, &alone[0]).ok());
  REQUIRE(master.model->ForwardElasticDecode(parts[1], *master.inst->kv, peers, &alone[1]).ok());
  REQUIRE(master.model->Forward(parts[2], *master.inst->kv, &alone[2]).ok());
  const ForwardBatch mixed = Concat(parts);
  const SpreadSequences spread{.sequences = {1}, .peers = &peers};
  REQUIRE(master.model->ForwardSpread(mixed, *master.inst->kv, spread, &logits).ok());
  REQUIRE(logits.size() == 3 * static_cast<size_t>(vocab));
  for (int k = 0; k < 3; ++k) {
    INFO("part " << k);
    CHECK(std::memcmp(&logits[k * vocab], alone[k].data(), vocab * sizeof(float)) == 0);
  }
  // A spread list that names a prefill chunk or is out of order is refused.
  const SpreadSequences chunk{.sequences = {0}, .peers = &peers};
  CHECK(master.model->ForwardSpread(mixed, *master.inst->kv, chunk, &logits).code() ==
        absl::StatusCode::kInvalidArgument);
  const SpreadSequences unordered{.sequences = {2, 1}, .peers = &peers};
  CHECK(master.model->ForwardSpread(mixed, *master.inst->kv, unordered, &logits).code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE("a member that fails aborts the exchange: the others end UNAVAILABLE", "[elastic]") {
  LoadedModel m = LoadTestModel("qwen2vl-tiny-mha-tied");
  Prompt p = TextPrompt({1, 2, 3, 4, 5, 6, 7, 8});
  std::vector<Share> plan = {{Range(0, 4), 0, 4}, {Range(4, 8), 4, 8}};
  plan[1].rows.back() = 3;  // not ascending: member 1 refuses its batch
  auto members = RunLocalGroup(m, p, plan);
  CHECK(members[1]->status.code() == absl::StatusCode::kInvalidArgument);
  CHECK(members[0]->status.code() == absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace mmserve::model
