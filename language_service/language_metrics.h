// The metrics of a language instance's requests, images, steps and KV
// hand-offs: every handle made once, when the instance starts, so that the
// exposition shows each series (at 0) before the first request.
//
//   LanguageMetrics m(registry);
//   m.ttft_seconds->Observe(seconds);
//
// The handles are the registry's (thread-safe); the registry must outlive
// the struct.
#ifndef MMSERVE_LANGUAGE_SERVICE_LANGUAGE_METRICS_H_
#define MMSERVE_LANGUAGE_SERVICE_LANGUAGE_METRICS_H_

#include <array>

#include "common/metrics.h"
#include "transfer/kv_handoff.h"

namespace mmserve::language {

struct LanguageMetrics {
  explicit LanguageMetrics(metrics::Registry& registry);

  // Embeddings from encoders.
  metrics::Counter* resumes;
  metrics::Counter* transfer_bytes;
  metrics::Counter* lost_images;
  metrics::Counter* images_received;
  // Images expected in the prefix cache (PromptImage.expect_cached), by
  // whether their KV was there.
  metrics::Counter* images_found_cached;
  metrics::Counter* images_not_cached;
  // Prompt tokens of the requests prefilled here, as they finish
  // (mmserve_language_prompt_tokens_total): found in the prefix cache, or
  // computed.
  metrics::Counter* prompt_tokens_cached;
  metrics::Counter* prompt_tokens_computed;
  metrics::Histogram* transfer_seconds;
  metrics::Histogram* embedding_round_trips;
  // Requests and steps.
  metrics::Histogram* ttft_seconds;
  metrics::Histogram* itl_seconds;
  metrics::Histogram* e2e_seconds;
  metrics::Histogram* step_seconds;
  // Role prefill's KV hand-offs (every role shows them, at 0 where nothing
  // is handed off).
  metrics::Histogram* kv_handoff_round_trips;
  std::array<metrics::Counter*, 3> kv_handoffs{};  // by transfer::KvHandoffPath
  metrics::Counter* kv_handoff_layer_groups;
  metrics::Histogram* kv_handoff_exposed_seconds;
  // Loop time moving image embeddings, image rows sent to tensor-parallel
  // ranks, structured-output masks.
  metrics::Counter* handoff_blocked_seconds;
  metrics::Counter* rows_by_descriptor;
  metrics::Counter* rows_inline;
  metrics::Counter* grammar_mask_seconds;
  metrics::Counter* grammar_mask_wait_seconds;

 private:
  void RegisterKvHandoff(metrics::Registry& registry);
};

}  // namespace mmserve::language

#endif  // MMSERVE_LANGUAGE_SERVICE_LANGUAGE_METRICS_H_
