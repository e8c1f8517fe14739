// router: the public entry point. Serves mmserve.v1.Inference (gRPC) and the
// OpenAI-compatible HTTP API, places every request on encoder and language
// instances (registered through Registry, or given by flags), and streams
// tokens back.
//
//   bazel run --config=opt //router:router -- --model_dir=models/shapes-demo
//       --port=50051 --http_port=8000
//
// Reads only the model's configs (config.json, preprocessor_config.json,
// generation_config.json): enough to validate requests and pre-size images.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/event_loop.h"
#include "common/file.h"
#include "common/flag_aliases.h"
#include "common/grpc_server.h"
#include "common/internal_plane.h"
#include "common/internal_plane_flags.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "common/service_process.h"
#include "common/status_macros.h"
#include "router/elastic_pool.h"
#include "router/elastic_step_models.h"
#include "router/generate_call.h"
#include "router/http_frontend.h"
#include "router/input_limits.h"
#include "router/instance_table.h"
#include "router/request_fetch.h"
#include "router/router_service.h"

ABSL_FLAG(std::string, model_dir, "", "the served model's directory (configs are read)");
ABSL_FLAG(std::string, model_id, "", "id clients use (default: the directory's name)");
ABSL_FLAG(std::string, host, "127.0.0.1", "address to listen on");
ABSL_FLAG(int, port, 50051, "gRPC port (public API and Registry)");
ABSL_FLAG(int, http_port, 8000, "OpenAI-compatible HTTP port (-1: off, 0: pick one)");
ABSL_FLAG(int, http_threads, 256,
          "HTTP requests served at once (a streaming response holds its thread until it ends; "
          "later requests wait for one)");
ABSL_FLAG(int, metrics_port, 0, "Prometheus /metrics port (0: pick one; -1: off)");
ABSL_FLAG(std::vector<std::string>, encoders, {},
          "static encoders as id=host:port (in addition to registered ones)");
ABSL_FLAG(std::vector<std::string>, languages, {},
          "static language instances (role both) as id=host:port");
ABSL_FLAG(bool, presize, true,
          "read image headers and send exact token counts (off: the resume path sizes them)");
ABSL_FLAG(int, max_images, 16, "images per request");
ABSL_FLAG(int, encoder_saturation, 32,
          "queued images at which an image's affinity encoder yields to the least loaded");
ABSL_FLAG(int, max_image_mb, 20, "bytes per image, MiB");
ABSL_FLAG(int64_t, max_video_bytes, int64_t{64} << 20,
          "bytes per video (a file, or a frame list's frames together)");
ABSL_FLAG(double, max_video_seconds, 600, "longest video, by its container header");
ABSL_FLAG(int64_t, max_video_frames, 36000, "most frames in a video's container or frame list");
ABSL_FLAG(int, max_model_len, 0, "context length clients are held to (0: the model's, <= 8192)");
ABSL_FLAG(int, poll_ms, 250, "instance health poll interval");
ABSL_FLAG(int, poll_timeout_ms, 500, "one health poll's deadline");
ABSL_FLAG(int, down_after, 2, "failed polls in a row that take an instance out of placement");
ABSL_FLAG(int, heartbeat_timeout_ms, 3000,
          "a registered instance whose heartbeats stop this long leaves placement");
ABSL_FLAG(double, prefix_weight, 1.0,
          "what a prompt token an instance holds cached weighs against a token of its load "
          "when placing (docs/routing.md); 0: place by load only");
ABSL_FLAG(int, drain_seconds, 10, "on SIGTERM, how long running calls may take");
ABSL_FLAG(std::vector<std::string>, api_key, {},
          "API keys the public API requires (Authorization: Bearer); none: open");
ABSL_FLAG(std::string, api_key_file, "", "a file of API keys, one a line");
ABSL_FLAG(bool, open_health, true, "HTTP GET /health answers without an API key");
ABSL_FLAG(int, max_calls_per_client, 0,
          "concurrent calls one client (API key, else host) may run; more get 429 / "
          "RESOURCE_EXHAUSTED (0: no cap)");
