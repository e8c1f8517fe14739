#include "model/mrope_positions.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace mmserve::model {

absl::StatusOr<std::vector<int32_t>> ExpandImagePlaceholders(absl::Span<const int32_t> ids,
                                                             int32_t image_pad_id,
                                                             absl::Span<const ImageGrid> grids) {
  const size_t placeholders = std::count(ids.begin(), ids.end(), image_pad_id);
  if (placeholders != grids.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "prompt has ", placeholders, " image placeholders for ", grids.size(), " images"));
  }
  std::vector<int32_t> out;
  size_t extra = 0;
  for (const ImageGrid& g : grids) extra += g.num_tokens() - 1;
  out.reserve(ids.size() + extra);
  size_t image = 0;
  for (int32_t id : ids) {
    if (id != image_pad_id) {
      out.push_back(id);
      continue;
    }
    out.insert(out.end(), grids[image++].num_tokens(), image_pad_id);
  }
  return out;
}

absl::StatusOr<MropePositions> ComputeMropePositions(absl::Span<const int32_t> ids,
                                                     int32_t image_pad_id,
                                                     absl::Span<const ImageGrid> grids,
                                                     int spatial_merge_size) {
  MropePositions p;
  p.t.reserve(ids.size());
  p.h.reserve(ids.size());
  p.w.reserve(ids.size());
  int32_t next = 0;  // position of the next text token
  size_t i = 0, image = 0;
  while (i < ids.size()) {
    if (ids[i] != image_pad_id) {
      p.t.push_back(next);
      p.h.push_back(next);
      p.w.push_back(next);
      ++next;
      ++i;
      continue;
    }
    if (image >= grids.size()) {
      return absl::InvalidArgumentError("more image token runs than images");
    }
    const ImageGrid& g = grids[image++];
    const int gt = g.grid_t, gh = g.grid_h / spatial_merge_size, gw = g.grid_w / spatial_merge_size;
    const size_t run = static_cast<size_t>(gt) * gh * gw;
    if (i + run > ids.size() || !std::all_of(ids.begin() + i, ids.begin() + i + run,
                                             [&](int32_t id) { return id == image_pad_id; })) {
      return absl::InvalidArgumentError(
          absl::StrCat("image ", image - 1, " needs a run of ", run, " image tokens"));
    }
    for (int a = 0; a < gt; ++a) {
      for (int b = 0; b < gh; ++b) {
        for (int c = 0; c < gw; ++c) {
          p.t.push_back(next + a);
          p.h.push_back(next + b);
          p.w.push_back(next + c);
        }
      }
    }
    next += std::max({gt, gh, gw});
    i += run;
  }
  if (image != grids.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("prompt has ", image, " image token runs for ", grids.size(), " images"));
  }
  p.delta = next - static_cast<int32_t>(ids.size());
  return p;
}

}  // namespace mmserve::model
