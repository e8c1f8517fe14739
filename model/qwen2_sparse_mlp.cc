// Qwen2Model::SparseMlp: a mixture-of-experts layer, as transformers'
// Qwen3MoeSparseMoeBlock and Qwen3VLMoeTextSparseMoeBlock compute it (the
// latter evaluates every expert on every token and weights the unchosen
// ones by 0: the same sum, in another order). Per token: the router's logits, a
// float softmax over all experts, the num_experts_per_tok most likely
// (ties to the lower expert id), renormalized to sum 1 when norm_topk_prob;
// each chosen expert's SwiGLU MLP on the token, scaled by its weight and
// summed in expert order. Tokens are gathered per expert so that each
// expert's matrices are read once per step; a row's result does not depend
// on the other rows gathered with it (the linear kernels are row-invariant),
// so outputs stay batch-invariant. With tensor parallelism every rank holds
// the whole router (the same routing everywhere) and a slice of each
// expert's width; the caller sums the partial outputs over the ranks.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <utility>
#include <vector>

#include "model/cpu/ops.h"
#include "model/qwen2_model.h"

namespace mmserve::model {
namespace {

struct Routed {
  int64_t token;
  float weight;
};

// Appends token t's experts and weights to by_expert.
void RouteToken(const float* logits, int experts, int top_k, bool renormalize, int64_t t,
                std::vector<std::vector<Routed>>* by_expert) {
  float max = logits[0];
  for (int e = 1; e < experts; ++e) max = std::max(max, logits[e]);
  std::vector<float> prob(experts);
  float sum = 0.0f;
  for (int e = 0; e < experts; ++e) {
    prob[e] = std::exp(logits[e] - max);
    sum += prob[e];
  }
  for (float& p : prob) p /= sum;
  std::vector<int> order(experts);
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + top_k, order.end(), [&](int a, int b) {
    return prob[a] > prob[b] || (prob[a] == prob[b] && a < b);
  });
  float chosen = 0.0f;
  for (int i = 0; i < top_k; ++i) chosen += prob[order[i]];
  for (int i = 0; i < top_k; ++i) {
    const float w = renormalize ? prob[order[i]] / chosen : prob[order[i]];
    (*by_expert)[order[i]].push_back({t, w});
  }
}

}  // namespace

void Qwen2Model::SparseMlp(const Qwen2LayerWeights& w, int64_t num_tokens) {
  const int experts = cfg_.num_experts, top_k = cfg_.num_experts_per_tok;
  router_logits_.resize(num_tokens * experts);
  Linear(x_.data(), num_tokens, w.router, nullptr, router_logits_.data());
  std::vector<std::vector<Routed>> by_expert(experts);
  for (int64_t t = 0; t < num_tokens; ++t) {
    RouteToken(&router_logits_[t * experts], experts, top_k, cfg_.norm_topk_prob, t, &by_expert);
  }
  o_.assign(num_tokens * hidden_, 0.0f);
  for (int e = 0; e < experts; ++e) {
    const std::vector<Routed>& rows = by_expert[e];
    if (rows.empty()) continue;
    const Qwen2LayerWeights::Expert& x = w.experts[e];
    const int64_t m = static_cast<int64_t>(rows.size()), width = x.gate.rows;
    expert_x_.resize(m * hidden_);
    for (int64_t i = 0; i < m; ++i) {
      std::memcpy(&expert_x_[i * hidden_], &x_[rows[i].token * hidden_], hidden_ * sizeof(float));
    }
    gate_.resize(m * width);
    up_.resize(m * width);
    LinearMany(expert_x_.data(), m,
               {{&x.gate, nullptr, gate_.data()}, {&x.up, nullptr, up_.data()}});
    cpu::SiluMul(pool_, gate_.data(), up_.data(), m * width, gate_.data());
    expert_y_.resize(m * hidden_);
    Linear(gate_.data(), m, x.down, nullptr, expert_y_.data());
    for (int64_t i = 0; i < m; ++i) {
      float* out = &o_[rows[i].token * hidden_];
      const float* y = &expert_y_[i * hidden_];
      for (int64_t j = 0; j < hidden_; ++j) out[j] += y[j] * rows[i].weight;
    }
  }
}

}  // namespace mmserve::model