ABSL_FLAG(int, max_request_mb, 64, "largest HTTP body and gRPC request message, MiB");
ABSL_FLAG(int64_t, max_prompt_bytes, 0,
          "prompt text bytes refused before tokenizing (0: from tokenizer.json and the context; "
          "-1: off)");
ABSL_FLAG(int, migration_limit, 1,
          "times a request's stream moves to another role-both language instance after the one "
          "generating it is lost (0: the request ends UNAVAILABLE)");
ABSL_FLAG(bool, skip_cached_images, true,
          "send no encoder an image of a call placed on a language instance (P/D: the prefill "
          "instance) whose prefix index entry holds the image's message; it falls back to an "
          "encoder when the KV was evicted (docs/routing.md)");
ABSL_FLAG(bool, allow_remote_media, false,
          "fetch http(s) image_url / video_url (and Image.url / Video.url) media; off: such a URL "
          "is refused with 400 / INVALID_ARGUMENT (docs/calling.md#remote-media)");
ABSL_FLAG(std::string, allowed_media_domains, "",
          "hosts media may be fetched from, comma-separated: exact names or *.suffix (empty: any "
          "host whose addresses are all public)");
ABSL_FLAG(bool, allow_http_media, false, "also fetch plain http:// media URLs (else https only)");
ABSL_FLAG(int64_t, max_media_fetch_bytes, 0,
          "largest fetched image or video, bytes (0: --max_image_mb and --max_video_bytes)");
ABSL_FLAG(int, media_fetch_timeout_ms, 10000,
          "the whole fetch of a request's remote media (connect, redirects, body); slower is 400");
ABSL_FLAG(int, max_media_redirects, 3, "redirects a media fetch follows, each checked again");
ABSL_FLAG(std::string, media_fetch_allow_private_cidrs, "",
          "for tests and intranets only: address ranges (e.g. 10.0.0.0/8) media may be fetched "
          "from although they are not public");
ABSL_FLAG(std::string, media_ca_file, "",
          "PEM CA bundle that https media servers are verified against (empty: the system's)");

ABSL_FLAG(bool, elastic, false,
          "elastic sequence parallelism: pool the --role=elastic instances under the global "
          "manager (one instance or a group per request; docs/elastic.md)");
ABSL_FLAG(int, elastic_tick_ms, 20,
          "--elastic: the manager's iteration period (also on arrival and end)");
ABSL_FLAG(int, elastic_max_queue_ms, 60000,
          "--elastic: a request waiting longer for KV slots ends RESOURCE_EXHAUSTED");
ABSL_FLAG(int, elastic_max_pending, 1024,
          "--elastic: queued requests; more are refused RESOURCE_EXHAUSTED");
ABSL_FLAG(int, elastic_max_degree, 4,
          "--elastic: the largest group (with the default step models)");
ABSL_FLAG(double, elastic_max_prefill_s, 1.0,
          "--elastic: the manager's cap on a dispatch's predicted prefill time, seconds");
ABSL_FLAG(std::string, elastic_step_models, "",
          "--elastic: a file of fitted per-degree prefill step models, lines \"degree a b c\" "
          "(T = a + b S + c S^2 seconds); empty: the default (router/elastic_step_models.h)");

// The names these flags had before the feature was called elastic everywhere.
ABSL_FLAG(bool, esp, false, "deprecated: use --elastic");
ABSL_FLAG(int, esp_tick_ms, 20, "deprecated: use --elastic_tick_ms");
ABSL_FLAG(int, esp_max_queue_ms, 60000, "deprecated: use --elastic_max_queue_ms");
ABSL_FLAG(int, esp_max_pending, 1024, "deprecated: use --elastic_max_pending");
ABSL_FLAG(int, esp_max_degree, 4, "deprecated: use --elastic_max_degree");
ABSL_FLAG(double, esp_max_prefill_s, 1.0, "deprecated: use --elastic_max_prefill_s");
ABSL_FLAG(std::string, esp_step_models, "", "deprecated: use --elastic_step_models");

namespace mmserve::router {
namespace {

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "router: %s\n", s.ToString().c_str());
  return 1;
}

