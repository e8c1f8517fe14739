// EspGroups' records (esp_groups.cc, esp_groups_prefill.cc,
// esp_groups_decode.cc include this; nothing else does).
#ifndef MMSERVE_LANGUAGE_SERVICE_ESP_GROUPS_INTERNAL_H_
#define MMSERVE_LANGUAGE_SERVICE_ESP_GROUPS_INTERNAL_H_

#include <memory>
#include <string>
#include <vector>

#include "language_service/esp_groups.h"
#include "transfer/esp_kv_exchange.h"

namespace mmserve::language {

// A span held here for another instance's master.
struct EspGroups::Span {
  std::string id;
  std::vector<int32_t> blocks;               // the kept range's, in token order
  int64_t keys = 0;                          // tokens of the range
  int lane = 0;                              // the master's member index: its inbox lane here
  std::string master;                        // the master's span-reply worker address
  transfer::ProcessIdentity master_process;  // gone (same host): the span is freed
  absl::Time last_query;
};

// A request this instance masters.
struct EspGroups::Decode {
  std::string id;
  uint64_t tag = 0;
  std::unique_ptr<worker::EspRequest> request;
  std::vector<int32_t> blocks;  // its span, then room for the new tokens
  int64_t keep_begin = 0;       // the first prompt token of its span
  int32_t last_token = -1;
  int master = 0;                                    // its member index
  std::vector<int> holders;                          // member indices holding KV, member order
  int self_holder = 0;                               // the master's place among them
  std::vector<transfer::NoticeBoardTarget> servers;  // span inboxes, member order
};

// One member's group prefill, on the loop thread.
struct EspGroups::Group {
  const v1::EspPlan* plan = nullptr;
  int member = 0;
  std::unique_ptr<worker::EspRequest> request;
  std::string id;
  uint64_t tag = 0;
  std::vector<transfer::EspEndpoint> endpoints;  // member order
  int64_t keep_begin = 0, keep_len = 0;
  bool master = false, sampler = false, holder = false;  // holder: keeps KV for a master elsewhere
  std::vector<int32_t> blocks;
  bool held = false;  // blocks are held in the engine under id
  std::unique_ptr<transfer::UcxEspExchange> exchange;
  std::vector<float> logits;
};

}  // namespace mmserve::language

#endif  // MMSERVE_LANGUAGE_SERVICE_ESP_GROUPS_INTERNAL_H_
