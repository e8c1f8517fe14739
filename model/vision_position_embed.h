// Qwen3-VL's learned vision position embeddings: a square grid of
// embeddings (num_position_embeddings = side^2), bilinearly interpolated to
// each image's patch grid and added to the patch embeddings
// (transformers' Qwen3VLVisionModel.fast_pos_embed_interpolate).
//
//   AddPositionEmbeddings(table, embed_dim, grids, merge, x);  // x [patches][embed_dim]
//
// For a grid of h x w patches, row i samples the table at
// linspace(0, side - 1, h)[i] (and columns likewise), mixing the four
// neighbouring embeddings with weights (1 - dh)(1 - dw), (1 - dh) dw,
// dh (1 - dw) and dh dw, in fp32 as transformers does. The result is
// repeated for each temporal patch and listed in merge-block order, the
// order of the patch rows. Thread-safe (a pure function).
#ifndef MMSERVE_MODEL_VISION_POSITION_EMBED_H_
#define MMSERVE_MODEL_VISION_POSITION_EMBED_H_

#include <vector>

#include "absl/types/span.h"
#include "model/image_tokens.h"

namespace mmserve::model {

// table: [side * side][dim]. Adds into x, [sum of grid_t * grid_h * grid_w][dim].
void AddPositionEmbeddings(const std::vector<float>& table, int dim,
                           absl::Span<const MediaGrid> grids, int merge, float* x);

}  // namespace mmserve::model

#endif  // MMSERVE_MODEL_VISION_POSITION_EMBED_H_