absl::Status AddStatic(InstanceTable& table, const std::vector<std::string>& specs,
                       iv1::InstanceRole role) {
  for (const std::string& spec : specs) {
    std::vector<std::string> parts = absl::StrSplit(spec, absl::MaxSplits('=', 1));
    if (parts.size() != 2 || parts[0].empty() || parts[1].empty()) {
      return absl::InvalidArgumentError(absl::StrCat("expected id=host:port, got \"", spec, "\""));
    }
    iv1::InstanceInfo info;
    info.set_instance_id(parts[0]);
    info.set_grpc_address(parts[1]);
    info.set_role(role);
    table.Upsert(info);
  }
  return absl::OkStatus();
}

// --max_prompt_bytes, or the bound tokenizer.json proves (router/input_limits.h).
absl::StatusOr<size_t> MaxPromptBytesFromFlags(const std::string& dir, int max_model_len) {
  const int64_t flag = absl::GetFlag(FLAGS_max_prompt_bytes);
  if (flag < 0) return 0;
  if (flag > 0) return static_cast<size_t>(flag);
  auto tokenizer = model::Tokenizer::FromFile(dir + "/tokenizer.json");
  if (absl::IsNotFound(tokenizer.status())) {
    LOG(WARNING) << "router: no tokenizer.json; prompts are not bounded before tokenizing";
    return 0;
  }
  if (!tokenizer.ok()) return tokenizer.status();
  return MaxPromptBytes(MaxTokenBytes(**tokenizer), max_model_len);
}

absl::StatusOr<RouterOptions> RouterOptionsFromFlags() {
  const std::string dir = absl::GetFlag(FLAGS_model_dir);
  ASSIGN_OR_RETURN(model::ModelConfig config, model::LoadModelConfig(dir));
  if (config.vision && !config.preprocessor) {
    return absl::InvalidArgumentError(dir + ": vision model without preprocessor_config");
  }
  RouterOptions options;
  options.model_id =
      absl::GetFlag(FLAGS_model_id).empty() ? ModelIdFromDir(dir) : absl::GetFlag(FLAGS_model_id);
  int max_len = absl::GetFlag(FLAGS_max_model_len);
  if (max_len <= 0) {
    max_len = config.text.max_position_embeddings > 0
                  ? std::min(config.text.max_position_embeddings, 8192)
                  : 8192;
  }
  options.config = std::move(config);
  options.max_model_len = max_len;
  options.presize = absl::GetFlag(FLAGS_presize);
  options.migration_limit = std::max(0, absl::GetFlag(FLAGS_migration_limit));
  options.skip_cached_images = absl::GetFlag(FLAGS_skip_cached_images);
  options.max_images = absl::GetFlag(FLAGS_max_images);
  options.encoder_saturation = absl::GetFlag(FLAGS_encoder_saturation);
  options.max_image_bytes = size_t{static_cast<size_t>(absl::GetFlag(FLAGS_max_image_mb))} << 20;
  options.max_video_bytes = static_cast<size_t>(absl::GetFlag(FLAGS_max_video_bytes));
  options.video_limits.max_bytes = absl::GetFlag(FLAGS_max_video_bytes);
  options.video_limits.max_duration_s = absl::GetFlag(FLAGS_max_video_seconds);
  options.video_limits.max_frames = absl::GetFlag(FLAGS_max_video_frames);
  ASSIGN_OR_RETURN(options.max_prompt_bytes, MaxPromptBytesFromFlags(dir, max_len));
  return options;
}

