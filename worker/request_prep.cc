#include "worker/request_prep.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"

namespace mmserve::worker {

absl::Status CheckTokenIds(absl::Span<const int32_t> ids, int vocab_size) {
  if (ids.empty()) return absl::InvalidArgumentError("the prompt is empty");
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("token id ", id, " is outside the vocabulary"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckImageEmbedding(const MediaEmbedding& e, int row_width) {
  if (e.cached) {
    if (e.grid.num_tokens() <= 0 || !e.values.empty() || e.shared_values != nullptr ||
        !e.key.has_value() || e.grid.kind != model::MediaKind::kImage) {
      return absl::InvalidArgumentError(
          "an image expected in the prefix cache needs a grid and a key, and no rows");
    }
    return absl::OkStatus();
  }
  if (e.shared_values != nullptr) {
    if (e.grid.num_tokens() <= 0 || !e.values.empty() || !e.key.has_value()) {
      return absl::InvalidArgumentError(
          "an image embedding in shared memory needs a grid and a key, and no values");
    }
    return absl::OkStatus();
  }
  const size_t hidden = static_cast<size_t>(row_width);
  if (e.grid.num_tokens() <= 0 ||
      e.values.size() != static_cast<size_t>(e.grid.num_tokens()) * hidden) {
    return absl::InvalidArgumentError(absl::StrCat("image embedding holds ", e.values.size(),
                                                   " floats; its grid needs ", e.grid.num_tokens(),
                                                   " tokens of ", hidden));
  }
  return absl::OkStatus();
}

std::vector<MediaRows> SplitVideoRows(absl::Span<const MediaRows> media, int row_width) {
  std::vector<MediaRows> out;
  for (const MediaRows& m : media) {
    if (m.grid.kind != model::MediaKind::kVideo || m.grid.grid_t <= 1) {
      out.push_back(m);
      continue;
    }
    model::MediaGrid frame = m.grid;
    frame.grid_t = 1;
    const size_t floats = static_cast<size_t>(frame.num_tokens()) * row_width;
    for (int f = 0; f < m.grid.grid_t; ++f) {
      MediaRows r{frame, m.rows.subspan(f * floats, floats), m.key};
      // Each temporal patch its own prefix-cache key.
      if (r.key) r.key->low ^= 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(f + 1);
      out.push_back(r);
    }
  }
  return out;
}

absl::StatusOr<PreparedPrompt> ExpandImages(absl::Span<const int32_t> ids,
                                            absl::Span<const MediaRows> media,
                                            const PromptRules& rules) {
  const std::vector<MediaRows> split = rules.video_frames_apart
                                           ? SplitVideoRows(media, rules.image_row_width())
                                           : std::vector<MediaRows>(media.begin(), media.end());
  const absl::Span<const MediaRows> images = split;
  std::vector<model::MediaGrid> grids;
  for (const MediaRows& image : images) grids.push_back(image.grid);
  PreparedPrompt out;
  const model::MediaPadIds pads = rules.pads();
  ASSIGN_OR_RETURN(out.token_ids, model::ExpandImagePlaceholders(ids, pads, grids));
  ASSIGN_OR_RETURN(out.positions,
                   model::ComputeMropePositions(out.token_ids, pads, grids, rules.merge_size));
  // Where each image's tokens sit in the expanded prompt.
  const std::vector<int32_t>& expanded = out.token_ids;
  size_t k = 0;
  for (size_t i = 0; i < expanded.size() && k < images.size();) {
    if (!pads.IsPad(expanded[i])) {
      ++i;
      continue;
    }
    const MediaRows& image = images[k];
    PreparedMedia p;
    p.offset = static_cast<int>(i);
    p.length = static_cast<int>(image.grid.num_tokens());
    p.grid = image.grid;
    p.rows = image.rows.data();
    // Prefix-cache keys: the image's content, so equal placeholders with
    // different pictures never share KV.
    p.key = image.key.has_value()
                ? *image.key
                : HashBytes(absl::string_view(reinterpret_cast<const char*>(image.rows.data()),
                                              image.rows.size() * sizeof(float)));
    p.rank_hash = image.key.has_value() ? image.key->low : 0;
    out.images.push_back(p);
    i += p.length;
    ++k;
  }
  return out;
}

absl::StatusOr<PreparedPrompt> PlaceHandoffImages(absl::Span<const int32_t> ids,
                                                  absl::Span<const HandoffMedia> images,
                                                  const PromptRules& rules) {
  if (!rules.accepts_images) return absl::InvalidArgumentError("this model does not accept images");
  const int merge = rules.merge_size;
  const model::MediaPadIds pads = rules.pads();
  const int64_t n = static_cast<int64_t>(ids.size());
  PreparedPrompt out;
  std::vector<model::MediaGrid> grids;
  int64_t end = 0, image_tokens = 0;  // end of the previous run
  for (size_t k = 0; k < images.size(); ++k) {
    const HandoffMedia& h = images[k];
    model::MediaGrid g = h.grid;
    g.merge_size = merge;
    const bool sane = g.grid_t > 0 && g.grid_h > 0 && g.grid_w > 0 && g.grid_t <= n &&
                      g.grid_h <= n * merge && g.grid_w <= n * merge && g.grid_h % merge == 0 &&
                      g.grid_w % merge == 0;
    if (!sane || h.offset < end || h.offset + g.num_tokens() > n) {
      return absl::InvalidArgumentError(absl::StrCat(
          "hand-off image ", k, " (offset ", h.offset, ", grid ", g.grid_t, "x", g.grid_h, "x",
          g.grid_w, ") does not fit a prompt of ", n, " tokens after the previous image"));
    }
    for (int64_t i = h.offset; i < h.offset + g.num_tokens(); ++i) {
      if (ids[i] != pads.Of(g.kind)) {
        return absl::InvalidArgumentError(
            absl::StrCat("hand-off image ", k, " at offset ", h.offset, " is not a run of ",
                         g.kind == model::MediaKind::kVideo ? "video" : "image", " pads"));
      }
    }
    end = h.offset + g.num_tokens();
    image_tokens += g.num_tokens();
    grids.push_back(g);
    out.images.push_back(
        {.offset = h.offset, .length = static_cast<int>(g.num_tokens()), .grid = g, .key = h.key});
  }
  if (std::count_if(ids.begin(), ids.end(), [&](int32_t id) { return pads.IsPad(id); }) !=
      image_tokens) {
    return absl::InvalidArgumentError("the prompt has image pads outside its hand-off images");
  }
  out.token_ids.assign(ids.begin(), ids.end());
  ASSIGN_OR_RETURN(out.positions, model::ComputeMropePositions(ids, pads, grids, merge));
  return out;
}

absl::StatusOr<int> ResolveMaxTokens(const model::SamplingParams& sampling, bool to_context,
                                     size_t prompt_tokens, const PromptRules& rules) {
  int max_tokens = sampling.max_tokens;
  if (to_context) {
    max_tokens = rules.max_model_len - static_cast<int>(prompt_tokens);
    if (max_tokens < std::max(1, sampling.min_tokens)) {
      return absl::InvalidArgumentError(absl::StrCat("prompt (", prompt_tokens,
                                                     " tokens) leaves no room below the context "
                                                     "length ",
                                                     rules.max_model_len));
    }
  }
  if (static_cast<int64_t>(prompt_tokens) + max_tokens > rules.max_model_len) {
    return absl::InvalidArgumentError(
        absl::StrCat("prompt (", prompt_tokens, " tokens) + max_tokens (", max_tokens,
                     ") exceeds the context length ", rules.max_model_len));
  }
  return max_tokens;
}

scheduler::RequestParams SchedulerParams(scheduler::RequestId id, const PreparedPrompt& prompt,
                                         const model::SamplingParams& sampling, int max_tokens,
                                         const PromptRules& rules) {
  scheduler::RequestParams p;
  p.id = id;
  p.prompt_token_ids.assign(prompt.token_ids.begin(), prompt.token_ids.end());
  p.max_tokens = max_tokens;
  p.ignore_eos = sampling.ignore_eos;
  p.stop_token_ids.assign(sampling.stop_token_ids.begin(), sampling.stop_token_ids.end());
  if (!rules.eos_ids.empty()) {
    p.eos_token_id = rules.eos_ids.front();
    if (!sampling.ignore_eos) {
      p.stop_token_ids.insert(p.stop_token_ids.end(), rules.eos_ids.begin() + 1,
                              rules.eos_ids.end());
    }
  }
  for (const PreparedMedia& image : prompt.images) {
    p.mm_spans.push_back({image.offset, image.length, image.key});
  }
  return p;
}

HandoffPrompt MakeHandoffPrompt(const PreparedPrompt& prompt) {
  HandoffPrompt h;
  h.token_ids = prompt.token_ids;
  for (const PreparedMedia& image : prompt.images) {
    h.images.push_back({image.offset, image.grid, image.key});
  }
  h.mrope_position_delta = prompt.positions.delta;
  return h;
}

}  // namespace mmserve::worker
