// mmserve_launch: runs router + encoders + language (role both, or
// --prefill=N --decode=N instances of the disaggregated roles, or
// --elastic=N instances of role elastic under `router --elastic`) on this
// machine and supervises them: a child that dies is restarted; SIGTERM or
// SIGINT stops every child (each drains and frees its blocks) and exits.
//
//   bazel-bin/deploy/launcher/mmserve_launch --model_dir=models/shapes-demo
//       --encoders=1 --profile=shm --port=50051 --http_port=8000
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "common/flag_aliases.h"
#include "common/grpc_server.h"
#include "deploy/launcher/local_stack.h"

ABSL_FLAG(std::string, model_dir, "",
          "model directory (required; serve.sh passes models/shapes-demo)");
ABSL_FLAG(std::string, bin_dir, "", "bazel-bin of the build (default: found from this binary)");
ABSL_FLAG(std::string, log_dir, "", "where each process's log goes (default: a temp dir)");
ABSL_FLAG(int, encoders, 1, "encoder processes");
ABSL_FLAG(std::string, profile, "shm", "UCX transport profile: shm or tcp");
ABSL_FLAG(std::string, host, "127.0.0.1", "address every service listens on");
ABSL_FLAG(int, port, 50051, "router gRPC port");
ABSL_FLAG(int, http_port, 8000, "router OpenAI-compatible HTTP port (-1: off)");
ABSL_FLAG(std::string, api_key_file, "",
          "the router's API key file (one a line); the launcher's own health calls send its first "
          "key (empty: the API is open)");
ABSL_FLAG(bool, restart, true, "restart a child that dies");
ABSL_FLAG(int, tp, 1,
          "tensor-parallel ranks of the language instance (it starts its own shard ranks); with "
          "--prefill/--decode, of each decode instance (--prefill_tp sets the prefill instances')");
ABSL_FLAG(int, prefill_tp, 1,
          "with --prefill/--decode: tensor-parallel ranks of each prefill instance (each rank "
          "hands its KV heads to the decode rank(s) holding them)");
ABSL_FLAG(int, prefill, 0,
          "prefill/decode disaggregation: language instances of role prefill (with --decode; "
          "0: one role-both instance)");
ABSL_FLAG(int, decode, 0, "prefill/decode disaggregation: language instances of role decode");
ABSL_FLAG(int, elastic, 0,
          "elastic sequence parallelism: language instances of role elastic and router --elastic "
          "(0: none)");
ABSL_FLAG(std::string, elastic_step_models, "",
          "with --elastic: the router's per-degree step-time models, a file of \"degree a b c\" "
          "lines (bench:elastic_profile writes one; empty: the router's default)");
ABSL_FLAG(std::string, esp_step_models, "", "deprecated: use --elastic_step_models");
ABSL_FLAG(std::vector<std::string>, router_flags, {},
          "extra router flags, comma-separated (e.g. --presize=false)");
ABSL_FLAG(std::vector<std::string>, encoder_flags, {},
          "extra flags for every encoder, comma-separated (e.g. --cache_mb=0)");
ABSL_FLAG(std::vector<std::string>, language_flags, {},
          "extra language flags, comma-separated (e.g. --kv_cache_mb=64,--threads=1)");

