// A whole topology on this machine: router, N encoders and one language
// instance (role both; or prefill and decode instances; or N elastic
// instances under `router --elastic`), started in order, each registering with the router
// on its internal address (--internal_address=<host>:0), and supervised
// until Stop. deploy/serve.sh and the end-to-end tests use it.
//
//   ASSIGN_OR_RETURN(auto stack, LocalStack::Start({.bin_dir = "bazel-bin",
//                                                   .model_dir = "models/shapes-demo",
//                                                   .encoders = 2}));
//   // stack->router_address(): the public gRPC API; stack->http_port(): OpenAI HTTP
//   stack->encoder(1).process->Signal(SIGKILL);   // fault tests
//   stack->Stop();                                // SIGTERM everything, reap
//
// Not thread-safe.
#ifndef MMSERVE_DEPLOY_LAUNCHER_LOCAL_STACK_H_
#define MMSERVE_DEPLOY_LAUNCHER_LOCAL_STACK_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "deploy/launcher/child_process.h"

namespace mmserve::launcher {

struct StackOptions {
  // Where the binaries are, in Bazel's layout: <bin_dir>/router/router,
  // <bin_dir>/encoder_service/encoder, <bin_dir>/language_service/language.
  std::string bin_dir;
  std::string model_dir;
  std::string log_dir = "/tmp";
  int encoders = 1;
  // Prefill/decode disaggregation: with both > 0, this many `--role=prefill`
  // and `--role=decode` language instances (prefill-i, decode-i) instead of
  // the role-both one.
  int prefill = 0;
  int decode = 0;
  // Elastic sequence parallelism: with > 0, this many `--role=elastic`
  // language instances (elastic-i) instead of the role-both one, and the
  // router runs with --elastic.
  int elastic = 0;
  // With elastic: the router's --elastic_step_models (a models file,
  // bench:elastic_profile's); empty: the router's default models.
  std::string elastic_step_models;
  std::string profile = "shm";
  std::string host = "127.0.0.1";
  int router_port = 0;  // 0: any free port
  int http_port = 0;    // 0: any free port, -1: off
  // The router's --api_key, also sent by WaitHealthy; empty: none.
  std::string api_key;
  // The router's --api_key_file (keys one a line; blank and '#' lines
  // skipped); with api_key empty, WaitHealthy sends the file's first key, so
  // no key goes on a command line. Empty: none.
  std::string api_key_file;
  std::vector<std::string> router_args;
  std::vector<std::string> encoder_args;
  std::vector<std::string> language_args;
  // More flags for the decode instances only (after language_args), e.g.
  // --tp=2.
  std::vector<std::string> decode_args;
  // More flags for the prefill instances only (after language_args), e.g.
  // --tp=2.
  std::vector<std::string> prefill_args;
  absl::Duration ready_timeout = absl::Seconds(120);
};

struct Service {
  std::string id;
  std::unique_ptr<ChildProcess> process;
  ReadyLine ready;
  std::string grpc_address() const;
  int metrics_port() const;
};

class LocalStack {
 public:
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<LocalStack>> Start(
      const StackOptions& options);
  ~LocalStack();

  const std::string& router_address() const { return router_address_; }
  // The router's internal plane (Registry), where instances register.
  const std::string& registry_address() const { return registry_address_; }
  int http_port() const { return http_port_; }
  Service& router() { return router_; }
  Service& encoder(int i) { return encoders_[i]; }
  Service& language() { return language_; }  // role both only
  Service& prefill(int i) { return prefill_[i]; }
  Service& decode(int i) { return decode_[i]; }
  Service& elastic(int i) { return elastic_[i]; }
  bool disaggregated() const { return options_.prefill > 0 && options_.decode > 0; }
  bool elastic() const { return options_.elastic > 0; }
  int num_encoders() const { return static_cast<int>(encoders_.size()); }
  int num_elastic() const { return static_cast<int>(elastic_.size()); }

  // (Re)starts encoder `i` or the language instance (after a kill).
  [[nodiscard]] absl::Status StartEncoder(int i);
  [[nodiscard]] absl::Status StartLanguage();
  // (Re)starts language instance `i` of role "prefill", "decode" or
  // "elastic".
  [[nodiscard]] absl::Status StartRole(const std::string& role, int i);
  // Waits until the router reports this many healthy instances.
  [[nodiscard]] absl::Status WaitHealthy(int encoders, int languages, absl::Duration timeout);
  // Names of children that exited on their own since the last call.
  std::vector<std::string> Exited();
  // SIGTERM to every child (router first, so no new work arrives), SIGKILL
  // after `grace`. Idempotent.
  void Stop(absl::Duration grace = absl::Seconds(15));

 private:
  explicit LocalStack(const StackOptions& options) : options_(options) {}
  absl::StatusOr<Service> Launch(const std::string& name, const std::string& binary,
                                 std::vector<std::string> args);

  const StackOptions options_;
  Service router_;
  std::vector<Service> encoders_;
  Service language_;
  std::vector<Service> prefill_;
  std::vector<Service> decode_;
  std::vector<Service> elastic_;
  std::string router_address_;
  std::string registry_address_;
  int http_port_ = -1;
  std::string health_key_;  // the API key WaitHealthy sends; empty: none
};

}  // namespace mmserve::launcher

#endif  // MMSERVE_DEPLOY_LAUNCHER_LOCAL_STACK_H_
