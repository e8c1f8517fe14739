#include "router/media_address.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace mmserve::router {
namespace {

// A range and why an address inside it is not public.
struct Range {
  std::array<uint8_t, 16> base;
  int prefix;
  const char* reason;
};

bool PrefixMatches(const std::array<uint8_t, 16>& a, const std::array<uint8_t, 16>& base,
                   int prefix) {
  for (int bit = 0; bit < prefix; ++bit) {
    const uint8_t mask = static_cast<uint8_t>(0x80 >> (bit % 8));
    if ((a[bit / 8] & mask) != (base[bit / 8] & mask)) return false;
  }
  return true;
}

constexpr Range kV4[] = {
    {{0, 0, 0, 0}, 8, "an unspecified address"},
    {{10, 0, 0, 0}, 8, "a private address"},
    {{100, 64, 0, 0}, 10, "a shared (CGNAT) address"},
    {{127, 0, 0, 0}, 8, "a loopback address"},
    {{169, 254, 0, 0}, 16, "a link-local address"},
    {{172, 16, 0, 0}, 12, "a private address"},
    {{192, 0, 0, 0}, 24, "a reserved address"},
    {{192, 0, 2, 0}, 24, "a documentation address"},
    {{192, 88, 99, 0}, 24, "a reserved address"},
    {{192, 168, 0, 0}, 16, "a private address"},
    {{198, 18, 0, 0}, 15, "a reserved address"},
    {{198, 51, 100, 0}, 24, "a documentation address"},
    {{203, 0, 113, 0}, 24, "a documentation address"},
    {{224, 0, 0, 0}, 4, "a multicast address"},
    {{255, 255, 255, 255}, 32, "a broadcast address"},
    {{240, 0, 0, 0}, 4, "a reserved address"},
};

constexpr Range kV6[] = {
    {{}, 128, "an unspecified address"},
    {{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1}, 128, "a loopback address"},
    {{0x01, 0x00}, 64, "a reserved address"},  // discard-only 100::/64
    {{0x20, 0x01, 0x0d, 0xb8}, 32, "a documentation address"},
    {{0x20, 0x01, 0x00, 0x00}, 32, "a reserved address"},  // Teredo
    {{0x20, 0x01, 0x00, 0x10}, 28, "a reserved address"},  // ORCHID
    {{0xfc, 0x00}, 7, "a private address"},
    {{0xfe, 0x80}, 10, "a link-local address"},
    {{0xfe, 0xc0}, 10, "a private address"},  // deprecated site-local
    {{0xff, 0x00}, 8, "a multicast address"},
};

// The IPv4 address an IPv6 address carries, where it is one of the
// translation forms.
std::optional<IpAddress> EmbeddedV4(const IpAddress& a) {
  const auto& b = a.bytes;
  IpAddress v4;
  auto take = [&](int at) {
    std::memcpy(v4.bytes.data(), b.data() + at, 4);
    return v4;
  };
  static constexpr std::array<uint8_t, 16> kMapped = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  static constexpr std::array<uint8_t, 16> kNat64 = {0, 0x64, 0xff, 0x9b};
  static constexpr std::array<uint8_t, 16> kCompatible = {};
  static constexpr std::array<uint8_t, 16> k6to4 = {0x20, 0x02};
  if (PrefixMatches(b, kMapped, 96)) return take(12);
  if (PrefixMatches(b, kNat64, 96)) return take(12);
  if (PrefixMatches(b, kCompatible, 96) && !PrefixMatches(b, kCompatible, 120)) return take(12);
  if (PrefixMatches(b, k6to4, 16)) return take(2);
  return std::nullopt;
}

}  // namespace

absl::StatusOr<IpAddress> ParseIpAddress(absl::string_view text) {
  const std::string s(text);
  IpAddress a;
  if (inet_pton(AF_INET, s.c_str(), a.bytes.data()) == 1) return a;
  a.v6 = true;
  if (inet_pton(AF_INET6, s.c_str(), a.bytes.data()) == 1) return a;
  return absl::InvalidArgumentError(absl::StrCat("\"", text, "\" is not an IP address"));
}

std::optional<IpAddress> FromSockaddr(const sockaddr* address) {
  IpAddress a;
  if (address->sa_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(address);
    std::memcpy(a.bytes.data(), &in->sin_addr, 4);
    return a;
  }
  if (address->sa_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(address);
    a.v6 = true;
    std::memcpy(a.bytes.data(), &in6->sin6_addr, 16);
    return a;
  }
  return std::nullopt;
}

std::string AddressText(const IpAddress& address) {
  char text[INET6_ADDRSTRLEN] = {};
  inet_ntop(address.v6 ? AF_INET6 : AF_INET, address.bytes.data(), text, sizeof(text));
  return text;
}

std::optional<std::string> NonPublicReason(const IpAddress& address) {
  if (address.v6) {
    if (std::optional<IpAddress> v4 = EmbeddedV4(address)) return NonPublicReason(*v4);
    // ::/96 with a zero or tiny tail is :: or ::1, below; other ::/8 is reserved.
    for (const Range& r : kV6) {
      if (PrefixMatches(address.bytes, r.base, r.prefix)) return r.reason;
    }
    static constexpr std::array<uint8_t, 16> kZero = {};
    if (PrefixMatches(address.bytes, kZero, 8)) return "a reserved address";
    return std::nullopt;
  }
  for (const Range& r : kV4) {
    if (PrefixMatches(address.bytes, r.base, r.prefix)) return r.reason;
  }
  return std::nullopt;
}

bool Cidr::Contains(const IpAddress& address) const {
  if (address.v6 != base.v6) {
    // An IPv4-mapped address against an IPv4 range.
    if (!address.v6) return false;
    static constexpr std::array<uint8_t, 16> kMapped = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    if (!PrefixMatches(address.bytes, kMapped, 96)) return false;
    IpAddress v4;
    std::memcpy(v4.bytes.data(), address.bytes.data() + 12, 4);
    return Contains(v4);
  }
  return PrefixMatches(address.bytes, base.bytes, prefix);
}

absl::StatusOr<Cidr> ParseCidr(absl::string_view text) {
  text = absl::StripAsciiWhitespace(text);
  const size_t slash = text.find('/');
  Cidr c;
  absl::StatusOr<IpAddress> base = ParseIpAddress(text.substr(0, slash));
  if (!base.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("\"", text, "\": not an address range"));
  }
  c.base = *base;
  const int bits = c.base.v6 ? 128 : 32;
  c.prefix = bits;
  if (slash != absl::string_view::npos) {
    if (!absl::SimpleAtoi(text.substr(slash + 1), &c.prefix) || c.prefix < 0 || c.prefix > bits) {
      return absl::InvalidArgumentError(
          absl::StrCat("\"", text, "\": the prefix length must be 0..", bits));
    }
  }
  for (int bit = c.prefix; bit < bits; ++bit) {
    if (c.base.bytes[bit / 8] & (0x80 >> (bit % 8))) {
      return absl::InvalidArgumentError(
          absl::StrCat("\"", text, "\": bits past the prefix length must be zero"));
    }
  }
  return c;
}

absl::StatusOr<std::vector<Cidr>> ParseCidrList(absl::string_view text) {
  std::vector<Cidr> out;
  for (absl::string_view item : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    absl::StatusOr<Cidr> c = ParseCidr(item);
    if (!c.ok()) return c.status();
    out.push_back(*c);
  }
  return out;
}

bool InAny(const std::vector<Cidr>& ranges, const IpAddress& address) {
  for (const Cidr& r : ranges) {
    if (r.Contains(address)) return true;
  }
  return false;
}

}  // namespace mmserve::router
