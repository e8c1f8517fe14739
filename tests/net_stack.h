// A serving stack spread over NetHosts: the router on host 0, each encoder
// and language instance on a host of its own, every process bound to its
// host's address only and talking over gRPC and UCX tcp across the switch.
//
//   ASSIGN_OR_RETURN(auto hosts, NetHosts::Create(NetStack::HostsFor(options)));
//   ASSIGN_OR_RETURN(auto stack, NetStack::Start(*hosts, options));
//   auto stub = mmserve::v1::Inference::NewStub(InternalChannel(stack->router_address()));
//   hosts->SetLink(stack->language_host(0), {.cut = true});
//   Leaks leaks = stack->WaitForNoLeaks(absl::Seconds(30));
//
// Destroy the stack before its hosts. Not thread-safe.
#ifndef MMSERVE_TESTS_NET_STACK_H_
#define MMSERVE_TESTS_NET_STACK_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "deploy/launcher/local_stack.h"
#include "tests/net_hosts.h"
#include "tests/stack_harness.h"

namespace mmserve::testing {

struct NetStackOptions {
  int encoders = 1;
  // Each language instance's role: "both", "prefill" or "decode".
  std::vector<std::string> languages = {"both"};
  std::string profile = "tcp";
  std::vector<std::string> router_args;
  std::vector<std::string> encoder_args;
  std::vector<std::string> language_args;
  absl::Duration ready_timeout = absl::Seconds(120);
};

class NetStack {
 public:
  static int HostsFor(const NetStackOptions& o) {
    return 1 + o.encoders + static_cast<int>(o.languages.size());
  }
  // Starts every process and waits until the router sees them healthy.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<NetStack>> Start(
      NetHosts& hosts, const NetStackOptions& options);
  ~NetStack();  // SIGTERM, then SIGKILL after a grace
  NetStack(const NetStack&) = delete;
  NetStack& operator=(const NetStack&) = delete;

  const std::string& router_address() const { return router_address_; }
  int router_host() const { return 0; }
  int encoder_host(int i) const { return 1 + i; }
  int language_host(int i) const { return 1 + options_.encoders + i; }
  launcher::Service& router() { return router_; }
  launcher::Service& encoder(int i) { return encoders_[i]; }
  launcher::Service& language(int i) { return languages_[i]; }

  // SIGKILLs the router and starts it again on the same address.
  void KillRouter();
  [[nodiscard]] absl::Status StartRouter();
  // Waits until the router reports this many healthy encoders and instances
  // of `role` ("language" for role both, "prefill", "decode"); UNAVAILABLE
  // with its log when a process exits meanwhile.
  [[nodiscard]] absl::Status WaitHealthy(int encoders, const std::string& role, int instances,
                                         absl::Duration timeout);
  // A metric of a service, scraped from the test process.
  double Metric(launcher::Service& service, const std::string& name,
                const std::string& labels = "");
  // Blocks and live requests on every side, once they settle (or the last
  // reading after `timeout`).
  Leaks WaitForNoLeaks(absl::Duration timeout);

 private:
  NetStack(NetHosts& hosts, const NetStackOptions& options) : hosts_(hosts), options_(options) {}
  // The one place flags of the service binaries are built.
  std::vector<std::string> Flags(const std::string& binary, int host, const std::string& id,
                                 const std::string& role) const;
  absl::StatusOr<launcher::Service> Launch(int host, const std::string& name,
                                           const std::string& binary,
                                           const std::vector<std::string>& args);

  NetHosts& hosts_;
  const NetStackOptions options_;
  std::string log_dir_;
  launcher::Service router_;
  std::vector<launcher::Service> encoders_;
  std::vector<launcher::Service> languages_;
  std::string router_address_;
  int router_port_ = 0;
  // The router's internal plane (Registry), where instances register.
  std::string registry_address_;
  int registry_port_ = 0;
};

}  // namespace mmserve::testing

#endif  // MMSERVE_TESTS_NET_STACK_H_
