// An elastic instance's ESP endpoint: the UCX boards through
// which the other members of its groups reach it, and the opaque blob that
// carries them in InstanceInfo.esp_endpoint and EspMember.endpoint.
//
//   ASSIGN_OR_RETURN(auto esp, EspInstance::Create(*ctx, options, handler));
//   info.set_esp_endpoint(esp->endpoint());          // at registration
//   ASSIGN_OR_RETURN(EspEndpoint peer, DecodeEspEndpoint(member.endpoint()));
//
// The blob, version 2 (integers little-endian; every length is checked
// against what is left, and the blob must end exactly after the last board):
//
//   u32 magic 0x50534d45 ("EMSP")   u16 version (2)   u16 boards (3)
//   u32 max_prompt_tokens           the exchange board's prompt cap
//   u32 kv_width                    floats of one token's K (or V), a layer
//   u32 max_members                 the largest group it joins
//   u32 pid, u64 pid_namespace, u64 start_ticks, u32 n, n bytes of boot id
//                                   the instance's process (peer_liveness.h;
//                                   all zero and n = 0: unknown), which a
//                                   member on the same host checks while it
//                                   waits on the instance (shm reports no
//                                   dead peer); version 2 added it
//   3 x { u64 base_address, u64 notice_offset, u32 n, n bytes of UCX
//         worker address, u32 m, m bytes of packed rkey }
//         boards in order: K/V exchange, span inbox (holder), span reply
//         (master)
//
// A malformed blob is InvalidArgument, never a crash; an unknown version
// too (a reader refuses what it cannot read).
// Thread-safety: the functions are; EspInstance as its members say.
#ifndef MMSERVE_TRANSFER_ESP_ENDPOINT_H_
#define MMSERVE_TRANSFER_ESP_ENDPOINT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "transfer/esp_span_attention.h"
#include "transfer/peer_liveness.h"
#include "transfer/ucx_context.h"
#include "transfer/ucx_notice_board.h"

namespace mmserve::transfer {

struct EspEndpoint {
  uint32_t max_prompt_tokens = 0;
  uint32_t kv_width = 0;
  uint32_t max_members = 0;
  // The instance's process; Decode copies it into the three targets.
  ProcessIdentity process;
  NoticeBoardTarget exchange;    // the K/V exchange board
  NoticeBoardTarget span_inbox;  // the span server's inbox (as a holder)
  NoticeBoardTarget span_reply;  // the span client's reply board (as a master)
};

inline constexpr uint32_t kEspEndpointMagic = 0x50534d45;
inline constexpr uint16_t kEspEndpointVersion = 2;

std::string EncodeEspEndpoint(const EspEndpoint& endpoint);
[[nodiscard]] absl::StatusOr<EspEndpoint> DecodeEspEndpoint(std::string_view blob);

// The boards of one elastic instance, created at its start and kept for its
// life: the K/V exchange board (2 slots x max_prompt_tokens x K and V of one
// layer), the span server (holder side, one inbox lane per member index)
// and the span client (master side, one reply slot per member index).
class EspInstance {
 public:
  struct Options {
    std::string name;  // UCX worker names derive from it
    uint32_t max_prompt_tokens = 0;
    uint32_t kv_width = 0;  // kv_heads * head_dim
    int64_t q_width = 0;    // heads * head_dim
    int64_t heads = 0;
    uint32_t max_members = 8;
    absl::Duration query_timeout = absl::Seconds(2);  // one span query
  };
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<EspInstance>> Create(
      UcxContext& context, const Options& options, EspSpanServer::Handler handler);

  const Options& options() const { return options_; }
  // The blob for the registration.
  const std::string& endpoint() const { return endpoint_; }
  // One group at a time uses the board and the client (the caller's
  // serialization); the server answers on its own thread.
  UcxNoticeBoard& exchange_board() { return *board_; }
  EspSpanServer& span_server() { return *server_; }
  UcxSpanPeers& span_client() { return *client_; }

 private:
  explicit EspInstance(const Options& options) : options_(options) {}

  const Options options_;
  std::unique_ptr<UcxNoticeBoard> board_;
  std::unique_ptr<UcxSpanPeers> client_;
  std::unique_ptr<EspSpanServer> server_;  // last: its thread stops first
  std::string endpoint_;
};

}  // namespace mmserve::transfer

#endif  // MMSERVE_TRANSFER_ESP_ENDPOINT_H_
