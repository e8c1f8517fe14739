#include "bench/torch_vision_peer.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace mmserve::bench {
namespace {

// Single-quoted for /bin/sh.
std::string Quoted(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// The last non-empty line of the child's stdout, and its exit status.
bool RunChild(const std::string& command, std::string* last_line, int* status) {
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return false;
  char buf[4096];
  std::string line;
  while (std::fgets(buf, sizeof(buf), pipe) != nullptr) {
    line += buf;
    if (!line.empty() && line.back() == '\n') {
      line.pop_back();
      if (!line.empty()) *last_line = line;
      line.clear();
    }
  }
  if (!line.empty()) *last_line = line;
  *status = pclose(pipe);
  return true;
}

}  // namespace

std::string DefaultTorchVisionPeerScript() {
  const char* workspace = std::getenv("BUILD_WORKSPACE_DIRECTORY");
  const std::string rel = "tools/torch_vision_peer.py";
  return workspace != nullptr ? absl::StrCat(workspace, "/", rel) : rel;
}

TorchVisionPeerResult RunTorchVisionPeer(const TorchVisionPeerRequest& r) {
  TorchVisionPeerResult out;
  if (access(r.python.c_str(), X_OK) != 0) {
    out.skipped_reason = absl::StrCat("no Python interpreter at ", r.python);
    return out;
  }
  if (access(r.script.c_str(), R_OK) != 0) {
    out.skipped_reason = absl::StrCat("no peer script at ", r.script);
    return out;
  }
  std::vector<std::string> grids;
  for (const model::MediaGrid& g : r.grids) {
    grids.push_back(absl::StrCat(g.grid_t, "x", g.grid_h, "x", g.grid_w));
  }
  const std::string command = absl::StrCat(
      Quoted(r.python), " ", Quoted(r.script), " --grids=", absl::StrJoin(grids, ","),
      " --depth=", r.depth, " --threads=", r.threads, " --dtype=", r.dtype, " --iters=", r.iters);
  std::string last;
  int status = 0;
  if (!RunChild(command, &last, &status)) {
    out.skipped_reason = "could not start the peer script";
    return out;
  }
  const nlohmann::json j = nlohmann::json::parse(last, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) {
    out.skipped_reason = absl::StrCat("the peer script exited with status ", WEXITSTATUS(status),
                                      " without a JSON line");
    return out;
  }
  if (!j.value("ok", false)) {
    out.skipped_reason = j.value("reason", std::string("the peer script failed"));
    return out;
  }
  const auto seconds = j.find("seconds");
  if (seconds == j.end() || !seconds->is_array() || seconds->size() != r.grids.size()) {
    out.skipped_reason = "the peer script's JSON line has no time for every grid";
    return out;
  }
  for (const auto& s : *seconds) out.seconds.push_back(s.is_number() ? s.get<double>() : 0.0);
  out.torch_version = j.value("torch", std::string());
  out.ran = true;
  return out;
}

}  // namespace mmserve::bench
