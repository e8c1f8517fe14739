#include "common/internal_plane.h"

#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "common/file.h"

namespace mmserve {
namespace {

// The process's token, set once at start-up.
struct TokenHolder {
  absl::Mutex mu;
  std::string token ABSL_GUARDED_BY(mu);
  InternalPlaneOptions files ABSL_GUARDED_BY(mu);
  std::string cert ABSL_GUARDED_BY(mu);  // PEM contents
  std::string key ABSL_GUARDED_BY(mu);
  std::string ca ABSL_GUARDED_BY(mu);
};

TokenHolder& Holder() {
  static TokenHolder* holder = new TokenHolder();  // never destroyed
  return *holder;
}

struct Pems {
  std::string cert, key, ca;
};

Pems LoadedPems() {
  TokenHolder& h = Holder();
  absl::MutexLock lock(&h.mu);
  return {h.cert, h.key, h.ca};
}

absl::StatusOr<std::string> ReadPem(const std::string& path) {
  if (path.empty()) return std::string();
  return ReadFileToString(path);
}

std::string Token() {
  TokenHolder& h = Holder();
  absl::MutexLock lock(&h.mu);
  return h.token;
}

bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

class TokenInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit TokenInterceptor(std::string token) : token_(std::move(token)) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->insert({kClusterTokenMetadata, token_});
    }
    methods->Proceed();
  }

 private:
  const std::string token_;
};

class TokenInterceptorFactory final : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit TokenInterceptorFactory(std::string token) : token_(std::move(token)) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo*) override {
    return new TokenInterceptor(token_);
  }

 private:
  const std::string token_;
};

}  // namespace

absl::Status ConfigureInternalPlane(const InternalPlaneOptions& options) {
  std::string token = options.cluster_token;
  if (!options.cluster_token_file.empty()) {
    absl::StatusOr<std::string> text = ReadFileToString(options.cluster_token_file);
    if (!text.ok()) return text.status();
    const std::vector<absl::string_view> lines = absl::StrSplit(*text, '\n');
    token = std::string(absl::StripAsciiWhitespace(lines.front()));
    if (token.empty()) {
      return absl::InvalidArgumentError(options.cluster_token_file +
                                        ": the cluster token is empty");
    }
  }
  for (char c : token) {
    if (c < 0x21 || c > 0x7e) {
      return absl::InvalidArgumentError("the cluster token must be printable ASCII without spaces");
    }
  }
  if (options.tls_cert_file.empty() != options.tls_key_file.empty()) {
    return absl::InvalidArgumentError("--tls_cert and --tls_key go together");
  }
  if (!options.tls_ca_file.empty() && options.tls_cert_file.empty()) {
    return absl::InvalidArgumentError("--tls_ca needs --tls_cert and --tls_key (mutual TLS)");
  }
  absl::StatusOr<std::string> cert = ReadPem(options.tls_cert_file);
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = ReadPem(options.tls_key_file);
  if (!key.ok()) return key.status();
  absl::StatusOr<std::string> ca = ReadPem(options.tls_ca_file);
  if (!ca.ok()) return ca.status();
  TokenHolder& h = Holder();
  absl::MutexLock lock(&h.mu);
  h.token = std::move(token);
  h.files = options;
  h.files.cluster_token.clear();
  h.cert = *std::move(cert);
  h.key = *std::move(key);
  h.ca = *std::move(ca);
  return absl::OkStatus();
}

std::shared_ptr<grpc::ServerCredentials> InternalServerCredentials() {
  const Pems p = LoadedPems();
  if (p.cert.empty()) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions o(
      p.ca.empty() ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
                   : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  o.pem_root_certs = p.ca;
  o.pem_key_cert_pairs.push_back({p.key, p.cert});
  return grpc::SslServerCredentials(o);
}

std::shared_ptr<grpc::ServerCredentials> PublicServerCredentials() {
  const Pems p = LoadedPems();
  if (p.cert.empty()) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions o(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  o.pem_key_cert_pairs.push_back({p.key, p.cert});
  return grpc::SslServerCredentials(o);
}

std::shared_ptr<grpc::ChannelCredentials> InternalChannelCredentials() {
  const Pems p = LoadedPems();
  if (p.ca.empty()) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions o;
  o.pem_root_certs = p.ca;
  o.pem_private_key = p.key;
  o.pem_cert_chain = p.cert;
  return grpc::SslCredentials(o);
}

std::string TlsCertFile() {
  TokenHolder& h = Holder();
  absl::MutexLock lock(&h.mu);
  return h.files.tls_cert_file;
}

std::string TlsKeyFile() {
  TokenHolder& h = Holder();
  absl::MutexLock lock(&h.mu);
  return h.files.tls_key_file;
}

absl::Status CheckClusterToken(const grpc::ServerContextBase& ctx) {
  const std::string token = Token();
  if (token.empty()) return absl::OkStatus();
  auto it = ctx.client_metadata().find(kClusterTokenMetadata);
  if (it != ctx.client_metadata().end() &&
      ConstantTimeEquals(absl::string_view(it->second.data(), it->second.size()), token)) {
    return absl::OkStatus();
  }
  return absl::UnauthenticatedError("this internal service needs the cluster token");
}

grpc::ServerUnaryReactor* RefuseUnlessCluster(grpc::CallbackServerContext* ctx) {
  absl::Status s = CheckClusterToken(*ctx);
  if (s.ok()) return nullptr;
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(grpc::Status(grpc::StatusCode::UNAUTHENTICATED, std::string(s.message())));
  return reactor;
}

std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>>
InternalClientInterceptors() {
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> out;
  std::string token = Token();
  if (!token.empty()) out.push_back(std::make_unique<TokenInterceptorFactory>(std::move(token)));
  return out;
}

}  // namespace mmserve
