#include "router/media_url.h"

#include <catch2/catch.hpp>
#include <string>

namespace mmserve::router {
namespace {

TEST_CASE("http(s) URLs parse into host, port and target") {
  absl::StatusOr<MediaUrl> u = ParseMediaUrl("HTTPS://Img.Example.COM./a/b.png?x=1#frag");
  REQUIRE(u.ok());
  CHECK(u->https);
  CHECK(u->host == "img.example.com");
  CHECK_FALSE(u->host_is_ip);
  CHECK(u->port == 443);
  CHECK(u->target == "/a/b.png?x=1");
  CHECK(u->Text() == "https://img.example.com/a/b.png?x=1");

  u = ParseMediaUrl("http://10.1.2.3:8080");
  REQUIRE(u.ok());
  CHECK_FALSE(u->https);
  CHECK(u->host_is_ip);
  CHECK(u->port == 8080);
  CHECK(u->target == "/");
  CHECK(u->HostHeader() == "10.1.2.3:8080");

  u = ParseMediaUrl("https://[::FFFF:127.0.0.1]:9/x?q");
  REQUIRE(u.ok());
  CHECK(u->host == "::ffff:127.0.0.1");
  CHECK(u->host_is_ip);
  CHECK(u->HostHeader() == "[::ffff:127.0.0.1]:9");
  CHECK(u->Text() == "https://[::ffff:127.0.0.1]:9/x?q");

  CHECK(ParseMediaUrl("https://cdn.example.com?x")->target == "/?x");
}

TEST_CASE("unusual URLs are refused with the reason") {
  const std::pair<std::string, const char*> cases[] = {
      {"ftp://example.com/a.png", "only http:// and https://"},
      {"file:///etc/passwd", "only http:// and https://"},
      {"https://user:pw@example.com/a.png", "credentials"},
      {"https://example.com@10.0.0.1/a.png", "credentials"},
      {"https://exa mple.com/a.png", "spaces"},
      {"https://example.com/\x01", "control"},
      {"https://ex\xc3\xa4mple.com/", "non-ASCII"},
      {"https://%31%30.0.0.1/", "not allowed"},
      {"https:///a.png", "no host"},
      {"https://a..example.com/", "empty label"},
      {"https://.example.com/", "empty label"},
      {"https://example.com../", "empty label"},
      {"https://example.com:0/", "1..65535"},
      {"https://example.com:65536/", "1..65535"},
      {"https://example.com:8x/", "not a number"},
      {"https://example.com:/", "empty port"},
      {"https://[::1/", "unclosed"},
      {"https://[example.com]/", "not an IPv6"},
      {"https://[::1]x/", "unexpected"},
      {"https://" + std::string(kMaxMediaUrlBytes, 'a'), "longer than"},
  };
  for (const auto& [url, why] : cases) {
    INFO(url);
    absl::StatusOr<MediaUrl> u = ParseMediaUrl(url);
    REQUIRE_FALSE(u.ok());
    CHECK(absl::IsInvalidArgument(u.status()));
    CHECK_THAT(std::string(u.status().message()), Catch::Contains(why));
  }
}

TEST_CASE("IsRemoteMediaUrl tells http(s) URLs from the rest") {
  CHECK(IsRemoteMediaUrl("https://x"));
  CHECK(IsRemoteMediaUrl("HTTP://x"));
  CHECK_FALSE(IsRemoteMediaUrl("data:image/png;base64,AA=="));
  CHECK_FALSE(IsRemoteMediaUrl("ftp://x"));
}

TEST_CASE("redirects resolve absolute, scheme-relative, absolute-path and relative Locations") {
  const MediaUrl from = *ParseMediaUrl("https://a.example.com:8443/img/cat.png?size=2");
  CHECK(ResolveRedirect(from, "http://b.example.com/x.png")->Text() ==
        "http://b.example.com/x.png");
  CHECK(ResolveRedirect(from, "//c.example.com/y")->Text() == "https://c.example.com/y");
  CHECK(ResolveRedirect(from, "/z.png")->Text() == "https://a.example.com:8443/z.png");
  CHECK(ResolveRedirect(from, "dog.png")->Text() == "https://a.example.com:8443/img/dog.png");
  CHECK_FALSE(ResolveRedirect(from, "").ok());
  CHECK_FALSE(ResolveRedirect(from, "file:///etc/passwd").ok());
  CHECK_FALSE(ResolveRedirect(from, "gopher://x/").ok());
}

TEST_CASE("internal host names are refused whatever they resolve to") {
  for (const char* host : {"localhost", "a.localhost", "metadata", "metadata.google.internal",
                           "printer.local", "box.localdomain", "nas.home.arpa"}) {
    INFO(host);
    CHECK(InternalHostReason(host).has_value());
  }
  for (const char* host : {"img.example.com", "cdn.example.co.uk", "internal.example.com"}) {
    INFO(host);
    CHECK_FALSE(InternalHostReason(host).has_value());
  }
}

TEST_CASE("the allow-list matches exact hosts and *.suffix patterns") {
  absl::StatusOr<MediaHostList> list =
      MediaHostList::Parse(" img.example.com , *.CDN.net,10.213.0.9,::1");
  REQUIRE(list.ok());
  CHECK(list->Allows("img.example.com"));
  CHECK_FALSE(list->Allows("x.img.example.com"));
  CHECK(list->Allows("a.cdn.net"));
  CHECK(list->Allows("a.b.cdn.net"));
  CHECK_FALSE(list->Allows("cdn.net"));
  CHECK_FALSE(list->Allows("evilcdn.net"));
  CHECK_FALSE(list->Allows("cdn.net.evil.com"));
  CHECK(list->Allows("10.213.0.9"));
  CHECK(list->Allows("::1"));
  CHECK_FALSE(list->Allows("10.213.0.90"));

  absl::StatusOr<MediaHostList> any = MediaHostList::Parse("");
  REQUIRE(any.ok());
  CHECK(any->empty());
  CHECK(any->Allows("anything.example"));

  CHECK(MediaHostList::Parse("0:0::1")->Allows("::1"));  // IP literals canonical
  for (const char* bad :
       {"*", "*.", ".", "a.*.com", "http://x.com", "x.com/path", "a:b", "a b.com", "*.::1"}) {
    INFO(bad);
    CHECK_FALSE(MediaHostList::Parse(bad).ok());
  }
}

}  // namespace
}  // namespace mmserve::router
