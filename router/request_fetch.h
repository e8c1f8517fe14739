// The remote media of a GenerateRequest (Image.url, Video.url) fetched and
// put in place as bytes, before the request is validated and placed: from
// then on a fetched image is the same as one sent inline (its content hash
// is of the bytes, never of the URL). A request's URLs are fetched
// concurrently, each on a thread of its own, and the whole fetch is bounded
// by the fetcher's timeout.
//
//   auto cancel = std::make_shared<FetchCancel>();   // Cancel() when the client goes
//   RETURN_IF_ERROR(FetchRequestMedia(context.media, context.options, &request,
//                                     cancel, GrpcMediaField));
//
// Blocks the caller: run it where blocking is expected (an HTTP handler
// thread) or on a thread of its own (gRPC). Thread-safe.
#ifndef MMSERVE_ROUTER_REQUEST_FETCH_H_
#define MMSERVE_ROUTER_REQUEST_FETCH_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "common/metrics.h"
#include "proto/inference.pb.h"
#include "router/media_fetch.h"
#include "router/request_validation.h"

namespace mmserve::router {

// How the fetches of remote media end, for /metrics.
struct MediaFetchMetrics {
  explicit MediaFetchMetrics(metrics::Registry& registry);
  // URLs by result: fetched, refused (a check or the server), timed_out,
  // cancelled (the client went away), disabled (remote media off).
  metrics::Counter& fetched;
  metrics::Counter& refused;
  metrics::Counter& timed_out;
  metrics::Counter& cancelled;
  metrics::Counter& disabled;
  // The whole fetch of a request's URLs, however it ended.
  metrics::Histogram& seconds;
};

// Where a URL stands in a request: a chat part, or raw.images / raw.videos.
struct MediaSite {
  int message = -1;  // chat.messages index, or -1 for raw
  int part = -1;     // content index in that message
  int index = -1;    // raw.images / raw.videos index
  int frame = -1;    // a frame of a VideoFrames list, or -1
  bool video = false;
};

// How an API names a site's field in its errors.
using MediaFieldName = std::function<std::string(const MediaSite&)>;
// "chat.messages[0].content[1].image.url", "raw.videos[0].url".
std::string GrpcMediaField(const MediaSite& site);
// "messages[0].content[1].image_url" (chat parts only).
std::string OpenAiMediaField(const MediaSite& site);

// Whether any image or video of the request is a URL.
bool HasRemoteMedia(const mmserve::v1::GenerateRequest& request);

// Replaces every URL with the fetched bytes (and the Content-Type as the
// mime_type). The fetch threads hold `fetcher` and `cancel` until they
// end, also past a timeout. Refusals are INVALID_ARGUMENT "<field>: <reason>": every URL
// when `fetcher` is null or remote media is off, a URL inside a VideoFrames
// list, any refusal of MediaFetcher::Fetch, and a fetch that outlives the
// timeout. CANCELLED once `cancel` is cancelled. Each URL's end is counted
// in `metrics` when given. Images are held to
// options.max_image_bytes, videos to options.max_video_bytes (and to the
// fetcher's max_bytes when lower).
[[nodiscard]] absl::Status FetchRequestMedia(std::shared_ptr<const MediaFetcher> fetcher,
                                             const RouterOptions& options,
                                             mmserve::v1::GenerateRequest* request,
                                             std::shared_ptr<FetchCancel> cancel,
                                             const MediaFieldName& field_name,
                                             const MediaFetchMetrics* metrics = nullptr);

}  // namespace mmserve::router

#endif  // MMSERVE_ROUTER_REQUEST_FETCH_H_