// The remote-media fetcher from the --*media* flags.
absl::StatusOr<std::shared_ptr<const MediaFetcher>> MediaFetcherFromFlags(
    const RouterOptions& router) {
  MediaFetchOptions o;
  o.enabled = absl::GetFlag(FLAGS_allow_remote_media);
  ASSIGN_OR_RETURN(o.hosts, MediaHostList::Parse(absl::GetFlag(FLAGS_allowed_media_domains)));
  o.allow_http = absl::GetFlag(FLAGS_allow_http_media);
  ASSIGN_OR_RETURN(o.trusted_ranges,
                   ParseCidrList(absl::GetFlag(FLAGS_media_fetch_allow_private_cidrs)));
  if (absl::GetFlag(FLAGS_max_media_fetch_bytes) < 0 ||
      absl::GetFlag(FLAGS_media_fetch_timeout_ms) < 1 ||
      absl::GetFlag(FLAGS_max_media_redirects) < 0) {
    return absl::InvalidArgumentError(
        "--max_media_fetch_bytes and --max_media_redirects must be >= 0, "
        "--media_fetch_timeout_ms >= 1");
  }
  o.max_bytes = static_cast<size_t>(absl::GetFlag(FLAGS_max_media_fetch_bytes));
  o.timeout = absl::Milliseconds(absl::GetFlag(FLAGS_media_fetch_timeout_ms));
  o.max_redirects = absl::GetFlag(FLAGS_max_media_redirects);
  o.ca_file = absl::GetFlag(FLAGS_media_ca_file);
  if (!o.ca_file.empty()) RETURN_IF_ERROR(ReadFileToString(o.ca_file).status());
  o.video_limits = router.video_limits;
  auto fetcher = std::make_shared<const MediaFetcher>(std::move(o));
  if (fetcher->options().enabled && !fetcher->tls_ready()) {
    return absl::InvalidArgumentError("--media_ca_file: no CA certificates could be loaded");
  }
  return fetcher;
}

absl::StatusOr<InstanceTableOptions> TableOptionsFromFlags() {
  if (absl::GetFlag(FLAGS_poll_ms) < 1 || absl::GetFlag(FLAGS_poll_timeout_ms) < 1 ||
      absl::GetFlag(FLAGS_down_after) < 1 || absl::GetFlag(FLAGS_heartbeat_timeout_ms) < 1) {
    return absl::InvalidArgumentError(
        "--poll_ms, --poll_timeout_ms, --down_after and --heartbeat_timeout_ms must be >= 1");
  }
  const double prefix_weight = absl::GetFlag(FLAGS_prefix_weight);
  if (!(prefix_weight >= 0 && prefix_weight <= 100)) {
    return absl::InvalidArgumentError("--prefix_weight must be between 0 and 100");
  }
  return InstanceTableOptions{
      .poll_interval = absl::Milliseconds(absl::GetFlag(FLAGS_poll_ms)),
      .poll_timeout = absl::Milliseconds(absl::GetFlag(FLAGS_poll_timeout_ms)),
      .down_after = absl::GetFlag(FLAGS_down_after),
      .heartbeat_timeout = absl::Milliseconds(absl::GetFlag(FLAGS_heartbeat_timeout_ms)),
      .prefix = {.weight = prefix_weight}};
}

void AddGauges(metrics::Registry& registry, InstanceTable& table, CallTracker& tracker) {
  registry.AddGaugeCallback("mmserve_router_calls_live", "Generate calls in flight.", {},
                            [&tracker] { return static_cast<double>(tracker.size()); });
  for (const auto& [role, name] :
       {std::pair{Role::kEncoder, "encoder"}, std::pair{Role::kLanguage, "language"},
        std::pair{Role::kPrefill, "prefill"}, std::pair{Role::kDecode, "decode"},
        std::pair{Role::kElastic, "elastic"}}) {
    registry.AddGaugeCallback(
        "mmserve_router_healthy_instances", "Healthy instances by role.", {{"role", name}},
        [&table, role = role] { return static_cast<double>(table.Healthy(role).size()); });
  }
}

// The internal plane's address: --internal_address, else --host with
// --port + 1 (an ephemeral port when --port is 0). Registry is never served
// on the public port.
std::string InternalAddress() {
  std::string address = InternalAddressFlag();
  if (!address.empty()) return address;
  const int port = absl::GetFlag(FLAGS_port);
  return absl::StrCat(absl::GetFlag(FLAGS_host), ":", port > 0 ? port + 1 : 0);
}

// The internal plane's server (Registry).
absl::StatusOr<std::unique_ptr<GrpcServer>> StartInternal(RegistryService& registry_service) {
  GrpcServerOptions options;
  options.health_services = {iv1::Registry::service_full_name()};
  options.credentials = InternalServerCredentials();
  ASSIGN_OR_RETURN(auto server, StartGrpcServer(InternalAddress(), {&registry_service}, options));
  server->SetServing(true);
  return server;
}

