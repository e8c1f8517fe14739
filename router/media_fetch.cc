#include "router/media_fetch.h"

#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>
#include <memory>
#include <optional>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "model/image_decode.h"
#include "router/media_http.h"

namespace mmserve::router {
namespace {

absl::Status Refused(const MediaUrl& url, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(url.Text(), " ", why));
}

absl::string_view KindName(MediaKind kind) { return kind == MediaKind::kImage ? "image" : "video"; }

// "text/html; charset=utf-8" -> "text/html".
std::string MediaType(absl::string_view content_type) {
  return absl::AsciiStrToLower(
      absl::StripAsciiWhitespace(content_type.substr(0, content_type.find(';'))));
}

// Whether a Content-Type may carry media of `kind`: kind/*, or a generic
// binary type (the bytes' own format decides then).
bool TypeFits(const std::string& type, MediaKind kind) {
  return type.empty() || absl::StartsWith(type, absl::StrCat(KindName(kind), "/")) ||
         type == "application/octet-stream" || type == "binary/octet-stream";
}

// A refusal's reason, to follow the URL.
absl::Status Reason(absl::string_view why) { return absl::InvalidArgumentError(why); }

}  // namespace

void FetchCancel::Cancel() {
  absl::MutexLock lock(&mu_);
  cancelled_ = true;
  for (int fd : fds_) ::shutdown(fd, SHUT_RDWR);
}

bool FetchCancel::cancelled() const {
  absl::MutexLock lock(&mu_);
  return cancelled_;
}

bool FetchCancel::Attach(int fd) {
  absl::MutexLock lock(&mu_);
  fds_.insert(fd);
  if (cancelled_) ::shutdown(fd, SHUT_RDWR);
  return !cancelled_;
}

void FetchCancel::Detach(int fd) {
  absl::MutexLock lock(&mu_);
  fds_.erase(fd);
}

MediaFetcher::MediaFetcher(MediaFetchOptions options)
    : options_(std::move(options)), tls_(std::make_unique<MediaTls>(options_.ca_file)) {}

MediaFetcher::~MediaFetcher() = default;

bool MediaFetcher::tls_ready() const { return tls_->context() != nullptr; }

absl::Status FetchTimedOut(absl::string_view url, absl::Duration timeout) {
  return absl::DeadlineExceededError(
      absl::StrCat(url, " took longer than ", absl::ToInt64Milliseconds(timeout), " ms to fetch"));
}

absl::StatusOr<IpAddress> MediaFetcher::CheckedAddress(const MediaUrl& url) const {
  if (!url.https && !options_.allow_http) {
    return Refused(url, "is plain http://, which this server does not fetch; use https://");
  }
  if (!options_.hosts.Allows(url.host)) {
    return Refused(url, "is not on a host this server fetches media from");
  }
  if (!url.host_is_ip) {
    if (std::optional<std::string> why = InternalHostReason(url.host)) {
      return Refused(url, absl::StrCat("names ", *why));
    }
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = url.host_is_ip ? AI_NUMERICHOST : 0;
  addrinfo* found = nullptr;
  if (getaddrinfo(url.host.c_str(), nullptr, &hints, &found) != 0 || found == nullptr) {
    return Refused(url, "names a host that does not resolve");
  }
  std::unique_ptr<addrinfo, decltype(&freeaddrinfo)> owner(found, &freeaddrinfo);
  std::optional<IpAddress> first;
  for (const addrinfo* a = found; a != nullptr; a = a->ai_next) {
    std::optional<IpAddress> ip = FromSockaddr(a->ai_addr);
    if (!ip) continue;
    if (std::optional<std::string> why = NonPublicReason(*ip)) {
      if (!InAny(options_.trusted_ranges, *ip)) {
        return Refused(url, absl::StrCat("resolves to ", *why));
      }
    }
    if (!first) first = *ip;
  }
  if (!first) return Refused(url, "names a host that does not resolve");
  return *first;
}

absl::StatusOr<FetchedMedia> MediaFetcher::FetchOnce(const MediaUrl& url, const IpAddress& address,
                                                     MediaKind kind, size_t max_bytes,
                                                     absl::Time deadline, FetchCancel& cancel,
                                                     std::string* location) const {
  const HttpGetRequest request{.url = &url,
                               .address = address,
                               .tls = tls_.get(),
                               .accept = absl::StrCat(KindName(kind), "/*"),
                               .max_body = max_bytes,
                               .deadline = deadline,
                               .cancel = &cancel};
  FetchedMedia media;
  auto check_head = [&](const HttpHead& head) -> absl::Status {
    if (head.status >= 300 && head.status < 400 && !head.location.empty()) {
      *location = head.location;
      return absl::OkStatus();
    }
    if (head.status != 200) return Reason(absl::StrCat("answered HTTP ", head.status));
    media.mime_type = MediaType(head.content_type);
    if (!TypeFits(media.mime_type, kind)) {
      return Reason(absl::StrCat("has content type \"", media.mime_type, "\", not ",
                                 kind == MediaKind::kImage ? "an image" : "a video"));
    }
    if (head.content_length > static_cast<int64_t>(max_bytes)) {
      return Reason(absl::StrCat("is ", head.content_length, " bytes; at most ", max_bytes));
    }
    return absl::OkStatus();
  };
  absl::StatusOr<HttpResult> got = HttpGet(request, check_head);
  if (!got.ok()) {
    if (absl::IsDeadlineExceeded(got.status())) return FetchTimedOut(url.Text(), options_.timeout);
    if (absl::IsInvalidArgument(got.status())) return Refused(url, got.status().message());
    return got.status();
  }
  if (!location->empty()) return media;
  if (got->head.status != 200)
    return Refused(url, absl::StrCat("answered HTTP ", got->head.status));
  media.data = std::move(got->body);
  return media;
}

absl::StatusOr<FetchedMedia> MediaFetcher::Fetch(absl::string_view text, MediaKind kind,
                                                 size_t max_bytes, absl::Time deadline,
                                                 FetchCancel& cancel) const {
  absl::StatusOr<MediaUrl> url = ParseMediaUrl(text);
  if (!url.ok()) return url.status();
  for (int hop = 0;; ++hop) {
    ASSIGN_OR_RETURN(IpAddress address, CheckedAddress(*url));
    std::string location;
    ASSIGN_OR_RETURN(FetchedMedia media,
                     FetchOnce(*url, address, kind, max_bytes, deadline, cancel, &location));
    if (location.empty()) {
      if (media.data.empty()) return Refused(*url, absl::StrCat("is an empty ", KindName(kind)));
      absl::Status format = kind == MediaKind::kImage
                                ? model::ReadImageHeader(media.data).status()
                                : model::ProbeVideo(media.data, options_.video_limits).status();
      if (!format.ok()) {
        return Refused(*url, absl::StrCat("is not ", kind == MediaKind::kImage ? "an " : "a ",
                                          KindName(kind), " (", format.message(), ")"));
      }
      return media;
    }
    if (hop >= options_.max_redirects) {
      return Refused(*url, absl::StrCat("redirects more than ", options_.max_redirects, " times"));
    }
    absl::StatusOr<MediaUrl> next = ResolveRedirect(*url, location);
    if (!next.ok())
      return Refused(*url, absl::StrCat("redirects badly: ", next.status().message()));
    url = *std::move(next);
  }
}

}  // namespace mmserve::router
