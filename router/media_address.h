// Which IP addresses remote media may be fetched from: public unicast only.
// A host name's every address is checked (one non-public address refuses
// the whole name), and the fetch then connects to exactly the address that
// was checked, so a second DNS answer cannot move it inside (rebinding).
//
//   ASSIGN_OR_RETURN(IpAddress a, ParseIpAddress("10.0.0.1"));
//   NonPublicReason(a);  // "a private address"
//   ASSIGN_OR_RETURN(std::vector<Cidr> trusted, ParseCidrList("10.213.0.0/16"));
//   InAny(trusted, a);   // true
//
// Pure functions and values, thread-safe.
#ifndef MMSERVE_ROUTER_MEDIA_ADDRESS_H_
#define MMSERVE_ROUTER_MEDIA_ADDRESS_H_

#include <sys/socket.h>

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace mmserve::router {

// An IPv4 or IPv6 address; an IPv4 address uses the first 4 bytes.
struct IpAddress {
  bool v6 = false;
  std::array<uint8_t, 16> bytes{};

  bool operator==(const IpAddress& o) const { return v6 == o.v6 && bytes == o.bytes; }
};

// A numeric address in its standard text form (inet_pton: dotted quad or
// IPv6, no brackets, no zone); INVALID_ARGUMENT otherwise.
[[nodiscard]] absl::StatusOr<IpAddress> ParseIpAddress(absl::string_view text);
// The address of an AF_INET or AF_INET6 socket address; nullopt otherwise.
std::optional<IpAddress> FromSockaddr(const sockaddr* address);
// inet_ntop's form ("10.0.0.1", "::1").
std::string AddressText(const IpAddress& address);

// Why `address` may not be fetched from ("a loopback address", "a private
// address", "a link-local address", "a shared (CGNAT) address", "an
// unspecified address", "a multicast address", "a broadcast address", "a
// reserved address", "a documentation address"), or nullopt for a public
// unicast address. IPv4-mapped (::ffff:a.b.c.d), IPv4-compatible, NAT64
// (64:ff9b::/96) and 6to4 (2002::/16) addresses are judged by the IPv4
// address they carry.
std::optional<std::string> NonPublicReason(const IpAddress& address);

// An address range, "10.213.0.0/16" or "fd00::/8".
struct Cidr {
  IpAddress base;
  int prefix = 0;
  bool Contains(const IpAddress& address) const;
};

// "a.b.c.d/n" or "ipv6/n"; a bare address is /32 or /128. Bits past the
// prefix must be zero. INVALID_ARGUMENT with the reason otherwise.
[[nodiscard]] absl::StatusOr<Cidr> ParseCidr(absl::string_view text);
// A comma-separated list of ParseCidr (empty: none).
[[nodiscard]] absl::StatusOr<std::vector<Cidr>> ParseCidrList(absl::string_view text);
// Whether any range holds `address` (an IPv4-mapped address also matches
// IPv4 ranges).
bool InAny(const std::vector<Cidr>& ranges, const IpAddress& address);

}  // namespace mmserve::router

#endif  // MMSERVE_ROUTER_MEDIA_ADDRESS_H_
