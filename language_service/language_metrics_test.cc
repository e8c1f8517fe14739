#include "language_service/language_metrics.h"

#include <catch2/catch.hpp>
#include <string>

namespace mmserve::language {
namespace {

TEST_CASE("every language metric is shown once the struct is built", "[metrics]") {
  metrics::Registry registry;
  LanguageMetrics m(registry);
  const std::string page = registry.Render();
  for (const char* name :
       {"mmserve_language_resumes_total", "mmserve_language_transfer_bytes_total",
        "mmserve_language_lost_images_total", "mmserve_language_images_received_total",
        "mmserve_language_transfer_seconds", "mmserve_language_ttft_seconds",
        "mmserve_language_itl_seconds", "mmserve_language_e2e_seconds",
        "mmserve_language_step_seconds", "mmserve_language_embedding_round_trips",
        "mmserve_language_kv_handoff_round_trips", "mmserve_language_kv_handoff_total",
        "mmserve_language_kv_handoff_exposed_seconds",
        "mmserve_language_mm_handoff_blocked_seconds_total",
        "mmserve_language_grammar_mask_seconds_total",
        "mmserve_language_grammar_mask_wait_seconds_total", "mmserve_language_mm_rows_total",
        "mmserve_language_prompt_tokens_total", "mmserve_language_expected_cached_images_total"}) {
    INFO(name);
    CHECK(page.find(name) != std::string::npos);
  }
  for (const char* path : {"path=\"mapped\"", "path=\"rendezvous\"", "path=\"put\"",
                           "kv=\"cached\"", "kv=\"computed\"", "found=\"yes\"", "found=\"no\""}) {
    INFO(path);
    CHECK(page.find(path) != std::string::npos);
  }
}

TEST_CASE("a second struct over the same registry shares its series", "[metrics]") {
  metrics::Registry registry;
  LanguageMetrics a(registry);
  LanguageMetrics b(registry);
  a.kv_handoffs[static_cast<int>(transfer::KvHandoffPath::kPut)]->Increment();
  CHECK(b.kv_handoffs[static_cast<int>(transfer::KvHandoffPath::kPut)]->value() == 1);
  CHECK(a.rows_inline != a.rows_by_descriptor);
}

}  // namespace
}  // namespace mmserve::language
