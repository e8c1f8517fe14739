// An elastic instance's elastic endpoint: the UCX boards through
// which the other members of its groups reach it, and the opaque blob that
// carries them in InstanceInfo.elastic_endpoint and ElasticMember.endpoint.
//
//   ASSIGN_OR_RETURN(auto elastic, ElasticInstance::Create(*ctx, options, handler));
//   info.set_elastic_endpoint(elastic->endpoint());          // at registration
//   ASSIGN_OR_RETURN(ElasticEndpoint peer, DecodeElasticEndpoint(member.endpoint()));
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
// Thread-safety: the functions are; ElasticInstance as its members say.
#ifndef MMSERVE_TRANSFER_ELASTIC_ENDPOINT_H_
#define MMSERVE_TRANSFER_ELASTIC_ENDPOINT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "transfer/elastic_span_attention.h"
#include "transfer/peer_liveness.h"
#include "transfer/ucx_context.h"
#include "transfer/ucx_notice_board.h"

namespace mmserve::transfer {

struct ElasticEndpoint {
  uint32_t max_prompt_tokens = 0;
  uint32_t kv_width = 0;
  uint32_t max_members = 0;
  // The instance's process; Decode copies it into the three targets.
  ProcessIdentity process;
  NoticeBoardTarget exchange;    // the K/V exchange board
  NoticeBoardTarget span_inbox;  // the span server's inbox (as a holder)
  NoticeBoardTarget span_reply;  // the span client's reply board (as a master)
};

inline constexpr uint32_t kElasticEndpointMagic = 0x50534d45;
inline constexpr uint16_t kElasticEndpointVersion = 2;

std::string EncodeElasticEndpoint(const ElasticEndpoint& endpoint);
[[nodiscard]] absl::StatusOr<ElasticEndpoint> DecodeElasticEndpoint(std::string_view blob);

// The boards of one elastic instance, created at its start and kept for its
// life: the K/V exchange board (2 slots x max_prompt_tokens x K and V of one
// layer), the span server (holder side, one inbox lane per member index)
// and the span client (master side, one reply slot per member index).
class ElasticInstance {
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
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<ElasticInstance>> Create(
      UcxContext& context, const Options& options, ElasticSpanServer::Handler handler);

  const Options& options() const { return options_; }
  // The blob for the registration.
  const std::string& endpoint() const { return endpoint_; }
  // One group at a time uses the board and the client (the caller's
  // serialization); the server answers on its own thread.
  UcxNoticeBoard& exchange_board() { return *board_; }
  ElasticSpanServer& span_server() { return *server_; }
  UcxSpanPeers& span_client() { return *client_; }

 private:
  explicit ElasticInstance(const Options& options) : options_(options) {}

  const Options options_;
  std::unique_ptr<UcxNoticeBoard> board_;
  std::unique_ptr<UcxSpanPeers> client_;
  std::unique_ptr<ElasticSpanServer> server_;  // last: its thread stops first
  std::string endpoint_;
};

}  // namespace mmserve::transfer

#endif  // MMSERVE_TRANSFER_ELASTIC_ENDPOINT_H_
