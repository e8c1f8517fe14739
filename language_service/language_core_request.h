// The request and connection records of LanguageCore, shared by the files
// that implement it (language_core.cc: admission, the loop and the engine's
// events; language_core_images.cc: embeddings from encoders;
// language_core_kv.cc: the prefill and decode roles' KV hand-off). Only
// those files include this header; everything in it is touched on the
// core's loop thread.
#ifndef MMSERVE_LANGUAGE_SERVICE_LANGUAGE_CORE_REQUEST_H_
#define MMSERVE_LANGUAGE_SERVICE_LANGUAGE_CORE_REQUEST_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "common/clock.h"
#include "common/event_loop.h"
#include "language_service/language_core.h"

namespace mmserve::language {

struct LanguageCore::Connection {
  std::string address;
  enum class State { kNone, kConnecting, kConnected } state = State::kNone;
  // (request id, image) waiting for the connection.
  std::vector<std::pair<std::string, size_t>> waiting;
};

// A request's phase on this instance. Every change goes through
// LanguageCore::Advance (language_core.cc), which checks it against this
// table; a request leaves every phase by End (removed, sink's on_end once).
//
//   from              to            event
//   (Submit)          kGathering    the request is queued; images on their way
//   (RegisterDecode)  kRegistered   role decode: the Decode stream is held
//   kGathering        kInEngine     kImagesArrived: the engine took it
//   kRegistered       kAwaitingKv   kKvReserved: AllocateKv reserved its blocks
//   kAwaitingKv       kInEngine     kKvCommitted: CommitKv checked the blocks
//   kInEngine         kHandingOff   kPromptDone: role prefill, the prompt's KV
//                                   goes to the decode instance
//   kAwaitingKv,      kAborting     kAbortAsked: the engine's final event for
//   kInEngine                       it ends the request
enum class RequestPhase : uint8_t {
  kGathering,
  kRegistered,
  kAwaitingKv,
  kInEngine,
  kHandingOff,
  kAborting
};
enum class RequestEvent : uint8_t {
  kImagesArrived,
  kKvReserved,
  kKvCommitted,
  kPromptDone,
  kAbortAsked
};

// The engine holds the request (its KV, or a reservation of it).
inline bool InEngine(RequestPhase p) { return p >= RequestPhase::kAwaitingKv; }
const char* RequestPhaseName(RequestPhase p);

struct LanguageCore::Request {
  std::string id;
  worker::EngineRequest engine_request;  // prompt, sampling; embeddings filled on arrival
  RequestSink sink;
  enum class ImageState { kConnecting, kReceiving, kArrived, kLost };
  struct Image {
    v1::PromptImage meta;
    ImageState state = ImageState::kConnecting;
    Stopwatch started;
    // Control round trips its arrival waited for: a Connect to the encoder,
    // then one per chunk (init or resume, answered by the chunk).
    int round_trips = 0;
    worker::ImageEmbedding embedding;
    // MmHandoff::kAsync: the blocks embedding.shared_values points into,
    // held until the request ends.
    std::optional<transfer::ReceivedImage> held;
  };
  std::vector<Image> images;
  RequestPhase phase = RequestPhase::kGathering;
  bool include_usage = true;
  uint32_t image_tokens = 0;
  Stopwatch since_submit;
  double multimodal_ms = 0;
  double admitted_at_s = -1;
  double last_token_at_s = -1;
  double first_token_at_s = -1;
  std::optional<Deadline> lost_deadline;
  // Role prefill: where the KV goes, and the last token sampled.
  v1::DecodeTarget decode;
  int32_t last_token = -1;
  // Role decode: the reserved blocks (after AllocateKv) and the prompt's
  // M-RoPE delta, which the KvCommit must repeat.
  std::vector<int32_t> kv_blocks;
  int32_t mrope_position_delta = 0;
  // Role elastic: the group plan of an EspPrefill and this member's index.
  std::unique_ptr<v1::EspPlan> esp_plan;
  int esp_member = 0;

  const std::string& TransferId(size_t k) const {
    return images[k].meta.transfer_id().empty() ? id : images[k].meta.transfer_id();
  }
};

// What the loop thread is told, each handled in LanguageCore::Handle.
struct LanguageCore::Message {
  struct Install {  // Submit or RegisterDecode, by the request's phase
    std::unique_ptr<Request> request;
  };
  struct Abort {
    std::string id;
    std::string reason;
  };
  struct Retry {
    v1::ImageRetry retry;
  };
  struct Connected {
    std::string encoder;
    std::string address;
    absl::Status status;
  };
  struct ImageReceived {
    std::string id;
    size_t k = 0;
    std::string transfer_id;
    absl::StatusOr<transfer::ReceivedImage> image;
  };
  struct AllocateKv {
    const v1::KvAllocateRequest* request;  // the caller's, alive until the reply
    Reply<absl::StatusOr<v1::KvAllocation>> reply;
  };
  struct CommitKv {
    const v1::KvCommit* commit;  // the caller's, alive until the reply
    Reply<absl::Status> reply;
  };
  struct HoldSpan {
    std::string id;
    int tokens = 0;
    Reply<absl::StatusOr<std::vector<int32_t>>> reply;
  };
  struct EspMove {
    const v1::EspMoveRequest* request;  // the caller's, alive until the reply
    Reply<absl::Status> reply;
  };
  struct ShutDown {};  // ends every request; the last message handled

  std::variant<Install, Abort, Retry, Connected, ImageReceived, AllocateKv, CommitKv, HoldSpan,
               EspMove, ShutDown>
      body;
};

}  // namespace mmserve::language

#endif  // MMSERVE_LANGUAGE_SERVICE_LANGUAGE_CORE_REQUEST_H_
