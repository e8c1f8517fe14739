#include "router/public_access.h"

#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/file.h"
#include "common/status_macros.h"

namespace mmserve::router {
namespace {

constexpr absl::string_view kBearer = "Bearer ";

// Equal strings, in time that depends only on the lengths.
bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

absl::Status CheckKey(absl::string_view key, absl::string_view origin) {
  if (key.empty()) return absl::InvalidArgumentError(absl::StrCat(origin, ": an API key is empty"));
  for (char c : key) {
    if (absl::ascii_isspace(static_cast<unsigned char>(c)) ||
        !absl::ascii_isprint(static_cast<unsigned char>(c))) {
      return absl::InvalidArgumentError(
          absl::StrCat(origin, ": an API key holds whitespace or a control character"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<std::string>> LoadApiKeys(const std::vector<std::string>& keys,
                                                     const std::string& key_file) {
  std::vector<std::string> out;
  for (const std::string& k : keys) {
    RETURN_IF_ERROR(CheckKey(k, "--api_key"));
    out.push_back(k);
  }
  if (key_file.empty()) return out;
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(key_file));
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || absl::StartsWith(line, "#")) continue;
    RETURN_IF_ERROR(CheckKey(line, key_file));
    out.emplace_back(line);
  }
  if (out.empty()) return absl::InvalidArgumentError(key_file + ": no API key in the file");
  return out;
}

std::string PeerHost(absl::string_view peer) {
  for (absl::string_view scheme : {"ipv4:", "ipv6:"}) {
    if (!absl::ConsumePrefix(&peer, scheme)) continue;
    const size_t colon = peer.rfind(':');
    if (colon != absl::string_view::npos) peer = peer.substr(0, colon);
    absl::ConsumePrefix(&peer, "[");
    absl::ConsumeSuffix(&peer, "]");
    break;
  }
  return std::string(peer);
}

PublicAccess::PublicAccess(PublicAccessOptions options) : options_(std::move(options)) {}

absl::Status PublicAccess::Authenticate(absl::string_view authorization) const {
  if (!keys_required()) return absl::OkStatus();
  if (absl::StartsWith(authorization, kBearer)) {
    const absl::string_view given =
        absl::StripAsciiWhitespace(authorization.substr(kBearer.size()));
    bool known = false;
    for (const std::string& key : options_.api_keys) known |= ConstantTimeEquals(given, key);
    if (known) return absl::OkStatus();
    return absl::UnauthenticatedError("Incorrect API key provided");
  }
  return absl::UnauthenticatedError(
      "You didn't provide an API key; send it as \"Authorization: Bearer <key>\"");
}

std::string PublicAccess::ClientOf(absl::string_view authorization, absl::string_view host) const {
  if (keys_required()) return absl::StrCat("key:", authorization);
  return absl::StrCat("host:", host);
}

absl::StatusOr<PublicAccess::Lease> PublicAccess::Admit(const std::string& client) {
  if (options_.max_calls_per_client <= 0) return Lease();
  {
    absl::MutexLock lock(&mu_);
    int& running = running_[client];
    if (running >= options_.max_calls_per_client) {
      return absl::ResourceExhaustedError(
          absl::StrCat("too many concurrent requests from this client (at most ",
                       options_.max_calls_per_client, "); retry later"));
    }
    ++running;
  }
  return Lease(static_cast<void*>(this), [this, client](void*) { Release(client); });
}

void PublicAccess::Release(const std::string& client) {
  absl::MutexLock lock(&mu_);
  auto it = running_.find(client);
  if (it == running_.end()) return;
  if (--it->second <= 0) running_.erase(it);
}

int PublicAccess::Running(const std::string& client) const {
  absl::MutexLock lock(&mu_);
  auto it = running_.find(client);
  return it == running_.end() ? 0 : it->second;
}

}  // namespace mmserve::router
