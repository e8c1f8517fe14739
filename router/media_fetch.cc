#include "router/media_fetch.h"

#include <httplib.h>
#include <netdb.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <memory>
#include <optional>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "model/image_decode.h"

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

// Microseconds left until `deadline`, at least 1.
int64_t MicrosLeft(absl::Time deadline) {
  return std::max<int64_t>(1, absl::ToInt64Microseconds(deadline - absl::Now()));
}

// A descriptor owned here, registered with a FetchCancel while it lives.
class AttachedSocket {
 public:
  explicit AttachedSocket(FetchCancel& cancel) : cancel_(cancel) {}
  ~AttachedSocket() {
    if (fd_ < 0) return;
    cancel_.Detach(fd_);
    ::close(fd_);
  }
  // httplib's socket (before it connects): a duplicate is kept, so that a
  // cancel can shut the connection down without racing httplib's close.
  void Take(int sock) {
    if (fd_ >= 0) return;
    fd_ = ::dup(sock);
    if (fd_ >= 0) cancel_.Attach(fd_);
  }

 private:
  FetchCancel& cancel_;
  int fd_ = -1;
};

// What went wrong in one request, as the client may hear it.
absl::Status HttplibError(const MediaUrl& url, httplib::Error error) {
  switch (error) {
    case httplib::Error::Connection:
      return Refused(url, "could not be reached");
    case httplib::Error::SSLConnection:
      return Refused(url, "failed the TLS handshake");
    case httplib::Error::SSLServerVerification:
      return Refused(url, "presented a TLS certificate that does not verify for its host");
    case httplib::Error::SSLLoadingCerts:
      return absl::InternalError("media fetch: cannot load the CA certificates");
    default:
      return Refused(url, "could not be fetched (the connection failed or broke)");
  }
}

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

absl::Status FetchTimedOut(absl::string_view url, absl::Duration timeout) {
  return absl::InvalidArgumentError(
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
  std::unique_ptr<httplib::ClientImpl> client;
  if (url.https) {
    auto tls = std::make_unique<httplib::SSLClient>(url.host, url.port);
    if (!options_.ca_file.empty()) tls->set_ca_cert_path(options_.ca_file);
    tls->enable_server_certificate_verification(true);
    client = std::move(tls);
  } else {
    client = std::make_unique<httplib::ClientImpl>(url.host, url.port);
  }
  client->set_hostname_addr_map({{url.host, AddressText(address)}});
  const int64_t left = MicrosLeft(deadline);
  client->set_connection_timeout(left / 1000000, left % 1000000);
  client->set_read_timeout(left / 1000000, left % 1000000);
  client->set_write_timeout(left / 1000000, left % 1000000);
  client->set_keep_alive(false);
  client->set_follow_location(false);
  client->set_decompress(false);
  AttachedSocket socket(cancel);
  client->set_socket_options([&socket](int sock) {
    int one = 1;
    ::setsockopt(sock, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    socket.Take(sock);
  });

  const httplib::Headers headers = {{"Host", url.HostHeader()},
                                    {"Accept", absl::StrCat(KindName(kind), "/*")},
                                    {"Accept-Encoding", "identity"},
                                    {"User-Agent", "mmserve-media-fetch"}};
  absl::Status refusal;  // set by the handlers when they stop the transfer
  FetchedMedia media;
  auto on_response = [&](const httplib::Response& r) {
    if (r.status >= 300 && r.status < 400 && r.has_header("Location")) {
      *location = r.get_header_value("Location");
      return false;
    }
    if (r.status != 200) {
      refusal = Refused(url, absl::StrCat("answered HTTP ", r.status));
      return false;
    }
    media.mime_type = MediaType(r.get_header_value("Content-Type"));
    if (!TypeFits(media.mime_type, kind)) {
      refusal = Refused(url, absl::StrCat("has content type \"", media.mime_type, "\", not ",
                                          kind == MediaKind::kImage ? "an image" : "a video"));
      return false;
    }
    uint64_t length = 0;
    if (absl::SimpleAtoi(r.get_header_value("Content-Length"), &length) && length > max_bytes) {
      refusal = Refused(url, absl::StrCat("is ", length, " bytes; at most ", max_bytes));
      return false;
    }
    return true;
  };
  auto on_body = [&](const char* data, size_t n) {
    if (media.data.size() + n > max_bytes) {
      refusal = Refused(url, absl::StrCat("is larger than ", max_bytes, " bytes"));
      return false;
    }
    if (absl::Now() > deadline) {
      refusal = FetchTimedOut(url.Text(), options_.timeout);
      return false;
    }
    media.data.append(data, n);
    return true;
  };
  httplib::Result result = client->Get(url.target, headers, on_response, on_body);
  if (!refusal.ok()) return refusal;
  if (!location->empty()) return media;
  if (cancel.cancelled()) return absl::CancelledError("the media fetch was cancelled");
  if (absl::Now() >= deadline) return FetchTimedOut(url.Text(), options_.timeout);
  if (!result) return HttplibError(url, result.error());
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
