// Test support (testonly): the video chats of
// model/testdata/video_goldens/video_lm.json (tools/gen_video_lm_goldens.py)
// as engine requests, their videos and images encoded by this project's
// vision tower from the stored pixel values, so engine and service tests
// need neither the encoder service nor its video preprocessing.
//
//   ASSIGN_OR_RETURN(VideoGoldens g, VideoGoldens::Load("qwen2vl-tiny-mha-tied"));
//   for (const VideoChat& c : g.chats) { EngineRequest r = c.Request("id"); ... }
//
// Thread-compatible value types.
#ifndef MMSERVE_WORKER_VIDEO_GOLDENS_H_
#define MMSERVE_WORKER_VIDEO_GOLDENS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/hash.h"
#include "model/image_tokens.h"
#include "worker/engine_request.h"

namespace mmserve::worker {

// One image or video of a chat, encoded.
struct VideoGoldenItem {
  std::string name;         // the golden's video or image name
  model::MediaGrid grid;    // kind kVideo or kImage
  std::vector<float> rows;  // grid.num_tokens() rows of hidden_size floats
  ContentHash key;          // a stable stand-in for the content hash
};

struct VideoChat {
  std::string name;  // one_video, video_and_image, two_videos (Qwen2.5-VL: and fps chats)
  std::string rendered;
  std::vector<int32_t> input_ids;  // expanded, as transformers' processor gives them
  std::vector<int32_t> greedy_ids;
  int32_t rope_delta = 0;
  std::vector<VideoGoldenItem> items;  // order of appearance in the prompt

  // The chat as a request on the rendered text with its items as embeddings.
  EngineRequest Request(const std::string& id, int max_tokens = -1) const;
};

struct VideoGoldens {
  std::vector<VideoChat> chats;

  // `model` is a directory name under model/testdata/models with video
  // goldens (qwen2vl-tiny-mha-tied, qwen2vl-tiny-gqa2-untied-sharded,
  // qwen25vl-tiny: its videos' grids carry the time step of their chat's fps).
  static absl::StatusOr<VideoGoldens> Load(const std::string& model);
};

}  // namespace mmserve::worker

#endif  // MMSERVE_WORKER_VIDEO_GOLDENS_H_
