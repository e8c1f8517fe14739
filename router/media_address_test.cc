#include "router/media_address.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <catch2/catch.hpp>
#include <string>

namespace mmserve::router {
namespace {

std::optional<std::string> Reason(const std::string& text) {
  absl::StatusOr<IpAddress> a = ParseIpAddress(text);
  REQUIRE(a.ok());
  return NonPublicReason(*a);
}

TEST_CASE("public unicast addresses may be fetched from") {
  for (const char* a :
       {"8.8.8.8", "1.1.1.1", "93.184.216.34", "172.15.255.255", "172.32.0.1", "100.63.255.255",
        "100.128.0.1", "169.253.1.1", "192.169.0.1", "223.255.255.254", "2606:4700:4700::1111",
        "2a00:1450:4001:82a::200e", "::ffff:8.8.8.8", "64:ff9b::808:808", "2002:808:808::1"}) {
    INFO(a);
    CHECK_FALSE(Reason(a).has_value());
  }
}

TEST_CASE("every non-public IPv4 range is refused with its reason") {
  const std::pair<const char*, const char*> cases[] = {
      {"0.0.0.0", "an unspecified address"},       {"0.1.2.3", "an unspecified address"},
      {"10.0.0.1", "a private address"},           {"10.255.255.255", "a private address"},
      {"100.64.0.1", "a shared (CGNAT) address"},  {"100.127.255.254", "a shared (CGNAT) address"},
      {"127.0.0.1", "a loopback address"},         {"127.255.0.9", "a loopback address"},
      {"169.254.169.254", "a link-local address"}, {"169.254.0.1", "a link-local address"},
      {"172.16.0.1", "a private address"},         {"172.31.255.255", "a private address"},
      {"192.0.0.8", "a reserved address"},         {"192.0.2.1", "a documentation address"},
      {"192.168.1.1", "a private address"},        {"198.18.0.1", "a reserved address"},
      {"198.51.100.7", "a documentation address"}, {"203.0.113.9", "a documentation address"},
      {"224.0.0.1", "a multicast address"},        {"239.255.255.250", "a multicast address"},
      {"240.0.0.1", "a reserved address"},         {"255.255.255.255", "a broadcast address"},
  };
  for (const auto& [address, reason] : cases) {
    INFO(address);
    CHECK(Reason(address) == std::optional<std::string>(reason));
  }
}

TEST_CASE("every non-public IPv6 range is refused, translated forms by their IPv4 address") {
  const std::pair<const char*, const char*> cases[] = {
      {"::", "an unspecified address"},
      {"::1", "a loopback address"},
      {"fc00::1", "a private address"},
      {"fd12:3456::1", "a private address"},
      {"fe80::1", "a link-local address"},
      {"febf::1", "a link-local address"},
      {"fec0::1", "a private address"},
      {"ff02::1", "a multicast address"},
      {"2001:db8::1", "a documentation address"},
      {"100::1", "a reserved address"},
      {"2001::1", "a reserved address"},
      {"::ffff:127.0.0.1", "a loopback address"},
      {"::ffff:10.1.2.3", "a private address"},
      {"::ffff:169.254.169.254", "a link-local address"},
      {"::ffff:100.64.1.1", "a shared (CGNAT) address"},
      {"::ffff:0.0.0.0", "an unspecified address"},
      {"::127.0.0.1", "a loopback address"},          // IPv4-compatible
      {"64:ff9b::a00:1", "a private address"},        // NAT64 of 10.0.0.1
      {"2002:a9fe:a9fe::1", "a link-local address"},  // 6to4 of 169.254.169.254
      {"::2", "a reserved address"},
  };
  for (const auto& [address, reason] : cases) {
    INFO(address);
    CHECK(Reason(address) == std::optional<std::string>(reason));
  }
}

TEST_CASE("socket addresses convert both families") {
  sockaddr_in in{};
  in.sin_family = AF_INET;
  inet_pton(AF_INET, "10.9.8.7", &in.sin_addr);
  std::optional<IpAddress> a = FromSockaddr(reinterpret_cast<const sockaddr*>(&in));
  REQUIRE(a.has_value());
  CHECK(AddressText(*a) == "10.9.8.7");
  sockaddr_in6 in6{};
  in6.sin6_family = AF_INET6;
  inet_pton(AF_INET6, "fe80::5", &in6.sin6_addr);
  a = FromSockaddr(reinterpret_cast<const sockaddr*>(&in6));
  REQUIRE(a.has_value());
  CHECK(a->v6);
  CHECK(AddressText(*a) == "fe80::5");
  sockaddr other{};
  other.sa_family = AF_UNIX;
  CHECK_FALSE(FromSockaddr(&other).has_value());
}

TEST_CASE("only standard numeric forms parse as addresses") {
  for (const char* bad : {"", "localhost", "127.1", "0x7f.0.0.1", "2130706433", "1.2.3.4.5",
                          "[::1]", "fe80::1%eth0", "256.1.1.1"}) {
    INFO(bad);
    CHECK_FALSE(ParseIpAddress(bad).ok());
  }
}

TEST_CASE("trusted ranges parse, match, and refuse malformed input") {
  absl::StatusOr<std::vector<Cidr>> ranges = ParseCidrList(" 10.213.0.0/16, fd00::/8 ,127.0.0.1");
  REQUIRE(ranges.ok());
  REQUIRE(ranges->size() == 3);
  auto in = [&](const char* text) { return InAny(*ranges, *ParseIpAddress(text)); };
  CHECK(in("10.213.7.1"));
  CHECK_FALSE(in("10.214.0.1"));
  CHECK(in("fd00::9"));
  CHECK_FALSE(in("fc00::9"));
  CHECK(in("127.0.0.1"));
  CHECK_FALSE(in("127.0.0.2"));
  CHECK(in("::ffff:10.213.0.5"));  // mapped form of a trusted IPv4 address
  CHECK(ParseCidrList("").ok());
  CHECK(ParseCidrList("")->empty());
  CHECK(ParseCidr("0.0.0.0/0").ok());
  for (const char* bad : {"10.0.0.0/33", "10.0.0.1/8", "fd00::/129", "fd00::/-1", "host/8",
                          "10.0.0.0/x", "10.0.0.0/"}) {
    INFO(bad);
    CHECK_FALSE(ParseCidr(bad).ok());
  }
}

}  // namespace
}  // namespace mmserve::router
