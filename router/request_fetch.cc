#include "router/request_fetch.h"

#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"

namespace mmserve::router {
namespace {

using mmserve::v1::GenerateRequest;
using mmserve::v1::Image;
using mmserve::v1::Video;

// One URL to fetch and where its bytes go.
struct Site {
  MediaSite where;
  Image* image = nullptr;
  Video* video = nullptr;
  const std::string& url() const { return image != nullptr ? image->url() : video->url(); }
};

void AddVideo(Video* v, MediaSite where, std::vector<Site>* out) {
  where.video = true;
  if (v->source_case() == Video::kUrl) out->push_back({where, nullptr, v});
  if (!v->has_frames()) return;
  for (int f = 0; f < v->frames().frames_size(); ++f) {
    Image* frame = v->mutable_frames()->mutable_frames(f);
    if (frame->source_case() != Image::kUrl) continue;
    MediaSite w = where;
    w.frame = f;
    out->push_back({w, frame, nullptr});
  }
}

std::vector<Site> Sites(GenerateRequest* r) {
  std::vector<Site> out;
  if (r->has_chat()) {
    for (int i = 0; i < r->chat().messages_size(); ++i) {
      auto* m = r->mutable_chat()->mutable_messages(i);
      for (int j = 0; j < m->content_size(); ++j) {
        auto* p = m->mutable_content(j);
        MediaSite where{.message = i, .part = j};
        if (p->has_image() && p->image().source_case() == Image::kUrl) {
          out.push_back({where, p->mutable_image(), nullptr});
        }
        if (p->has_video()) AddVideo(p->mutable_video(), where, &out);
      }
    }
  } else if (r->has_raw()) {
    for (int k = 0; k < r->raw().images_size(); ++k) {
      if (r->raw().images(k).source_case() == Image::kUrl) {
        out.push_back({MediaSite{.index = k}, r->mutable_raw()->mutable_images(k), nullptr});
      }
    }
    for (int k = 0; k < r->raw().videos_size(); ++k) {
      AddVideo(r->mutable_raw()->mutable_videos(k), MediaSite{.index = k}, &out);
    }
  }
  return out;
}

// The fetches of one request; shared with their threads, which may outlive
// the caller after a timeout (a host name still resolving).
struct Fetches {
  absl::Mutex mu;
  int pending ABSL_GUARDED_BY(mu) = 0;
  std::vector<absl::StatusOr<FetchedMedia>> results ABSL_GUARDED_BY(mu);
};

// Waits for every fetch, the deadline or a cancel (checked as the fetches
// end, and every 50 ms); false when the deadline passed first.
bool WaitForFetches(Fetches& fetches, const FetchCancel& cancel, absl::Time deadline) {
  absl::MutexLock lock(&fetches.mu);
  auto done = [&fetches]()
                  ABSL_EXCLUSIVE_LOCKS_REQUIRED(fetches.mu) { return fetches.pending == 0; };
  while (!done()) {
    if (cancel.cancelled()) return true;
    const absl::Time now = absl::Now();
    if (now >= deadline) return false;
    fetches.mu.AwaitWithDeadline(absl::Condition(&done),
                                 std::min(deadline, now + absl::Milliseconds(50)));
  }
  return true;
}

absl::Status AtField(const std::string& field, const absl::Status& s) {
  if (absl::IsCancelled(s)) return s;
  return absl::Status(s.code(), absl::StrCat(field, ": ", s.message()));
}

}  // namespace

std::string GrpcMediaField(const MediaSite& s) {
  std::string field = s.message >= 0
                          ? absl::StrCat("chat.messages[", s.message, "].content[", s.part, "].",
                                         s.video ? "video" : "image")
                          : absl::StrCat("raw.", s.video ? "videos[" : "images[", s.index, "]");
  if (s.frame >= 0) absl::StrAppend(&field, ".frames.frames[", s.frame, "]");
  return absl::StrCat(field, ".url");
}

std::string OpenAiMediaField(const MediaSite& s) {
  return absl::StrCat("messages[", s.message, "].content[", s.part, "].",
                      s.video ? "video_url" : "image_url");
}

bool HasRemoteMedia(const GenerateRequest& request) {
  auto video_has_url = [](const Video& v) {
    if (v.source_case() == Video::kUrl) return true;
    for (const Image& f : v.frames().frames()) {
      if (f.source_case() == Image::kUrl) return true;
    }
    return false;
  };
  for (const auto& m : request.chat().messages()) {
    for (const auto& p : m.content()) {
      if (p.has_image() && p.image().source_case() == Image::kUrl) return true;
      if (p.has_video() && video_has_url(p.video())) return true;
    }
  }
  for (const Image& i : request.raw().images()) {
    if (i.source_case() == Image::kUrl) return true;
  }
  for (const Video& v : request.raw().videos()) {
    if (video_has_url(v)) return true;
  }
  return false;
}

namespace {

// How a request's fetch ended (MediaFetchMetrics).
enum class FetchEnd { kFetched, kRefused, kTimedOut, kCancelled, kDisabled };

// The refusals before any fetch: too many URLs, remote media off, a URL
// inside a frame list.
absl::Status CheckSites(const MediaFetcher* fetcher, const RouterOptions& options,
                        const std::vector<Site>& sites, const MediaFieldName& field_name,
                        FetchEnd* end) {
  if (static_cast<int>(sites.size()) > options.max_images) {
    return absl::InvalidArgumentError(
        absl::StrCat(sites.size(), " media URLs; at most ", options.max_images, " per request"));
  }
  for (const Site& s : sites) {
    if (fetcher == nullptr || !fetcher->options().enabled) {
      *end = FetchEnd::kDisabled;
      return absl::InvalidArgumentError(absl::StrCat(
          field_name(s.where), ": remote media is disabled on this server; send a data: URL"));
    }
    if (s.where.frame >= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(field_name(s.where), ": video frames must carry their bytes, not a URL"));
    }
  }
  return absl::OkStatus();
}

// Fetches every site at once and puts the bytes in place.
absl::Status FetchSites(std::shared_ptr<const MediaFetcher> fetcher, const RouterOptions& options,
                        const std::vector<Site>& sites, std::shared_ptr<FetchCancel> cancel,
                        const MediaFieldName& field_name, FetchEnd* end) {
  const MediaFetchOptions& o = fetcher->options();
  const absl::Time deadline = absl::Now() + o.timeout;
  auto fetches = std::make_shared<Fetches>();
  {
    absl::MutexLock lock(&fetches->mu);
    fetches->pending = static_cast<int>(sites.size());
    fetches->results.resize(sites.size(), absl::UnknownError("not fetched"));
  }
  for (size_t k = 0; k < sites.size(); ++k) {
    const bool video = sites[k].video != nullptr;
    size_t max_bytes = video ? options.max_video_bytes : options.max_image_bytes;
    if (o.max_bytes > 0) max_bytes = std::min(max_bytes, o.max_bytes);
    std::thread([fetcher, fetches, cancel, k, url = sites[k].url(), video, max_bytes, deadline] {
      absl::StatusOr<FetchedMedia> got = fetcher->Fetch(
          url, video ? MediaKind::kVideo : MediaKind::kImage, max_bytes, deadline, *cancel);
      absl::MutexLock lock(&fetches->mu);
      fetches->results[k] = std::move(got);
      --fetches->pending;
    }).detach();
  }
  const bool timed_out = !WaitForFetches(*fetches, *cancel, deadline);
  if (!timed_out && cancel->cancelled()) {
    *end = FetchEnd::kCancelled;
    return absl::CancelledError("the client went away");
  }
  if (timed_out) cancel->Cancel();  // frees the sockets of the late fetches
  absl::MutexLock lock(&fetches->mu);
  for (size_t k = 0; k < sites.size(); ++k) {
    const absl::StatusOr<FetchedMedia>& got = fetches->results[k];
    if (got.ok()) continue;
    absl::Status why = got.status();
    // Still running at the deadline, or stopped by the cancel that ended it.
    if (timed_out && (absl::IsUnknown(why) || absl::IsCancelled(why))) {
      why = FetchTimedOut(sites[k].url(), o.timeout);
    }
    if (absl::IsDeadlineExceeded(why)) {
      // The client's URL was too slow: its error, not the server's.
      *end = FetchEnd::kTimedOut;
      why = absl::InvalidArgumentError(why.message());
    }
    return AtField(field_name(sites[k].where), why);
  }
  for (size_t k = 0; k < sites.size(); ++k) {
    FetchedMedia& m = *fetches->results[k];
    if (sites[k].image != nullptr) {
      sites[k].image->set_data(std::move(m.data));
      sites[k].image->set_mime_type(std::move(m.mime_type));
    } else {
      sites[k].video->set_data(std::move(m.data));
      sites[k].video->set_mime_type(std::move(m.mime_type));
    }
  }
  *end = FetchEnd::kFetched;
  return absl::OkStatus();
}

}  // namespace

