// cli: a command-line client of mmserve.v1.Inference.
//
//   bazel run //client:cli -- --address=localhost:50051
//       --image=$PWD/tools/demo/eval_set/0000.png --prompt="Where is the red square?"
//   top left
//
// Streams the answer's text to stdout as it arrives and prints the final
// usage and timing to stderr; --json prints one JSON object per
// GenerateResponse instead. --image and --stop may be repeated and may hold
// commas. On an error it prints the gRPC code and message to stderr and
// exits with the code's number (e.g. 3 for INVALID_ARGUMENT, 14 for
// UNAVAILABLE).
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "client/generate_request.h"
#include "client/grpc_calls.h"
#include "client/repeated_flag.h"
#include "common/file.h"

ABSL_FLAG(std::string, address, "localhost:50051", "the router's gRPC address, host:port");
ABSL_FLAG(std::string, prompt, "", "the user's message (the whole prompt with --raw)");
ABSL_FLAG(std::string, system, "", "a system message sent before the user's");
ABSL_FLAG(std::string, model, "", "model id (default: the only served model)");
ABSL_FLAG(std::string, request_id, "", "request id (default: the router assigns one)");
ABSL_FLAG(double, video_fps, 0, "--video frames sampled per second (0: every frame)");
ABSL_FLAG(uint32_t, video_max_frames, 0, "with --video_fps, at most this many frames (0: 768)");
ABSL_FLAG(bool, raw, false, "send --prompt as a RawPrompt, without the chat template");
ABSL_FLAG(std::optional<double>, temperature, std::nullopt, "0 = greedy (default: the model's)");
ABSL_FLAG(std::optional<double>, top_p, std::nullopt, "nucleus sampling, (0, 1]");
ABSL_FLAG(std::optional<int>, top_k, std::nullopt, "keep the k most likely tokens; 0 = off");
ABSL_FLAG(std::optional<double>, min_p, std::nullopt, "drop tokens below min_p x the top one");
ABSL_FLAG(std::optional<uint64_t>, seed, std::nullopt, "sampler seed (default: random)");
ABSL_FLAG(std::optional<uint32_t>, max_tokens, std::nullopt, "most tokens to generate");
ABSL_FLAG(bool, ignore_eos, false, "keep generating past end-of-sequence tokens");
ABSL_FLAG(std::optional<uint32_t>, logprobs, std::nullopt,
          "return the sampled token's logprob and this many alternatives (0..20); see --json");
ABSL_FLAG(uint32_t, min_tokens, 0, "generate at least this many tokens");
ABSL_FLAG(std::optional<bool>, skip_special_tokens, std::nullopt,
          "omit special tokens from the text (server default: true)");
ABSL_FLAG(int64_t, deadline_ms, 0, "call deadline in milliseconds; 0 = none");
ABSL_FLAG(bool, json, false, "print each GenerateResponse as one line of JSON");
ABSL_FLAG(bool, token_ids, false, "ask for token ids with each response (shown with --json)");
ABSL_FLAG(bool, list_models, false, "list the served models and exit");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA that signed the router's certificate: call it over TLS (default: plaintext)");
ABSL_FLAG(std::string, api_key, "",
          "the router's API key (sent as authorization: Bearer); default: $MMSERVE_API_KEY");

