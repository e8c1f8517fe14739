#include "worker/engine_media.h"

#include <utility>

#include "common/status_macros.h"
#include "model/image_preprocess.h"

namespace mmserve::worker {

absl::StatusOr<std::vector<MediaRows>> MediaAdmission::RowsOf(
    EngineRequest& request, std::vector<std::vector<float>>& owned) const {
  std::vector<MediaRows> rows;
  const model::ModelConfig& config = model_.config;
  if (!request.image_embeddings.empty()) {
    if (!request.images.empty()) {
      return absl::InvalidArgumentError("give images or image embeddings, not both");
    }
    if (!config.vision) return absl::InvalidArgumentError("this model does not accept images");
    for (MediaEmbedding& e : request.image_embeddings) {
      RETURN_IF_ERROR(CheckImageEmbedding(e, rules_.image_row_width()));
      if (e.cached) {  // no rows: ExpandImages leaves it rowless (its KV is cached)
        rows.push_back({e.grid, {}, e.key});
        continue;
      }
      if (e.shared_values != nullptr) {
        const size_t n = static_cast<size_t>(e.grid.num_tokens()) * rules_.image_row_width();
        rows.push_back({e.grid, absl::MakeConstSpan(e.shared_values, n), e.key});
        continue;
      }
      owned.push_back(std::move(e.values));
      rows.push_back({e.grid, owned.back(), e.key});
    }
  } else if (!request.images.empty()) {
    if (!model_.vision || !config.preprocessor) {
      return absl::InvalidArgumentError("this model does not accept images");
    }
    for (const model::RgbImage& img : request.images) {
      ASSIGN_OR_RETURN(model::ImagePatches p, model::PreprocessImage(img, *config.preprocessor));
      std::vector<model::MediaGrid> one = {p.grid};
      ASSIGN_OR_RETURN(model::VisionEmbeddings all, model_.vision->ForwardAll(p.values, one));
      owned.push_back(model::TokenRows(std::move(all), rules_.hidden_size));
      rows.push_back({p.grid, owned.back(), std::nullopt});
    }
  }
  return rows;
}

}  // namespace mmserve::worker
