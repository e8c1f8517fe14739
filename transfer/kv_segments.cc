#include "transfer/kv_segments.h"

#include <algorithm>
#include <atomic>
#include <memory>
#include <utility>

#include "absl/synchronization/mutex.h"
#include "common/crc32c.h"
#include "transfer/checksum_worker.h"

namespace mmserve::transfer {
namespace {

uint64_t BlockBytes(const model::KvCacheShape& s) {
  return static_cast<uint64_t>(s.block_size * s.num_kv_heads * s.head_dim) * sizeof(float);
}

// Byte offset of `block` of `layer`'s keys (kv = 0) or values (kv = 1).
uint64_t BlockOffset(const model::KvCacheShape& s, int64_t layer, int kv, int64_t block) {
  return static_cast<uint64_t>((2 * layer + kv) * s.LayerPlaneFloats()) * sizeof(float) +
         block * BlockBytes(s);
}

// One plane's segments: runs of whole blocks, or per-token head slices.
void PlanePlan(const model::KvCacheShape& s, const model::KvCacheShape& t,
               const std::vector<int32_t>& src, const std::vector<int32_t>& dst,
               const KvHeadSlice& heads, int64_t layer, int kv, std::vector<KvSegment>* out) {
  const bool sliced = heads.count != s.num_kv_heads || heads.count != t.num_kv_heads;
  const uint64_t head_bytes = s.head_dim * sizeof(float);
  const uint64_t src_token = s.num_kv_heads * head_bytes;
  const uint64_t dst_token = t.num_kv_heads * head_bytes;
  const uint64_t slice_bytes = heads.count * head_bytes;
  const uint64_t src_skip = heads.src_first * head_bytes;
  const uint64_t dst_skip = heads.dst_first * head_bytes;
  for (size_t i = 0; i < src.size(); ++i) {
    const uint64_t from = BlockOffset(s, layer, kv, src[i]);
    const uint64_t to = BlockOffset(t, layer, kv, dst[i]);
    if (sliced) {
      for (int64_t k = 0; k < s.block_size; ++k) {
        out->push_back(
            {from + k * src_token + src_skip, to + k * dst_token + dst_skip, slice_bytes});
      }
      continue;
    }
    size_t run = 1;
    while (i + run < src.size() && src[i + run] == src[i] + static_cast<int32_t>(run) &&
           dst[i + run] == dst[i] + static_cast<int32_t>(run)) {
      ++run;
    }
    out->push_back({from, to, run * BlockBytes(s)});
    i += run - 1;
  }
}

}  // namespace

std::vector<KvSegment> PlanKvSegments(const model::KvCacheShape& source,
                                      const model::KvCacheShape& target,
                                      const std::vector<int32_t>& src,
                                      const std::vector<int32_t>& dst, KvHeadSlice heads,
                                      int64_t first_layer, int64_t num_layers) {
  std::vector<KvSegment> out;
  const int64_t end = num_layers < 0 ? source.num_layers : first_layer + num_layers;
  for (int64_t layer = first_layer; layer < end; ++layer) {
    for (int kv = 0; kv < 2; ++kv) PlanePlan(source, target, src, dst, heads, layer, kv, &out);
  }
  return out;
}

std::vector<KvSegment> PlanKvSegments(const model::KvCacheShape& source,
                                      const model::KvCacheShape& target,
                                      const std::vector<int32_t>& src,
                                      const std::vector<int32_t>& dst, int64_t first_head,
                                      int64_t first_layer, int64_t num_layers) {
  return PlanKvSegments(source, target, src, dst,
                        KvHeadSlice{.src_first = first_head, .count = target.num_kv_heads},
                        first_layer, num_layers);
}

std::vector<std::vector<KvSegment>> ChunkKvSegments(const std::vector<KvSegment>& segments,
                                                    uint64_t chunk_bytes) {
  std::vector<std::vector<KvSegment>> jobs;
  uint64_t filled = chunk_bytes;  // bytes in jobs.back(); full: start a new job
  for (KvSegment seg : segments) {
    while (seg.bytes > 0) {
      if (filled >= chunk_bytes) {
        jobs.emplace_back();
        filled = 0;
      }
      const uint64_t take = std::min(seg.bytes, chunk_bytes - filled);
      jobs.back().push_back({seg.src, seg.dst, take});
      filled += take;
      seg.src += take;
      seg.dst += take;
      seg.bytes -= take;
    }
  }
  return jobs;
}

uint32_t CopyKvSegments(const std::vector<std::vector<KvSegment>>& jobs, const uint8_t* src_base,
                        uint8_t* dst_base, ChecksumWorker& helper) {
  return KvSegmentCopy::Start(jobs, src_base, dst_base, helper)->Finish();
}

KvSegmentCopy::KvSegmentCopy(std::vector<std::vector<KvSegment>> jobs, const uint8_t* src_base,
                             uint8_t* dst_base)
    : jobs_(std::move(jobs)),
      src_base_(src_base),
      dst_base_(dst_base),
      crcs_(jobs_.size()),
      lengths_(jobs_.size()) {}

std::shared_ptr<KvSegmentCopy> KvSegmentCopy::Start(std::vector<std::vector<KvSegment>> jobs,
                                                    const uint8_t* src_base, uint8_t* dst_base,
                                                    ChecksumWorker& helper) {
  std::shared_ptr<KvSegmentCopy> copy(new KvSegmentCopy(std::move(jobs), src_base, dst_base));
  helper.Run([copy] {
    copy->Work();
    absl::MutexLock lock(&copy->mu_);
    copy->helped_ = true;
  });
  return copy;
}

void KvSegmentCopy::Work() {
  // Both threads take the next job until none is left (on a shared machine
  // one of them may stall; the other then does more).
  for (size_t j; (j = next_.fetch_add(1)) < jobs_.size();) {
    uint32_t crc = 0;
    uint64_t length = 0;
    for (const KvSegment& s : jobs_[j]) {
      crc = Crc32cCopy(dst_base_ + s.dst, src_base_ + s.src, s.bytes, crc);
      length += s.bytes;
    }
    crcs_[j] = crc;
    lengths_[j] = length;
  }
}

bool KvSegmentCopy::helped() const {
  absl::MutexLock lock(&mu_);
  return helped_;
}

uint32_t KvSegmentCopy::Finish() {
  Work();
  {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(&helped_));
  }
  uint32_t crc = 0;
  for (size_t j = 0; j < jobs_.size(); ++j) crc = Crc32cCombine(crc, crcs_[j], lengths_[j]);
  return crc;
}

}  // namespace mmserve::transfer
