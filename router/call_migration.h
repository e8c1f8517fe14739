// What a colocated call keeps to move off a lost language instance
// (generate_call.h): the request it sent, with a seed, the tokens it relayed,
// the instances it lost and the streams it left behind. A resumed stream is
// the kept request with new copies of its images and the relayed tokens as
// resume_output_token_ids, so the new instance carries on where the client's
// stream stopped.
//
//   CallMigration migration(options.migration_limit);
//   migration.Keep(prefill);                    // as the stream opens
//   migration.Relayed(batch);                   // each batch relayed
//   if (migration.Leave(lost, streams) == CallMigration::Decision::kMove) ...
//   OpenStream(k, migration.Resume(copies));    // on the new placement
//
// Not thread-safe: the owning call serializes every use under its mutex.
#ifndef MMSERVE_ROUTER_CALL_MIGRATION_H_
#define MMSERVE_ROUTER_CALL_MIGRATION_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "proto/language.pb.h"

namespace mmserve::router {

class CallMigration {
 public:
  // At most `limit` moves per call (RouterOptions::migration_limit); none
  // when `limit` <= 0.
  explicit CallMigration(int limit) : limit_(limit) {}

  // The colocated stream's request: its seed filled in (the resumed stream
  // must draw from the same random stream, so a request without one gets it
  // here rather than on the instance) and a copy kept. A no-op when calls
  // do not migrate.
  void Keep(internal::v1::PrefillRequest& prefill);
  bool kept() const { return request_.has_value(); }

  // A batch relayed to the client: its tokens are not generated again; a
  // resumed stream's first tokens end `resuming`.
  void Relayed(const internal::v1::TokenBatch& batch);

  enum class Decision {
    kNo,         // nothing kept: the call does not migrate
    kOverLimit,  // it moved migration_limit times already
    kMove,       // `instance` is lost; the streams before `streams` left behind
  };
  Decision Leave(const std::string& instance, size_t streams);
  // A stream a migration left behind: its later events are ignored.
  bool Abandoned(size_t i) const { return i < live_from_; }

  // The image indices of the kept request (their copies go to the new
  // instance: a transfer has one receiver).
  std::vector<size_t> ImageIndices() const;
  // The resumed stream's request: the kept one with `images` for its images
  // and the relayed tokens to resume from.
  internal::v1::PrefillRequest Resume(std::vector<internal::v1::PromptImage> images);

  // The resumed stream has relayed no token yet: its images may still move.
  bool resuming() const { return resuming_; }
  const std::vector<std::string>& lost() const { return lost_; }
  size_t relayed() const { return relayed_.size(); }

 private:
  const int limit_;
  std::optional<internal::v1::PrefillRequest> request_;
  std::vector<uint32_t> relayed_;
  size_t live_from_ = 0;
  std::vector<std::string> lost_;
  bool resuming_ = false;
};

}  // namespace mmserve::router

#endif  // MMSERVE_ROUTER_CALL_MIGRATION_H_
