// What the router shares with every Generate call, and where a call's
// output goes.
#ifndef MMSERVE_ROUTER_ROUTER_CONTEXT_H_
#define MMSERVE_ROUTER_ROUTER_CONTEXT_H_

#include <functional>
#include <memory>

#include "absl/status/status.h"
#include "proto/inference.pb.h"
#include "router/call_metrics.h"
#include "router/instance_table.h"
#include "router/public_access.h"
#include "router/request_validation.h"

namespace mmserve::model {
class Tokenizer;
}

namespace mmserve::router {

class ElasticPool;
class MediaFetcher;
struct MediaFetchMetrics;

struct RouterContext {
  RouterOptions options;
  InstanceTable* instances = nullptr;
  const CallMetrics* metrics = nullptr;
  // API keys and per-client caps of the public API; null: open, no cap.
  PublicAccess* access = nullptr;
  // router --elastic: the elastic manager (requests go to it while it has a
  // healthy elastic instance) and the tokenizer it sizes prompts with.
  ElasticPool* elastic = nullptr;
  const model::Tokenizer* tokenizer = nullptr;
  // Fetches Image.url / Video.url (router/request_fetch.h); null or
  // disabled: a URL is refused.
  std::shared_ptr<const MediaFetcher> media;
  const MediaFetchMetrics* media_metrics = nullptr;
};

// on_end runs exactly once, after the last on_response.
struct CallSink {
  std::function<void(mmserve::v1::GenerateResponse)> on_response;
  std::function<void(absl::Status)> on_end;
};

}  // namespace mmserve::router

#endif  // MMSERVE_ROUTER_ROUTER_CONTEXT_H_