MediaFetchMetrics::MediaFetchMetrics(metrics::Registry& registry)
    : fetched(registry.GetCounter("mmserve_router_media_fetches_total",
                                  "Requests with remote media URLs, by how their fetch ended.",
                                  {{"result", "fetched"}})),
      refused(registry.GetCounter("mmserve_router_media_fetches_total",
                                  "Requests with remote media URLs, by how their fetch ended.",
                                  {{"result", "refused"}})),
      timed_out(registry.GetCounter("mmserve_router_media_fetches_total",
                                    "Requests with remote media URLs, by how their fetch ended.",
                                    {{"result", "timed_out"}})),
      cancelled(registry.GetCounter("mmserve_router_media_fetches_total",
                                    "Requests with remote media URLs, by how their fetch ended.",
                                    {{"result", "cancelled"}})),
      disabled(registry.GetCounter("mmserve_router_media_fetches_total",
                                   "Requests with remote media URLs, by how their fetch ended.",
                                   {{"result", "disabled"}})),
      seconds(registry.GetHistogram("mmserve_router_media_fetch_seconds",
                                    "The whole fetch of a request's remote media URLs.",
                                    metrics::LatencyBuckets())) {}

absl::Status FetchRequestMedia(std::shared_ptr<const MediaFetcher> fetcher,
                               const RouterOptions& options, GenerateRequest* request,
                               std::shared_ptr<FetchCancel> cancel,
                               const MediaFieldName& field_name, const MediaFetchMetrics* metrics) {
  const std::vector<Site> sites = Sites(request);
  if (sites.empty()) return absl::OkStatus();
  const absl::Time start = absl::Now();
  FetchEnd end = FetchEnd::kRefused;
  absl::Status s = CheckSites(fetcher.get(), options, sites, field_name, &end);
  if (s.ok())
    s = FetchSites(std::move(fetcher), options, sites, std::move(cancel), field_name, &end);
  if (metrics == nullptr) return s;
  switch (end) {
    case FetchEnd::kFetched:
      metrics->fetched.Increment();
      break;
    case FetchEnd::kRefused:
      metrics->refused.Increment();
      break;
    case FetchEnd::kTimedOut:
      metrics->timed_out.Increment();
      break;
    case FetchEnd::kCancelled:
      metrics->cancelled.Increment();
      break;
    case FetchEnd::kDisabled:
      metrics->disabled.Increment();
      return s;
  }
  metrics->seconds.Observe(absl::ToDoubleSeconds(absl::Now() - start));
  return s;
}

}  // namespace mmserve::router
