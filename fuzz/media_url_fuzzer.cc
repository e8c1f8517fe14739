// Hostile remote media URLs, redirect Locations, allow-lists and addresses
// (first byte picks which). Properties: every refusal is InvalidArgument;
// an accepted URL has a lowercase host without spaces, a port in 1..65535
// and a target that starts with '/' and holds no fragment, and its Text()
// parses back to the same URL; a redirect resolves to such a URL; an
// allow-list allows each of its exact names; an address's text form parses
// back to it, and an IPv4-mapped address is judged as its IPv4 address.
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_split.h"
#include "fuzz/fuzz_check.h"
#include "fuzz/fuzz_input.h"
#include "router/media_address.h"
#include "router/media_url.h"

namespace mmserve::router {
namespace {

void CheckUrl(const absl::StatusOr<MediaUrl>& url) {
  if (!url.ok()) {
    FUZZ_CHECK(absl::IsInvalidArgument(url.status())) << url.status();
    return;
  }
  FUZZ_CHECK(!url->host.empty());
  FUZZ_CHECK(url->host == absl::AsciiStrToLower(url->host)) << url->host;
  FUZZ_CHECK(url->port >= 1 && url->port <= 65535) << url->port;
  FUZZ_CHECK(!url->target.empty() && url->target[0] == '/') << url->target;
  FUZZ_CHECK(url->target.find('#') == std::string::npos) << url->target;
  for (char c : url->Text()) FUZZ_CHECK(c > 0x20 && c < 0x7f) << url->Text();
  absl::StatusOr<MediaUrl> again = ParseMediaUrl(url->Text());
  FUZZ_CHECK(again.ok()) << url->Text() << ": " << again.status();
  FUZZ_CHECK(again->Text() == url->Text() && again->host == url->host && again->port == url->port &&
             again->https == url->https && again->host_is_ip == url->host_is_ip)
      << url->Text();
}

void CheckHosts(const std::string& text) {
  absl::StatusOr<MediaHostList> list = MediaHostList::Parse(text);
  if (!list.ok()) {
    FUZZ_CHECK(absl::IsInvalidArgument(list.status())) << list.status();
    return;
  }
  for (absl::string_view item : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    std::string name = absl::AsciiStrToLower(absl::StripAsciiWhitespace(item));
    if (name.rfind("*.", 0) == 0) continue;
    if (!name.empty() && name.back() == '.') name.pop_back();
    // A host as ParseMediaUrl gives it: IP literals in canonical form.
    if (absl::StatusOr<IpAddress> ip = ParseIpAddress(name); ip.ok()) name = AddressText(*ip);
    FUZZ_CHECK(list->Allows(name)) << name;
  }
}

void CheckAddress(mmserve::fuzz::FuzzInput& in) {
  IpAddress a;
  a.v6 = in.Bool();
  for (size_t i = 0; i < (a.v6 ? 16u : 4u); ++i) a.bytes[i] = in.Byte();
  absl::StatusOr<IpAddress> back = ParseIpAddress(AddressText(a));
  FUZZ_CHECK(back.ok() && *back == a) << AddressText(a);
  if (!a.v6) {
    IpAddress mapped;
    mapped.v6 = true;
    mapped.bytes[10] = mapped.bytes[11] = 0xff;
    for (int i = 0; i < 4; ++i) mapped.bytes[12 + i] = a.bytes[i];
    FUZZ_CHECK(NonPublicReason(mapped) == NonPublicReason(a)) << AddressText(a);
  }
}

}  // namespace
}  // namespace mmserve::router

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace mmserve::router;
  mmserve::fuzz::FuzzInput in(data, size);
  switch (in.Byte() % 4) {
    case 0:
      CheckUrl(ParseMediaUrl(in.Rest()));
      break;
    case 1: {
      static const MediaUrl base = *ParseMediaUrl("https://img.example.com:8443/a/b.png?x=1");
      CheckUrl(ResolveRedirect(base, in.Rest()));
      break;
    }
    case 2:
      CheckHosts(in.Rest());
      break;
    default:
      CheckAddress(in);
  }
  return 0;
}
