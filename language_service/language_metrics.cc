#include "language_service/language_metrics.h"

namespace mmserve::language {

LanguageMetrics::LanguageMetrics(metrics::Registry& registry) {
  resumes = &registry.GetCounter("mmserve_language_resumes_total",
                                 "Embedding transfers that needed more than one chunk.");
  transfer_bytes =
      &registry.GetCounter("mmserve_language_transfer_bytes_total", "Embedding bytes received.");
  lost_images = &registry.GetCounter("mmserve_language_lost_images_total",
                                     "Images whose encoder failed during the transfer.");
  images_received =
      &registry.GetCounter("mmserve_language_images_received_total", "Images fully received.");
  const char* cached_help =
      "Images the router sent without an encoder, expecting their KV in this instance's prefix "
      "cache, by found: yes (admitted on the cached KV) or no (evicted: reported lost, then "
      "encoded).";
  images_found_cached = &registry.GetCounter("mmserve_language_expected_cached_images_total",
                                             cached_help, {{"found", "yes"}});
  images_not_cached = &registry.GetCounter("mmserve_language_expected_cached_images_total",
                                           cached_help, {{"found", "no"}});
  const char* prompt_help =
      "Prompt tokens of the requests this instance prefilled (role both or prefill), counted as "
      "each finishes, by kv: cached (found in the prefix cache) or computed.";
  prompt_tokens_cached =
      &registry.GetCounter("mmserve_language_prompt_tokens_total", prompt_help, {{"kv", "cached"}});
  prompt_tokens_computed = &registry.GetCounter("mmserve_language_prompt_tokens_total", prompt_help,
                                                {{"kv", "computed"}});
  transfer_seconds = &registry.GetHistogram("mmserve_language_transfer_seconds",
                                            "From asking for an image to holding all of it.",
                                            metrics::LatencyBuckets());
  ttft_seconds = &registry.GetHistogram("mmserve_language_ttft_seconds", "Submit to first token.",
                                        metrics::LatencyBuckets());
  itl_seconds = &registry.GetHistogram("mmserve_language_itl_seconds",
                                       "Gap between consecutive tokens of a request.",
                                       metrics::LatencyBuckets());
  e2e_seconds = &registry.GetHistogram("mmserve_language_e2e_seconds", "Submit to last token.",
                                       metrics::LatencyBuckets());
  step_seconds = &registry.GetHistogram("mmserve_language_step_seconds",
                                        "One engine step (schedule, forward, sample).",
                                        metrics::LatencyBuckets());
  // Whole round trips per request: 0 for a prompt without images, 1 for an
  // image in one chunk from a connected encoder.
  embedding_round_trips = &registry.GetHistogram(
      "mmserve_language_embedding_round_trips",
      "Per admitted request, the most embedding control round trips one of its images waited "
      "for (images move concurrently): Connect to a new encoder, then init and each resume, each "
      "answered by a chunk.",
      {0, 1, 2, 3, 4, 6, 8, 16});
  RegisterKvHandoff(registry);
  handoff_blocked_seconds = &registry.GetCounter(
      "mmserve_language_mm_handoff_blocked_seconds_total",
      "Loop CPU time spent moving image embeddings: copying them out of the receive buffer and "
      "putting image rows (their floats, or descriptors) into tensor-parallel steps.");
  grammar_mask_seconds = &registry.GetCounter(
      "mmserve_language_grammar_mask_seconds_total",
      "Time spent computing structured-output token masks (on a helper thread, while the "
      "forward pass runs).");
  grammar_mask_wait_seconds = &registry.GetCounter(
      "mmserve_language_grammar_mask_wait_seconds_total",
      "Time sampling waited for structured-output token masks after the forward pass: the part "
      "of the mask time the forward did not hide.");
  const char* rows_help =
      "Image embedding rows rank 0 sent to the other tensor-parallel ranks, by placement "
      "(descriptor: an offset into the receive buffer every rank maps; inline: the floats in the "
      "step).";
  rows_by_descriptor = &registry.GetCounter("mmserve_language_mm_rows_total", rows_help,
                                            {{"placement", "descriptor"}});
  rows_inline =
      &registry.GetCounter("mmserve_language_mm_rows_total", rows_help, {{"placement", "inline"}});
}

// The P/D hand-off's metrics (role prefill).
void LanguageMetrics::RegisterKvHandoff(metrics::Registry& registry) {
  kv_handoff_round_trips = &registry.GetHistogram(
      "mmserve_language_kv_handoff_round_trips",
      "Per KV hand-off (role prefill), the round trips it waited for before the first token "
      "went out: AllocateKv, the landed replies or flushes of its writes, waited for together "
      "(none when every write copied into a decode cache mapped here; layer-wise, one per layer "
      "group), CommitKv.",
      {1, 2, 3, 4, 5, 6, 8, 16});
  for (transfer::KvHandoffPath path :
       {transfer::KvHandoffPath::kMapped, transfer::KvHandoffPath::kRendezvous,
        transfer::KvHandoffPath::kPut}) {
    kv_handoffs[static_cast<int>(path)] = &registry.GetCounter(
        "mmserve_language_kv_handoff_total",
        "KV written to decode ranks (role prefill; one per hand-off and pair of a rank here and a "
        "decode rank that share KV heads), by path: mapped "
        "(copied into the rank's shared segment, mapped here: shm), rendezvous (active messages "
        "into its private cache: tcp, or shm across IPC namespaces), put (a head slice put token "
        "by token).",
        {{"path", transfer::KvHandoffPathName(path)}});
  }
  kv_handoff_layer_groups = &registry.GetCounter(
      "mmserve_language_kv_handoff_layer_groups_total",
      "Layer groups of layer-wise KV hand-offs written to decode ranks (role prefill; one per "
      "group of --handoff_layer_group layers and pair of a rank here and a decode rank that share "
      "KV heads), each sent while the prompt's next layers computed.");
  kv_handoff_exposed_seconds = &registry.GetHistogram(
      "mmserve_language_kv_handoff_exposed_seconds",
      "Per KV hand-off (role prefill), from the first token sampled to the hand-off committed "
      "(the first token goes out then): the hand-off time the prompt's forward did not hide. A "
      "whole hand-off shows all of it; a layer-wise one its last group and CommitKv.",
      {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5,
       10});
}

}  // namespace mmserve::language