absl::StatusOr<std::unique_ptr<HttpFrontend>> StartHttp(RouterContext& context,
                                                        CallTracker& tracker) {
  if (absl::GetFlag(FLAGS_http_port) < 0) return nullptr;
  return HttpFrontend::Start(
      context, tracker,
      {.host = absl::GetFlag(FLAGS_host),
       .port = absl::GetFlag(FLAGS_http_port),
       .max_body_bytes = size_t{static_cast<size_t>(absl::GetFlag(FLAGS_max_request_mb))} << 20,
       .open_health = absl::GetFlag(FLAGS_open_health),
       .tls_cert_file = TlsCertFile(),
       .tls_key_file = TlsKeyFile(),
       .threads = absl::GetFlag(FLAGS_http_threads)});
}

// Serves until SIGTERM/SIGINT, then drains: running calls get
// --drain_seconds, the rest are cancelled.
int Serve(RouterContext& context, CallTracker& tracker, metrics::Registry& registry) {
  InferenceService inference(context, tracker);
  RegistryService registry_service(*context.instances);
  auto internal = StartInternal(registry_service);
  if (!internal.ok()) return Fail(internal.status());
  ServiceProcessOptions options{.name = "router",
                                .instance_id = context.options.model_id,
                                .host = absl::GetFlag(FLAGS_host),
                                .port = absl::GetFlag(FLAGS_port),
                                .metrics_port = absl::GetFlag(FLAGS_metrics_port)};
  options.grpc.max_receive_bytes = absl::GetFlag(FLAGS_max_request_mb) << 20;
  options.grpc.health_services = {mmserve::v1::Inference::service_full_name()};
  options.grpc.credentials = PublicServerCredentials();
  auto process = ServiceProcess::Start(std::move(options), {&inference}, registry);
  if (!process.ok()) return Fail(process.status());
  ServiceProcess& p = **process;
  auto http = StartHttp(context, tracker);
  if (!http.ok()) return Fail(http.status());
  const std::string address = InternalAddress();
  const std::string internal_field =
      absl::StrCat(" internal=", address.substr(0, address.rfind(':')), ":", (*internal)->port());
  p.Ready(absl::StrCat(context.options.model_id, " grpc=", p.advertise(),
                       " http=", *http ? (*http)->port() : -1, " metrics=", p.metrics_port(),
                       internal_field));

  p.WaitForTerminationSignal();
  p.server().SetServing(false);
  const Deadline drain = Deadline::After(absl::Seconds(absl::GetFlag(FLAGS_drain_seconds)));
  while (tracker.size() > 0 && !drain.Expired()) absl::SleepFor(absl::Milliseconds(20));
  tracker.CancelAll("the router is shutting down");
  if (*http) (*http)->Stop();
  p.server().Shutdown(absl::Seconds(1));
  (*internal)->Shutdown(absl::Seconds(1));
  return 0;
}

// --elastic's pool options.
absl::StatusOr<ElasticPoolOptions> ElasticOptionsFromFlags() {
  ElasticPoolOptions o;
  if (absl::GetFlag(FLAGS_elastic_tick_ms) < 1 || absl::GetFlag(FLAGS_elastic_max_queue_ms) < 1 ||
      absl::GetFlag(FLAGS_elastic_max_pending) < 1 || absl::GetFlag(FLAGS_elastic_max_degree) < 1) {
    return absl::InvalidArgumentError(
        "--elastic_tick_ms, --elastic_max_queue_ms, --elastic_max_pending and --elastic_max_degree "
        "must be >= 1");
  }
  if (!absl::GetFlag(FLAGS_presize)) {
    return absl::InvalidArgumentError("--elastic needs --presize (a group plan splits exact rows)");
  }
  o.tick = absl::Milliseconds(absl::GetFlag(FLAGS_elastic_tick_ms));
  o.max_queue_wait = absl::Milliseconds(absl::GetFlag(FLAGS_elastic_max_queue_ms));
  o.max_pending = static_cast<size_t>(absl::GetFlag(FLAGS_elastic_max_pending));
  o.config.max_prefill_seconds = absl::GetFlag(FLAGS_elastic_max_prefill_s);
  const std::string file = absl::GetFlag(FLAGS_elastic_step_models);
  if (file.empty()) {
    o.config.per_degree = DefaultElasticStepModels(absl::GetFlag(FLAGS_elastic_max_degree));
  } else {
    ASSIGN_OR_RETURN(std::string text, ReadFileToString(file));
    ASSIGN_OR_RETURN(o.config.per_degree, ParseElasticStepModels(text));
  }
  return o;
}

