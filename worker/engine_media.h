// Engine admission of a request's images: how each image or video of an
// EngineRequest becomes the rows its prompt positions are computed from
// (embeddings given by the caller, or images run through the vision tower
// here). Private to the engine (engine*.cc).
//
//   MediaAdmission media(model, rules);
//   ASSIGN_OR_RETURN(std::vector<MediaRows> rows, media.RowsOf(request, live.image_embeddings));
//
// Not thread-safe: the engine's thread only.
#ifndef MMSERVE_WORKER_ENGINE_MEDIA_H_
#define MMSERVE_WORKER_ENGINE_MEDIA_H_

#include <vector>

#include "absl/status/statusor.h"
#include "worker/engine_load.h"
#include "worker/engine_request.h"
#include "worker/request_prep.h"

namespace mmserve::worker {

class MediaAdmission {
 public:
  // `model` and `rules` outlive the admission.
  MediaAdmission(const EngineModel& model, const PromptRules& rules)
      : model_(model), rules_(rules) {}

  // The image rows of `request`: its embeddings (their values moved into
  // `owned` unless shared), or its images through the vision tower (rows in
  // `owned`); an image expected cached gets no rows. InvalidArgument for both kinds at once, for
  // images to a model without vision, or for an embedding whose size does not match its grid.
  absl::StatusOr<std::vector<MediaRows>> RowsOf(EngineRequest& request,
                                                std::vector<std::vector<float>>& owned) const;

 private:
  const EngineModel& model_;
  const PromptRules& rules_;
};

}  // namespace mmserve::worker

#endif  // MMSERVE_WORKER_ENGINE_MEDIA_H_