namespace mmserve::launcher {
namespace {

std::string SelfBinDir() {
  char self[4096] = {};
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  std::string exe(self, n > 0 ? n : 0);
  // <bin>/deploy/launcher/mmserve_launch
  for (int i = 0; i < 3; ++i) exe = exe.substr(0, exe.rfind('/'));
  return exe;
}

// StackOptions from the flags; InvalidArgument for a usage error.
absl::StatusOr<StackOptions> OptionsFromFlags() {
  StackOptions o;
  o.bin_dir = absl::GetFlag(FLAGS_bin_dir).empty() ? SelfBinDir() : absl::GetFlag(FLAGS_bin_dir);
  o.model_dir = absl::GetFlag(FLAGS_model_dir);
  if (o.model_dir.empty()) return absl::InvalidArgumentError("--model_dir is required");
  o.log_dir = absl::GetFlag(FLAGS_log_dir);
  if (o.log_dir.empty()) {
    char tmpl[] = "/tmp/mmserve-logs-XXXXXX";
    o.log_dir = mkdtemp(tmpl);
  }
  o.encoders = absl::GetFlag(FLAGS_encoders);
  o.profile = absl::GetFlag(FLAGS_profile);
  o.host = absl::GetFlag(FLAGS_host);
  o.router_port = absl::GetFlag(FLAGS_port);
  o.http_port = absl::GetFlag(FLAGS_http_port);
  o.api_key_file = absl::GetFlag(FLAGS_api_key_file);
  o.router_args = absl::GetFlag(FLAGS_router_flags);
  o.encoder_args = absl::GetFlag(FLAGS_encoder_flags);
  o.language_args = absl::GetFlag(FLAGS_language_flags);
  o.prefill = absl::GetFlag(FLAGS_prefill);
  o.decode = absl::GetFlag(FLAGS_decode);
  if (o.prefill < 0 || o.decode < 0 || (o.prefill > 0) != (o.decode > 0)) {
    return absl::InvalidArgumentError("--prefill and --decode go together (both >= 1)");
  }
  o.elastic = absl::GetFlag(FLAGS_elastic);
  if (o.elastic < 0 || (o.elastic > 0 && o.prefill > 0)) {
    return absl::InvalidArgumentError("--elastic goes alone (not with --prefill/--decode)");
  }
  o.elastic_step_models = absl::GetFlag(FLAGS_elastic_step_models);
  if (!o.elastic_step_models.empty() && o.elastic == 0) {
    return absl::InvalidArgumentError("--elastic_step_models needs --elastic");
  }
  if (absl::GetFlag(FLAGS_tp) > 1) {
    // Disaggregated: --tp is the decode instances' (--prefill_tp the
    // prefill instances').
    (o.prefill > 0 ? o.decode_args : o.language_args)
        .push_back(absl::StrCat("--tp=", absl::GetFlag(FLAGS_tp)));
  }
  if (absl::GetFlag(FLAGS_prefill_tp) < 1 ||
      (absl::GetFlag(FLAGS_prefill_tp) > 1 && o.prefill == 0)) {
    return absl::InvalidArgumentError("--prefill_tp needs --prefill and is at least 1");
  }
  if (absl::GetFlag(FLAGS_prefill_tp) > 1) {
    o.prefill_args.push_back(absl::StrCat("--tp=", absl::GetFlag(FLAGS_prefill_tp)));
  }
  return o;
}

// The addresses a user needs, then the READY line for scripts.
void PrintAddresses(LocalStack& s, const StackOptions& o) {
  std::printf("mmserve is up (logs in %s)\n", o.log_dir.c_str());
  std::printf("  gRPC  %s   (mmserve.v1.Inference)\n", s.router_address().c_str());
  if (s.http_port() > 0) {
    std::printf("  HTTP  http://%s:%d/v1/chat/completions\n", o.host.c_str(), s.http_port());
  }
  for (int i = 0; i < s.num_encoders(); ++i) {
    std::printf("  %s at %s, metrics :%d\n", s.encoder(i).id.c_str(),
                s.encoder(i).grpc_address().c_str(), s.encoder(i).metrics_port());
  }
  std::vector<Service*> langs;
  if (s.elastic()) {
    for (int i = 0; i < o.elastic; ++i) langs.push_back(&s.elastic(i));
  } else if (s.disaggregated()) {
    for (int i = 0; i < o.prefill; ++i) langs.push_back(&s.prefill(i));
    for (int i = 0; i < o.decode; ++i) langs.push_back(&s.decode(i));
  } else {
    langs.push_back(&s.language());
  }
  for (Service* l : langs) {
    std::printf("  %s at %s, metrics :%d\n", l->id.c_str(), l->grpc_address().c_str(),
                l->metrics_port());
  }
  std::printf("  router metrics :%d\n", s.router().metrics_port());
  std::printf("READY launcher stack grpc=%s http=%d\n", s.router_address().c_str(), s.http_port());
  std::fflush(stdout);
}

// Restarts the child `name` that exited. False: it was the router, and the
// stack stops.
bool Restart(LocalStack& s, const std::string& name) {
  absl::Status st = absl::OkStatus();
  if (name.rfind("encoder-", 0) == 0) {
    st = s.StartEncoder(std::stoi(name.substr(8)));
  } else if (name.rfind("language-", 0) == 0) {
    st = s.StartLanguage();
  } else if (name.rfind("prefill-", 0) == 0) {
    st = s.StartRole("prefill", std::stoi(name.substr(8)));
  } else if (name.rfind("decode-", 0) == 0) {
    st = s.StartRole("decode", std::stoi(name.substr(7)));
  } else if (name.rfind("elastic-", 0) == 0) {
    st = s.StartRole("elastic", std::stoi(name.substr(8)));
  } else {
    return false;
  }
  std::fprintf(stderr, "mmserve_launch: restart %s: %s\n", name.c_str(), st.ToString().c_str());
  return true;
}

int Main() {
  BlockTerminationSignals();
  auto options = OptionsFromFlags();
  if (!options.ok()) {
    std::fprintf(stderr, "mmserve_launch: %s\n", std::string(options.status().message()).c_str());
    return 2;
  }
  auto stack = LocalStack::Start(*options);
  if (!stack.ok()) {
    std::fprintf(stderr, "mmserve_launch: %s\n", stack.status().ToString().c_str());
    return 1;
  }
  LocalStack& s = **stack;
  PrintAddresses(s, *options);

  // Supervise until SIGTERM/SIGINT.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  const struct timespec tick = {0, 500 * 1000 * 1000};
  for (;;) {
    const int sig = sigtimedwait(&set, nullptr, &tick);
    if (sig == SIGTERM || sig == SIGINT) break;
    for (const std::string& name : s.Exited()) {
      std::fprintf(stderr, "mmserve_launch: %s exited\n", name.c_str());
      if (!absl::GetFlag(FLAGS_restart)) continue;
      if (!Restart(s, name)) {
        std::fprintf(stderr, "mmserve_launch: the router died; stopping\n");
        s.Stop();
        return 1;
      }
    }
  }
  std::fprintf(stderr, "mmserve_launch: stopping\n");
  s.Stop();
  return 0;
}

}  // namespace
}  // namespace mmserve::launcher

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (absl::Status s = mmserve::ApplyFlagAliases({{"esp_step_models", "elastic_step_models"}});
      !s.ok()) {
    std::fprintf(stderr, "mmserve_launch: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  return mmserve::launcher::Main();
}