namespace mmserve::client {
namespace {

// --api_key, else $MMSERVE_API_KEY (so the key need not be on the command line).
std::string ApiKey() {
  if (!absl::GetFlag(FLAGS_api_key).empty()) return absl::GetFlag(FLAGS_api_key);
  const char* env = std::getenv("MMSERVE_API_KEY");
  return env != nullptr ? env : "";
}

int Fail(const absl::Status& status) {
  std::cerr << "error: " << absl::StatusCodeToString(status.code()) << ": " << status.message()
            << "\n";
  int code = static_cast<int>(status.code());
  return code == 0 ? 1 : code;
}

mmserve::v1::SamplingParams SamplingFromFlags(const std::vector<std::string>& stops) {
  mmserve::v1::SamplingParams s;
  if (auto v = absl::GetFlag(FLAGS_temperature)) s.set_temperature(static_cast<float>(*v));
  if (auto v = absl::GetFlag(FLAGS_top_p)) s.set_top_p(static_cast<float>(*v));
  if (auto v = absl::GetFlag(FLAGS_top_k)) s.set_top_k(*v);
  if (auto v = absl::GetFlag(FLAGS_min_p)) s.set_min_p(static_cast<float>(*v));
  if (auto v = absl::GetFlag(FLAGS_seed)) s.set_seed(*v);
  if (auto v = absl::GetFlag(FLAGS_max_tokens)) s.set_max_tokens(*v);
  if (auto v = absl::GetFlag(FLAGS_logprobs)) s.set_logprobs(*v);
  if (auto v = absl::GetFlag(FLAGS_skip_special_tokens)) s.set_skip_special_tokens(*v);
  s.set_ignore_eos(absl::GetFlag(FLAGS_ignore_eos));
  s.set_min_tokens(absl::GetFlag(FLAGS_min_tokens));
  for (const std::string& stop : stops) s.add_stop(stop);
  return s;
}

// A stub of --address, over TLS when --tls_ca names the CA.
absl::StatusOr<std::unique_ptr<mmserve::v1::Inference::Stub>> MakeStub() {
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  if (!absl::GetFlag(FLAGS_tls_ca).empty()) {
    absl::StatusOr<std::string> ca = ReadFileToString(absl::GetFlag(FLAGS_tls_ca));
    if (!ca.ok()) return ca.status();
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = *ca;
    credentials = grpc::SslCredentials(ssl);
  }
  return mmserve::v1::Inference::NewStub(
      grpc::CreateChannel(absl::GetFlag(FLAGS_address), credentials));
}

// --list_models: one line per model (or the JSON response).
int PrintModels(mmserve::v1::Inference::Stub& stub, absl::Duration deadline) {
  absl::StatusOr<mmserve::v1::ListModelsResponse> models = ListModels(stub, deadline, ApiKey());
  if (!models.ok()) return Fail(models.status());
  if (absl::GetFlag(FLAGS_json)) {
    std::cout << JsonLine(*models) << "\n";
  } else {
    for (const mmserve::v1::ModelCard& m : models->models()) {
      std::cout << m.id() << "\tmax_model_len=" << m.max_model_len()
                << " vision=" << (m.vision() ? "yes" : "no")
                << " encoders=" << m.encoder_instances() << " prefill=" << m.prefill_instances()
                << " decode=" << m.decode_instances() << "\n";
    }
  }
  return 0;
}

int Run(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "cli --address=host:port [--image=PATH]... --prompt=TEXT [sampling flags]\n"
      "  --image=PATH  an image file; repeat for several (paths may hold commas)\n"
      "  --video=PATH  a video file (mp4, webm, ...); repeat for several\n"
      "  --stop=TEXT   a stop string; repeat for several");
  std::vector<char*> args(argv, argv + argc);
  absl::StatusOr<std::vector<std::string>> images = ExtractRepeatedFlag(&args, "image");
  if (!images.ok()) return Fail(images.status());
  absl::StatusOr<std::vector<std::string>> videos = ExtractRepeatedFlag(&args, "video");
  if (!videos.ok()) return Fail(videos.status());
  absl::StatusOr<std::vector<std::string>> stops = ExtractRepeatedFlag(&args, "stop");
  if (!stops.ok()) return Fail(stops.status());
  std::vector<char*> positional =
      absl::ParseCommandLine(static_cast<int>(args.size()), args.data());
  if (positional.size() > 1) {
    return Fail(absl::InvalidArgumentError(std::string("unexpected argument: ") + positional[1] +
                                           " (use --prompt=...)"));
  }

  int64_t deadline_ms = absl::GetFlag(FLAGS_deadline_ms);
  absl::Duration deadline =
      deadline_ms > 0 ? absl::Milliseconds(deadline_ms) : absl::InfiniteDuration();
  absl::StatusOr<std::unique_ptr<mmserve::v1::Inference::Stub>> stub = MakeStub();
  if (!stub.ok()) return Fail(stub.status());

  if (absl::GetFlag(FLAGS_list_models)) return PrintModels(**stub, deadline);

  GenerateOptions options;
  options.model = absl::GetFlag(FLAGS_model);
  options.request_id = absl::GetFlag(FLAGS_request_id);
  options.prompt = absl::GetFlag(FLAGS_prompt);
  options.image_paths = *images;
  options.video_paths = *videos;
  options.video_fps = absl::GetFlag(FLAGS_video_fps);
  options.video_max_frames = absl::GetFlag(FLAGS_video_max_frames);
  options.system = absl::GetFlag(FLAGS_system);
  options.raw = absl::GetFlag(FLAGS_raw);
  options.sampling = SamplingFromFlags(*stops);
  options.include_token_ids = absl::GetFlag(FLAGS_token_ids);
  absl::StatusOr<mmserve::v1::GenerateRequest> request = BuildGenerateRequest(options);
  if (!request.ok()) return Fail(request.status());

  const bool json = absl::GetFlag(FLAGS_json);
  mmserve::v1::GenerateResponse last;
  bool wrote_text = false;
  absl::Status status = StreamGenerate(
      **stub, *request, deadline,
      [&](const mmserve::v1::GenerateResponse& r) {
        if (json) {
          std::cout << JsonLine(r) << std::endl;  // flushed: one object per line as it comes
        } else if (!r.text().empty()) {
          std::cout << r.text() << std::flush;
          wrote_text = true;
        }
        if (r.finish_reason() != mmserve::v1::FINISH_REASON_UNSPECIFIED) last = r;
      },
      ApiKey());
  if (!json && wrote_text) std::cout << std::endl;
  if (!status.ok()) return Fail(status);
  if (!json) std::cerr << FinalSummary(last) << "\n";
  return 0;
}

}  // namespace
}  // namespace mmserve::client

int main(int argc, char** argv) { return mmserve::client::Run(argc, argv); }
