#include "router/public_access.h"

#include <catch2/catch.hpp>
#include <cstdio>
#include <fstream>
#include <string>

namespace mmserve::router {
namespace {

TEST_CASE("API keys: Bearer of a known key passes, anything else is UNAUTHENTICATED", "[access]") {
  PublicAccess open({});
  CHECK(open.Authenticate("").ok());
  PublicAccess keyed({.api_keys = {"sk-one", "sk-two"}});
  CHECK(keyed.keys_required());
  CHECK(keyed.Authenticate("Bearer sk-one").ok());
  CHECK(keyed.Authenticate("Bearer sk-two").ok());
  for (const char* bad : {"", "sk-one", "Bearer sk-on", "Bearer sk-one2", "Basic sk-one", "Bearer ",
                          "bearer sk-three"}) {
    INFO(bad);
    absl::Status s = keyed.Authenticate(bad);
    CHECK(absl::IsUnauthenticated(s));
    // The key is never echoed.
    CHECK(s.message().find("sk-") == absl::string_view::npos);
  }
}

TEST_CASE("API keys load from flags and a file; bad keys are refused without echoing them",
          "[access]") {
  const std::string path = std::string(std::getenv("TEST_TMPDIR")) + "/keys";
  {
    std::ofstream f(path);
    f << "# keys\nsk-file-1\n\n  sk-file-2  \n";
  }
  auto keys = LoadApiKeys({"sk-flag"}, path);
  REQUIRE(keys.ok());
  CHECK(*keys == std::vector<std::string>{"sk-flag", "sk-file-1", "sk-file-2"});
  auto bad = LoadApiKeys({"sk secret"}, "");
  CHECK(absl::IsInvalidArgument(bad.status()));
  CHECK(bad.status().message().find("secret") == absl::string_view::npos);
  CHECK(!LoadApiKeys({""}, "").ok());
  CHECK(absl::IsNotFound(LoadApiKeys({}, path + ".missing").status()));
}

TEST_CASE("the per-client cap admits up to the limit and frees a slot with its lease", "[access]") {
  PublicAccess access({.max_calls_per_client = 2});
  auto a = access.Admit("host:1.2.3.4");
  auto b = access.Admit("host:1.2.3.4");
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  auto c = access.Admit("host:1.2.3.4");
  CHECK(absl::IsResourceExhausted(c.status()));
  CHECK(access.Admit("host:5.6.7.8").ok());  // another client, its own slots
  CHECK(access.Running("host:1.2.3.4") == 2);
  a->reset();
  CHECK(access.Running("host:1.2.3.4") == 1);
  CHECK(access.Admit("host:1.2.3.4").ok());
  PublicAccess uncapped({});
  for (int i = 0; i < 100; ++i) CHECK(uncapped.Admit("x").ok());
}

TEST_CASE("clients are keys when keys are on, else hosts", "[access]") {
  CHECK(PeerHost("ipv4:10.0.0.7:5123") == "10.0.0.7");
  CHECK(PeerHost("ipv6:[::1]:5123") == "::1");
  CHECK(PeerHost("unix:/tmp/s") == "unix:/tmp/s");
  PublicAccess keyed({.api_keys = {"k"}});
  CHECK(keyed.ClientOf("Bearer k", "1.2.3.4") == keyed.ClientOf("Bearer k", "5.6.7.8"));
  PublicAccess open({});
  CHECK(open.ClientOf("", "1.2.3.4") != open.ClientOf("", "5.6.7.8"));
}

}  // namespace
}  // namespace mmserve::router
