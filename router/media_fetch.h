// Fetches remote media (image_url / video_url, Image.url / Video.url) safely
// against server-side request forgery: the scheme, the host allow-list and
// every address the host resolves to are checked before a connection is
// made, the connection goes to exactly the address that was checked (no
// second DNS lookup), and each redirect (at most max_redirects) is checked
// the same way. The body is capped before (Content-Length) and while it
// arrives, the whole fetch is bounded by a deadline, and the content type
// and the bytes' own format must be those of an image (a video).
//
//   MediaFetcher fetcher(options);
//   FetchCancel cancel;  // cancel.Cancel() from any thread stops the fetch
//   ASSIGN_OR_RETURN(FetchedMedia m,
//                    fetcher.Fetch(url, MediaKind::kImage, 20 << 20, deadline, cancel));
//
// Every refusal is INVALID_ARGUMENT (a fetch past its deadline
// DEADLINE_EXCEEDED) and its message names the URL and the reason, never an
// address or other server detail ("https://x/y resolves to a private
// address"). Thread-safe: Fetch blocks its caller, so callers run
// it off event-loop threads (router/request_fetch.h).
#ifndef MMSERVE_ROUTER_MEDIA_FETCH_H_
#define MMSERVE_ROUTER_MEDIA_FETCH_H_

#include <cstddef>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "model/video_decode.h"
#include "router/media_address.h"
#include "router/media_url.h"

namespace mmserve::router {

class MediaTls;

struct MediaFetchOptions {
  // --allow_remote_media: off, a URL is refused without a fetch.
  bool enabled = false;
  // --allowed_media_domains (empty: any host with public addresses).
  MediaHostList hosts;
  // --allow_http_media: plain http:// too.
  bool allow_http = false;
  // --media_fetch_allow_private_cidrs: non-public ranges that are trusted
  // all the same (tests, intranets).
  std::vector<Cidr> trusted_ranges;
  // --max_media_fetch_bytes: one fetched image or video (0: the router's
  // per-image and per-video byte limits alone).
  size_t max_bytes = 0;
  // --media_fetch_timeout_ms: the whole fetch of a request's media.
  absl::Duration timeout = absl::Seconds(10);
  // --max_media_redirects.
  int max_redirects = 3;
  // --media_ca_file: PEM CA bundle for https (empty: the system's).
  std::string ca_file;
  // Probe limits for fetched videos (the router's --max_video_* flags).
  model::VideoLimits video_limits;
};

enum class MediaKind { kImage, kVideo };

struct FetchedMedia {
  std::string data;
  std::string mime_type;  // the Content-Type without parameters; "" when none
};

// Stops fetches from any thread: every connection they hold is shut down
// and later fetches with it fail at once. Thread-safe.
class FetchCancel {
 public:
  void Cancel() ABSL_LOCKS_EXCLUDED(mu_);
  bool cancelled() const ABSL_LOCKS_EXCLUDED(mu_);
  // A fetch's socket (a descriptor the fetch owns and closes after Detach);
  // false, with the socket shut down, once cancelled.
  bool Attach(int fd) ABSL_LOCKS_EXCLUDED(mu_);
  void Detach(int fd) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  mutable absl::Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  std::set<int> fds_ ABSL_GUARDED_BY(mu_);
};

class MediaFetcher {
 public:
  explicit MediaFetcher(MediaFetchOptions options);
  ~MediaFetcher();
  const MediaFetchOptions& options() const { return options_; }
  // Whether https fetches can verify servers (the CA bundle loaded).
  bool tls_ready() const;

  // Fetches `url` (one of `kind`, at most max_bytes) by `deadline`. Refusals
  // are INVALID_ARGUMENT naming the URL; a fetch stopped by `cancel` is
  // CANCELLED; a deadline passed is DEADLINE_EXCEEDED ("<url> took longer
  // than N ms to fetch", which FetchRequestMedia gives the client as
  // INVALID_ARGUMENT: the URL was the client's). Name resolution (getaddrinfo) cannot be
  // interrupted and may run past the deadline; FetchRequestMedia stops waiting at the deadline
  // regardless.
  [[nodiscard]] absl::StatusOr<FetchedMedia> Fetch(absl::string_view url, MediaKind kind,
                                                   size_t max_bytes, absl::Time deadline,
                                                   FetchCancel& cancel) const;

 private:
  // The one address of `url`'s host to connect to, every address checked.
  [[nodiscard]] absl::StatusOr<IpAddress> CheckedAddress(const MediaUrl& url) const;
  // One request, no redirects followed: the media, or (`location` set) a
  // redirect.
  [[nodiscard]] absl::StatusOr<FetchedMedia> FetchOnce(const MediaUrl& url,
                                                       const IpAddress& address, MediaKind kind,
                                                       size_t max_bytes, absl::Time deadline,
                                                       FetchCancel& cancel,
                                                       std::string* location) const;

  const MediaFetchOptions options_;
  std::unique_ptr<MediaTls> tls_;
};

// The status a fetch of `url` that passed its deadline gets
// (DEADLINE_EXCEEDED).
absl::Status FetchTimedOut(absl::string_view url, absl::Duration timeout);

}  // namespace mmserve::router

#endif  // MMSERVE_ROUTER_MEDIA_FETCH_H_
