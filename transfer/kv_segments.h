// What a KV hand-off moves, as byte ranges: each a run of the source cache
// that lands contiguously in the target cache, in hand-off order (for each
// layer its keys then its values, blocks in list order), so folding
// Crc32cExtend over the segments' source bytes gives KvBlocksCrc.
//
//   std::vector<KvSegment> segs = PlanKvSegments(src_shape, dst_shape, src, dst, first_head);
//   for (const auto& chunk : ChunkKvSegments(segs, 1 << 20)) ...  // ~1 MiB jobs
//
// A run of blocks consecutive on both sides in one layer's K or V plane is one
// segment (blocks of a plane are adjacent in memory); a head slice (a
// tensor-parallel target with fewer KV heads, or a tensor-parallel source
// rank's heads into a target with more) is one segment per token.
// Pure functions, thread-safe. Arguments must have passed ValidateKvHandoff.
#ifndef MMSERVE_TRANSFER_KV_SEGMENTS_H_
#define MMSERVE_TRANSFER_KV_SEGMENTS_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "model/kv_cache.h"

namespace mmserve::transfer {

struct KvSegment {
  uint64_t src = 0;    // byte offset in the source cache
  uint64_t dst = 0;    // byte offset in the target cache
  uint64_t bytes = 0;  // > 0
};

// Which KV heads of each token move: `count` heads from source head
// `src_first` to target head `dst_first`. Both caches hold whole tokens of
// their own heads; when both hold `count` heads whole blocks move.
struct KvHeadSlice {
  int64_t src_first = 0;
  int64_t dst_first = 0;
  int64_t count = 0;
};

// Layers [first_layer, first_layer + num_layers) only (num_layers < 0: to
// the last layer).
std::vector<KvSegment> PlanKvSegments(const model::KvCacheShape& source,
                                      const model::KvCacheShape& target,
                                      const std::vector<int32_t>& src,
                                      const std::vector<int32_t>& dst, KvHeadSlice heads,
                                      int64_t first_layer = 0, int64_t num_layers = -1);
// The target's heads, from source head `first_head` (a target with as many or
// fewer heads than the source).
std::vector<KvSegment> PlanKvSegments(const model::KvCacheShape& source,
                                      const model::KvCacheShape& target,
                                      const std::vector<int32_t>& src,
                                      const std::vector<int32_t>& dst, int64_t first_head,
                                      int64_t first_layer = 0, int64_t num_layers = -1);

// `segments` in order, cut into consecutive groups of about `chunk_bytes`
// each: a segment longer than that is split, shorter ones share a group.
std::vector<std::vector<KvSegment>> ChunkKvSegments(const std::vector<KvSegment>& segments,
                                                    uint64_t chunk_bytes);

// Copies each segment from `src_base` to `dst_base` and returns the CRC32C of
// the source bytes in segment order, reading them once (Crc32cCopy). `jobs`
// (ChunkKvSegments) are taken in turn by the calling thread and `helper`'s,
// so two cores copy; returns when both are done.
class ChecksumWorker;
uint32_t CopyKvSegments(const std::vector<std::vector<KvSegment>>& jobs, const uint8_t* src_base,
                        uint8_t* dst_base, ChecksumWorker& helper);

// The same in two steps: Start hands the jobs to `helper`'s thread, which
// begins at once (after the jobs queued on it before); Finish takes jobs on
// the calling thread too until none is left, waits for the helper and
// returns the CRC32C. Copies of several helpers overlap this way (one
// thread each, and the caller's in Finish). Finish once, on one thread; the
// bytes must stay valid until it returns.
class KvSegmentCopy {
 public:
  static std::shared_ptr<KvSegmentCopy> Start(std::vector<std::vector<KvSegment>> jobs,
                                              const uint8_t* src_base, uint8_t* dst_base,
                                              ChecksumWorker& helper);
  uint32_t Finish();
  // Before Finish: the helper has copied every job (Finish returns at
  // once). Thread-safe.
  bool helped() const;

 private:
  KvSegmentCopy(std::vector<std::vector<KvSegment>> jobs, const uint8_t* src_base,
                uint8_t* dst_base);
  void Work();  // takes jobs until none is left (thread-safe)

  const std::vector<std::vector<KvSegment>> jobs_;
  const uint8_t* const src_base_;
  uint8_t* const dst_base_;
  std::vector<uint32_t> crcs_;     // by job, each written by the thread that took it
  std::vector<uint64_t> lengths_;  // by job
  std::atomic<size_t> next_{0};
  mutable absl::Mutex mu_;
  bool helped_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace mmserve::transfer

#endif  // MMSERVE_TRANSFER_KV_SEGMENTS_H_