// Runs the router, with the elastic manager under --elastic.
int ServeWithElastic(RouterContext& context, CallTracker& tracker, metrics::Registry& registry,
                     EventLoop& loop) {
  if (!absl::GetFlag(FLAGS_elastic)) return Serve(context, tracker, registry);
  auto options = ElasticOptionsFromFlags();
  if (!options.ok()) return Fail(options.status());
  auto tokenizer = model::Tokenizer::FromFile(absl::GetFlag(FLAGS_model_dir) + "/tokenizer.json");
  if (!tokenizer.ok()) return Fail(tokenizer.status());
  ElasticPool pool(*context.instances, registry, loop, *std::move(options));
  context.elastic = &pool;
  context.tokenizer = tokenizer->get();
  pool.Start();
  const int rc = Serve(context, tracker, registry);
  pool.Stop();
  context.elastic = nullptr;
  return rc;
}

int Main() {
  BlockTerminationSignals();
  if (absl::Status s = ConfigureInternalPlaneFromFlags(); !s.ok()) return Fail(s);
  if (absl::GetFlag(FLAGS_model_dir).empty())
    return ExitWithUsage("router", "--model_dir is required");
  if (absl::GetFlag(FLAGS_http_threads) < 1) {
    return ExitWithUsage("router", "--http_threads must be at least 1");
  }
  auto options = RouterOptionsFromFlags();
  if (!options.ok()) return Fail(options.status());
  auto media = MediaFetcherFromFlags(*options);
  if (!media.ok()) return Fail(media.status());
  auto table_options = TableOptionsFromFlags();
  if (!table_options.ok()) return Fail(table_options.status());
  table_options->pool_elastic = absl::GetFlag(FLAGS_elastic);
  // The router's periodic work (the elastic pool's iterations) runs here.
  EventLoop loop({.name = "router"});
  InstanceTable table(*table_options);
  if (auto s = AddStatic(table, absl::GetFlag(FLAGS_encoders), iv1::INSTANCE_ROLE_ENCODER);
      !s.ok()) {
    return Fail(s);
  }
  if (auto s = AddStatic(table, absl::GetFlag(FLAGS_languages), iv1::INSTANCE_ROLE_BOTH); !s.ok()) {
    return Fail(s);
  }
  auto keys = LoadApiKeys(absl::GetFlag(FLAGS_api_key), absl::GetFlag(FLAGS_api_key_file));
  if (!keys.ok()) return Fail(keys.status());
  PublicAccess access({.api_keys = *std::move(keys),
                       .max_calls_per_client = absl::GetFlag(FLAGS_max_calls_per_client)});
  metrics::Registry registry;
  const CallMetrics call_metrics(registry);
  const MediaFetchMetrics media_metrics(registry);
  RouterContext context{.options = *std::move(options),
                        .instances = &table,
                        .metrics = &call_metrics,
                        .access = &access,
                        .media = *std::move(media),
                        .media_metrics = &media_metrics};
  CallTracker tracker;
  table.SetDownListener([&tracker](const std::string& id) { tracker.OnInstanceDown(id); });
  AddGauges(registry, table, tracker);
  table.Start(loop);
  const int rc = ServeWithElastic(context, tracker, registry, loop);
  table.Stop();
  LOG(INFO) << "router: stopped";
  return rc;
}

}  // namespace
}  // namespace mmserve::router

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (absl::Status s = mmserve::ApplyFlagAliases({{"esp", "elastic"},
                                                  {"esp_tick_ms", "elastic_tick_ms"},
                                                  {"esp_max_queue_ms", "elastic_max_queue_ms"},
                                                  {"esp_max_pending", "elastic_max_pending"},
                                                  {"esp_max_degree", "elastic_max_degree"},
                                                  {"esp_max_prefill_s", "elastic_max_prefill_s"},
                                                  {"esp_step_models", "elastic_step_models"}});
      !s.ok()) {
    return mmserve::router::Fail(s);
  }
  return mmserve::router::Main();
}
