// Remote media URLs: the http(s) URL of an image or video, the router's
// allow-list of media hosts, and where a redirect leads. Only the parts a
// fetch needs are kept; anything unusual (credentials in the URL, spaces,
// control or non-ASCII bytes, percent-encoded host names, a port outside
// 1..65535) is refused rather than guessed at.
//
//   ASSIGN_OR_RETURN(MediaUrl url, ParseMediaUrl("https://img.example.com/cat.png"));
//   url.host;    // "img.example.com"
//   url.target;  // "/cat.png"
//   ASSIGN_OR_RETURN(MediaHostList hosts, MediaHostList::Parse("img.example.com,*.cdn.net"));
//   hosts.Allows("a.cdn.net");  // true
//
// Pure functions and values, thread-safe.
#ifndef MMSERVE_ROUTER_MEDIA_URL_H_
#define MMSERVE_ROUTER_MEDIA_URL_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace mmserve::router {

// The longest URL accepted.
inline constexpr size_t kMaxMediaUrlBytes = 8192;

struct MediaUrl {
  bool https = false;
  // Lowercase, without a trailing dot; an IPv6 literal without brackets.
  std::string host;
  bool host_is_ip = false;  // a numeric IPv4 or IPv6 address
  int port = 0;             // 443 or 80 when the URL names none
  // Path and query, starting with '/'; the fragment is dropped.
  std::string target;

  // "https://host[:port]/target": how errors name the URL.
  std::string Text() const;
  // The Host header's value.
  std::string HostHeader() const;
};

// Whether `text` starts with http:// or https:// (any case).
bool IsRemoteMediaUrl(absl::string_view text);

// Parses an absolute http:// or https:// URL; INVALID_ARGUMENT with the
// reason otherwise.
[[nodiscard]] absl::StatusOr<MediaUrl> ParseMediaUrl(absl::string_view text);

// Where a redirect from `from` with this Location header leads: an absolute
// URL, a scheme-relative "//host/path", an absolute path or a relative path.
[[nodiscard]] absl::StatusOr<MediaUrl> ResolveRedirect(const MediaUrl& from,
                                                       absl::string_view location);

// Host names no public fetch should reach whatever they resolve to:
// "localhost" and *.localhost, names without a dot (resolved through the
// search domains), and *.internal, *.local, *.localdomain, *.home.arpa
// (metadata.google.internal and the like). Returns why, or nullopt.
std::optional<std::string> InternalHostReason(absl::string_view host);

// The router's --allowed_media_domains: exact host names (or IP literals)
// and "*.suffix" patterns, which match any name ending in ".suffix" (not the
// suffix itself). An empty list allows every host.
class MediaHostList {
 public:
  [[nodiscard]] static absl::StatusOr<MediaHostList> Parse(absl::string_view comma_list);
  bool Allows(absl::string_view host) const;
  bool empty() const { return exact_.empty() && suffixes_.empty(); }

 private:
  std::vector<std::string> exact_;
  std::vector<std::string> suffixes_;  // ".suffix"
};

}  // namespace mmserve::router

#endif  // MMSERVE_ROUTER_MEDIA_URL_H_
