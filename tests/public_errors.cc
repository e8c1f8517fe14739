#include "tests/public_errors.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"

namespace mmserve::testing {
namespace {

// The process and its children (a TP instance's ranks), as decimal pids.
void AddPids(pid_t pid, std::vector<std::string>& out) {
  out.push_back(absl::StrCat(pid));
  std::error_code ec;
  for (const auto& task :
       std::filesystem::directory_iterator(absl::StrCat("/proc/", pid, "/task"), ec)) {
    std::ifstream in(task.path() / "children");
    pid_t child;
    while (in >> child) out.push_back(absl::StrCat(child));
  }
}

// `with_id`: the service's id is an instance id (the router's is the
// served model's name, which clients know).
void AddService(launcher::Service& s, std::vector<std::string>& out, bool with_id = true) {
  if (s.process == nullptr) return;
  if (with_id) out.push_back(s.id);
  AddPids(s.process->pid(), out);
  const std::string address = s.grpc_address();
  if (!address.empty()) {
    out.push_back(address);
    out.push_back(address.substr(address.rfind(':') + 1));
  }
  if (s.metrics_port() > 0) out.push_back(absl::StrCat(s.metrics_port()));
}

bool IsDigit(char c) { return c >= '0' && c <= '9'; }

// Whether `word` occurs in `text`; a number only where no digit touches it.
bool Contains(absl::string_view text, absl::string_view word) {
  const bool number = !word.empty() && std::all_of(word.begin(), word.end(), IsDigit);
  for (size_t at = text.find(word); at != absl::string_view::npos; at = text.find(word, at + 1)) {
    if (!number) return true;
    const size_t end = at + word.size();
    if ((at == 0 || !IsDigit(text[at - 1])) && (end == text.size() || !IsDigit(text[end]))) {
      return true;
    }
  }
  return false;
}

}  // namespace

std::vector<std::string> StackInternals(launcher::LocalStack& stack) {
  std::vector<std::string> out;
  AddService(stack.router(), out, /*with_id=*/false);
  for (int i = 0; i < stack.num_encoders(); ++i) AddService(stack.encoder(i), out);
  if (stack.disaggregated()) {
    AddService(stack.prefill(0), out);
    AddService(stack.decode(0), out);
  } else if (stack.elastic()) {
    for (int i = 0; i < stack.num_elastic(); ++i) AddService(stack.elastic(i), out);
  } else {
    AddService(stack.language(), out);
  }
  out.push_back(stack.router_address());
  out.push_back(stack.registry_address());
  if (stack.http_port() > 0) out.push_back(absl::StrCat(stack.http_port()));
  return out;
}

std::string InternalDetail(absl::string_view message, absl::string_view request_id,
                           const std::vector<std::string>& internals) {
  std::string text(message);
  if (!request_id.empty()) text = absl::StrReplaceAll(text, {{request_id, "<id>"}});
  for (const std::string& word : internals) {
    if (!word.empty() && Contains(text, word)) return word;
  }
  static const std::regex* const kPatterns =
      new std::regex(R"((encoder|language|prefill|decode|elastic|tp)-[0-9]+|/dev/shm|/mmserve|)"
                     R"(\b[0-9]{1,3}(\.[0-9]{1,3}){3}\b|\b(localhost|ipv4|ipv6|unix):|\[::1?\]|)"
                     R"([A-Za-z0-9.\-]+:[0-9]{2,5}\b|\b(recvmsg|sendmsg|epoll_wait|)"
                     R"(writev|readv|errno|strerror)\b)",
                     std::regex::icase);
  std::smatch m;
  if (std::regex_search(text, m, *kPatterns)) return m.str();
  const std::string lower = absl::AsciiStrToLower(text);
  for (int e = 1; e < 134; ++e) {
    const std::string why = absl::AsciiStrToLower(std::strerror(e));
    if (why.rfind("unknown error", 0) == 0) continue;
    if (lower.find(why) != std::string::npos) return why;
  }
  return "";
}

absl::Status CheckPublicError(const absl::Status& status, absl::string_view request_id,
                              const std::vector<std::string>& internals) {
  if (status.ok()) return absl::OkStatus();
  std::string wrong;
  if (request_id.empty()) absl::StrAppend(&wrong, "no request id was sent; ");
  const bool client_error = status.code() == absl::StatusCode::kInvalidArgument ||
                            status.code() == absl::StatusCode::kResourceExhausted ||
                            status.code() == absl::StatusCode::kCancelled ||
                            status.code() == absl::StatusCode::kUnauthenticated ||
                            status.code() == absl::StatusCode::kNotFound ||
                            status.code() == absl::StatusCode::kOutOfRange;
  if (!client_error && !request_id.empty() &&
      status.message().find(absl::StrCat("(request id ", request_id, ")")) ==
          absl::string_view::npos) {
    absl::StrAppend(&wrong, "the message does not name request id ", request_id, "; ");
  }
  const std::string detail = InternalDetail(status.message(), request_id, internals);
  if (!detail.empty()) absl::StrAppend(&wrong, "the message tells \"", detail, "\"; ");
  if (wrong.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(status.ToString(), ": ", wrong));
}

}  // namespace mmserve::testing
