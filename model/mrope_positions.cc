#include "model/mrope_positions.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace mmserve::model {
namespace {

const char* KindName(MediaKind kind) { return kind == MediaKind::kVideo ? "video" : "image"; }

}  // namespace

absl::StatusOr<std::vector<int32_t>> ExpandImagePlaceholders(absl::Span<const int32_t> ids,
                                                             const MediaPadIds& pads,
                                                             absl::Span<const MediaGrid> grids) {
  const size_t placeholders =
      std::count_if(ids.begin(), ids.end(), [&](int32_t id) { return pads.IsPad(id); });
  if (placeholders != grids.size()) {
    return absl::InvalidArgumentError(absl::StrCat("prompt has ", placeholders,
                                                   " image or video placeholders for ",
                                                   grids.size(), " images and videos"));
  }
  std::vector<int32_t> out;
  size_t extra = 0;
  for (const MediaGrid& g : grids) extra += g.num_tokens() - 1;
  out.reserve(ids.size() + extra);
  size_t item = 0;
  for (int32_t id : ids) {
    if (!pads.IsPad(id)) {
      out.push_back(id);
      continue;
    }
    const MediaGrid& g = grids[item];
    if (id != pads.Of(g.kind)) {
      return absl::InvalidArgumentError(
          absl::StrCat("placeholder ", item, " does not match its ", KindName(g.kind)));
    }
    out.insert(out.end(), g.num_tokens(), id);
    ++item;
  }
  return out;
}

std::vector<MediaGrid> SplitVideoFrames(absl::Span<const MediaGrid> grids) {
  std::vector<MediaGrid> out;
  for (const MediaGrid& g : grids) {
    if (g.kind != MediaKind::kVideo) {
      out.push_back(g);
      continue;
    }
    // torch.repeat_interleave(video_grid_thw, video_grid_thw[:, 0]) with t 1.
    MediaGrid frame = g;
    frame.grid_t = 1;
    out.insert(out.end(), g.grid_t, frame);
  }
  return out;
}

absl::StatusOr<MropePositions> ComputeMropePositions(absl::Span<const int32_t> ids,
                                                     const MediaPadIds& pads,
                                                     absl::Span<const MediaGrid> grids,
                                                     int spatial_merge_size) {
  MropePositions p;
  p.t.reserve(ids.size());
  p.h.reserve(ids.size());
  p.w.reserve(ids.size());
  int32_t next = 0;  // position of the next text token
  size_t i = 0, item = 0;
  while (i < ids.size()) {
    if (!pads.IsPad(ids[i])) {
      p.t.push_back(next);
      p.h.push_back(next);
      p.w.push_back(next);
      ++next;
      ++i;
      continue;
    }
    if (item >= grids.size()) {
      return absl::InvalidArgumentError("more image or video token runs than images and videos");
    }
    const MediaGrid& g = grids[item++];
    const int32_t pad = pads.Of(g.kind);
    const int gt = g.grid_t, gh = g.grid_h / spatial_merge_size, gw = g.grid_w / spatial_merge_size;
    const size_t run = static_cast<size_t>(gt) * gh * gw;
    if (i + run > ids.size() || !std::all_of(ids.begin() + i, ids.begin() + i + run,
                                             [&](int32_t id) { return id == pad; })) {
      return absl::InvalidArgumentError(absl::StrCat(KindName(g.kind), " ", item - 1,
                                                     " needs a run of ", run, " ", KindName(g.kind),
                                                     " tokens"));
    }
    for (int a = 0; a < gt; ++a) {
      for (int b = 0; b < gh; ++b) {
        for (int c = 0; c < gw; ++c) {
          p.t.push_back(next + a * g.time_step);
          p.h.push_back(next + b);
          p.w.push_back(next + c);
        }
      }
    }
    // The text after it resumes past the largest position used.
    next += std::max({(gt - 1) * g.time_step, gh - 1, gw - 1}) + 1;
    i += run;
  }
  if (item != grids.size()) {
    return absl::InvalidArgumentError(absl::StrCat("prompt has ", item,
                                                   " image or video token runs for ", grids.size(),
                                                   " images and videos"));
  }
  p.delta = next - static_cast<int32_t>(ids.size());
  return p;
}

}  // namespace mmserve::model
