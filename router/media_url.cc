#include "router/media_url.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"
#include "router/media_address.h"

namespace mmserve::router {
namespace {

absl::Status Invalid(absl::string_view why) { return absl::InvalidArgumentError(why); }

// Printable ASCII without space: what a URL may hold here.
bool PlainUrlBytes(absl::string_view text) {
  for (char c : text) {
    if (c <= 0x20 || c >= 0x7f) return false;
  }
  return true;
}

bool HostNameChar(char c) { return absl::ascii_isalnum(c) || c == '-' || c == '.' || c == '_'; }

// The authority "host[:port]" of `url` into url->host, host_is_ip, port.
absl::Status ParseAuthority(absl::string_view authority, MediaUrl* url) {
  if (absl::StrContains(authority, '@')) return Invalid("credentials in the URL are not allowed");
  absl::string_view host = authority;
  absl::string_view port;
  if (absl::ConsumePrefix(&host, "[")) {
    const size_t close = host.find(']');
    if (close == absl::string_view::npos) return Invalid("unclosed '[' in the URL's host");
    absl::string_view rest = host.substr(close + 1);
    host = host.substr(0, close);
    if (!rest.empty()) {
      if (!absl::ConsumePrefix(&rest, ":")) return Invalid("unexpected text after the host");
      port = rest;
      if (port.empty()) return Invalid("empty port");
    }
    absl::StatusOr<IpAddress> ip = ParseIpAddress(host);
    if (!ip.ok() || !ip->v6) return Invalid("the bracketed host is not an IPv6 address");
    url->host = AddressText(*ip);
    url->host_is_ip = true;
  } else {
    const size_t colon = host.rfind(':');
    if (colon != absl::string_view::npos) {
      port = host.substr(colon + 1);
      host = host.substr(0, colon);
      if (port.empty()) return Invalid("empty port");
    }
    absl::ConsumeSuffix(&host, ".");
    if (host.empty()) return Invalid("the URL has no host");
    if (absl::StartsWith(host, ".") || absl::EndsWith(host, ".") || absl::StrContains(host, "..")) {
      return Invalid("the host name has an empty label");
    }
    for (char c : host) {
      if (!HostNameChar(c)) {
        return Invalid(absl::StrCat("the host name has a character '", std::string(1, c),
                                    "' that is not allowed"));
      }
    }
    url->host = absl::AsciiStrToLower(host);
    absl::StatusOr<IpAddress> ip = ParseIpAddress(url->host);
    url->host_is_ip = ip.ok();
  }
  url->port = url->https ? 443 : 80;
  if (!port.empty()) {
    for (char c : port) {
      if (!absl::ascii_isdigit(c)) return Invalid("the port is not a number");
    }
    if (!absl::SimpleAtoi(port, &url->port) || url->port < 1 || url->port > 65535) {
      return Invalid("the port must be 1..65535");
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::string MediaUrl::HostHeader() const {
  std::string host =
      absl::StrContains(this->host, ':') ? absl::StrCat("[", this->host, "]") : this->host;
  if (port != (https ? 443 : 80)) absl::StrAppend(&host, ":", port);
  return host;
}

std::string MediaUrl::Text() const {
  return absl::StrCat(https ? "https://" : "http://", HostHeader(), target);
}

bool IsRemoteMediaUrl(absl::string_view text) {
  return absl::StartsWithIgnoreCase(text, "http://") ||
         absl::StartsWithIgnoreCase(text, "https://");
}

absl::StatusOr<MediaUrl> ParseMediaUrl(absl::string_view text) {
  if (text.size() > kMaxMediaUrlBytes) {
    return Invalid(absl::StrCat("the URL is longer than ", kMaxMediaUrlBytes, " bytes"));
  }
  if (!PlainUrlBytes(text)) {
    return Invalid("the URL holds spaces, control or non-ASCII bytes (percent-encode them)");
  }
  MediaUrl url;
  absl::string_view rest = text;
  if (absl::StartsWithIgnoreCase(rest, "https://")) {
    url.https = true;
    rest.remove_prefix(8);
  } else if (absl::StartsWithIgnoreCase(rest, "http://")) {
    rest.remove_prefix(7);
  } else {
    return Invalid("only http:// and https:// URLs are fetched");
  }
  const size_t end = rest.find_first_of("/?#");
  RETURN_IF_ERROR(ParseAuthority(rest.substr(0, end), &url));
  absl::string_view target = end == absl::string_view::npos ? "" : rest.substr(end);
  target = target.substr(0, target.find('#'));
  url.target = absl::StartsWith(target, "/") ? std::string(target) : absl::StrCat("/", target);
  return url;
}

absl::StatusOr<MediaUrl> ResolveRedirect(const MediaUrl& from, absl::string_view location) {
  location = absl::StripAsciiWhitespace(location);
  if (location.empty()) return Invalid("a redirect without a Location");
  if (IsRemoteMediaUrl(location)) return ParseMediaUrl(location);
  if (absl::StartsWith(location, "//")) {
    return ParseMediaUrl(absl::StrCat(from.https ? "https:" : "http:", location));
  }
  const size_t colon = location.find(':');
  if (colon != absl::string_view::npos && colon < location.find_first_of("/?#")) {
    return Invalid("a redirect to a URL that is not http:// or https://");
  }
  std::string path;
  if (absl::StartsWith(location, "/")) {
    path = std::string(location);
  } else {
    // Relative to the directory of the current path.
    const absl::string_view target = from.target;  // substr of a view, not a copy
    absl::string_view dir = target.substr(0, target.find('?'));
    dir = dir.substr(0, dir.rfind('/') + 1);
    path = absl::StrCat(dir, location);
  }
  MediaUrl to = from;
  to.target.clear();
  return ParseMediaUrl(absl::StrCat(to.Text(), path));
}

std::optional<std::string> InternalHostReason(absl::string_view host) {
  if (host == "localhost" || absl::EndsWith(host, ".localhost")) return "a local host name";
  if (!absl::StrContains(host, '.')) return "a host name without a domain";
  for (absl::string_view suffix :
       {".internal", ".local", ".localdomain", ".home.arpa", ".intranet", ".lan", ".corp"}) {
    if (absl::EndsWith(host, suffix)) return "an internal host name";
  }
  return std::nullopt;
}

absl::StatusOr<MediaHostList> MediaHostList::Parse(absl::string_view comma_list) {
  MediaHostList list;
  for (absl::string_view item : absl::StrSplit(comma_list, ',', absl::SkipWhitespace())) {
    item = absl::StripAsciiWhitespace(item);
    absl::string_view name = item;
    const bool wildcard = absl::ConsumePrefix(&name, "*.");
    absl::ConsumeSuffix(&name, ".");
    // An IP literal in its canonical form, as ParseMediaUrl gives hosts.
    if (absl::StatusOr<IpAddress> ip = ParseIpAddress(name); ip.ok() && !wildcard) {
      list.exact_.push_back(AddressText(*ip));
      continue;
    }
    if (name.empty() || !std::all_of(name.begin(), name.end(), HostNameChar) ||
        absl::StartsWith(name, ".") || absl::EndsWith(name, ".") || absl::StrContains(name, "..")) {
      return Invalid(absl::StrCat("\"", item, "\" is not a host name, IP address or *.suffix"));
    }
    std::string lower = absl::AsciiStrToLower(name);
    if (wildcard) {
      list.suffixes_.push_back("." + lower);
    } else {
      list.exact_.push_back(std::move(lower));
    }
  }
  return list;
}

bool MediaHostList::Allows(absl::string_view host) const {
  if (empty()) return true;
  for (const std::string& e : exact_) {
    if (host == e) return true;
  }
  for (const std::string& s : suffixes_) {
    if (host.size() > s.size() && absl::EndsWith(host, s)) return true;
  }
  return false;
}

}  // namespace mmserve::router
