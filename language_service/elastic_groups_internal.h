// ElasticGroups' records (elastic_groups.cc, elastic_groups_prefill.cc,
// elastic_groups_decode.cc include this; nothing else does).
#ifndef MMSERVE_LANGUAGE_SERVICE_ELASTIC_GROUPS_INTERNAL_H_
#define MMSERVE_LANGUAGE_SERVICE_ELASTIC_GROUPS_INTERNAL_H_

#include <memory>
#include <string>
#include <vector>

#include "language_service/elastic_groups.h"
#include "transfer/elastic_kv_exchange.h"

namespace mmserve::language {

// A span held here for another instance's master.
struct ElasticGroups::Span {
  std::string id;
  std::vector<int32_t> blocks;  // the kept range's, in token order
  int64_t keys = 0;             // tokens of the range
  // The processes of the request's masters (its chain): one gone (same
  // host), the request is lost and the span is freed.
  std::vector<transfer::ProcessIdentity> masters;
  absl::Time last_query;
};

// A request this instance masters (the engine decodes it).
struct ElasticGroups::Decode {
  std::string id;
  uint64_t tag = 0;
  // A later master's request until Resume hands it to the engine.
  std::unique_ptr<worker::ElasticRequest> request;
  int64_t prompt_len = 0;
  std::vector<int32_t> blocks;  // its span, then room for the new tokens
  int64_t keep_begin = 0;       // the first token of its span
  int64_t first_index = 0;      // the first KV index it writes (its range's begin)
  // Its span reaches KV index reserved_end (exclusive; its blocks may hold
  // a few slots more) and grows by `window` tokens at a time up to
  // range_end (window 0: it holds its whole range from the start).
  int64_t reserved_end = 0, range_end = 0, window = 0;
  bool last = true;          // the chain's last master: no one to move on to
  uint64_t holder_set = 0;   // equal for requests of the same holders (and lane)
  int master = 0;            // its member index
  std::vector<int> holders;  // member indices holding KV, member order
  int self_holder = 0;       // the master's place among them
  std::vector<transfer::NoticeBoardTarget> servers;  // span inboxes, member order
  std::vector<transfer::ProcessIdentity> masters;    // the chain's processes (its span's)
};

// One member's group prefill, on the loop thread.
struct ElasticGroups::Group {
  const v1::ElasticPlan* plan = nullptr;
  int member = 0;
  std::unique_ptr<worker::ElasticRequest> request;
  std::string id;
  uint64_t tag = 0;
  std::vector<transfer::ElasticEndpoint> endpoints;      // member order
  int64_t keep_begin = 0, keep_len = 0;                  // keep_begin: its span's first token
  bool master = false, sampler = false, holder = false;  // holder: keeps KV for a master elsewhere
  // The masters in decode order (one unless members have decode ranges),
  // this member's place among them (-1: none) and, there, the KV indices
  // [decode_begin, decode_end) it writes.
  std::vector<int> chain;
  int chain_pos = -1;
  int64_t decode_begin = 0, decode_end = 0;
  // Where its span ends at first: decode_end, or decode_begin plus the
  // plan's decode window.
  int64_t reserved_end = 0;
  bool lanes = false;  // lanes_ names it
  std::vector<int32_t> blocks;
  bool held = false;  // blocks are held in the engine under id
  std::unique_ptr<transfer::UcxElasticExchange> exchange;
  std::vector<float> logits;
};

}  // namespace mmserve::language

#endif  // MMSERVE_LANGUAGE_SERVICE_ELASTIC_GROUPS_INTERNAL_H_
