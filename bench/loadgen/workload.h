// The requests a load run sends, built before the run starts so that
// building them costs nothing while the clock runs.
//
//   demo:      the demo evaluation set's questions in order (one image each,
//              greedy, 8 tokens), answers checkable against the in-process
//              engine;
//   synthetic: `images` images of `image_width` x `image_height` (random
//              pixels, PNG), a prompt of about `prompt_tokens` words,
//              `output_tokens` generated with EOS ignored; a share
//              `repeat_share` of the images repeats an earlier one (encoder
//              cache hits); `images` = 0 makes text-only requests;
//              a non-empty `prompt_tokens_mix` draws each request's prompt
//              length uniformly from its entries instead (a length-variance
//              mix: `{32, 512, 1900}` gives a third of each on average);
//              `turns` > 1 makes conversations instead: each of
//              `num_requests` / `turns` conversations (rounded up) asks
//              `turns` questions about the same images, each turn's prompt
//              the whole chat so far (a fixed assistant reply stands for the
//              answers, so a turn's prompt extends the one before it and the
//              images lead every turn), sent `think_time_s` after the turn
//              before it ended (RunConversations).
//
//   ASSIGN_OR_RETURN(Workload w, BuildWorkload(spec));
//   v1::GenerateRequest r = GrpcRequest(w.items[0]);
#ifndef MMSERVE_BENCH_LOADGEN_WORKLOAD_H_
#define MMSERVE_BENCH_LOADGEN_WORKLOAD_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/inference.pb.h"
#include "proto/language.pb.h"

namespace mmserve::loadgen {

struct WorkloadSpec {
  std::string dataset = "demo";  // demo | synthetic
  int num_requests = 100;
  // demo: the evaluation set's directory (eval.json and the images).
  std::string eval_dir;
  // synthetic:
  int images = 1;
  int image_width = 224;
  int image_height = 224;
  int prompt_tokens = 32;
  // Non-empty: each request's prompt words, drawn uniformly from these.
  std::vector<int> prompt_tokens_mix;
  int output_tokens = 16;
  double repeat_share = 0.0;  // [0, 1]
  int turns = 1;              // > 1: conversations of this many turns
  double think_time_s = 0;    // between a turn's end and the next turn
  uint64_t seed = 1;
};

struct WorkItem {
  // Image bytes, in prompt order, then the text of the user turn.
  std::vector<const std::string*> images;
  std::string text;
  // A conversation's later turn: the user texts of the turns before it
  // (the images lead the first), each answered by kAssistantReply.
  std::vector<std::string> earlier_turns;
  int conversation = -1;  // -1: a single request
  int turn = 0;
  int max_tokens = 8;
  // synthetic: the prompt's words (about one token each); 0 for demo items.
  int prompt_tokens = 0;
  bool ignore_eos = false;
  // demo: the item's index in the evaluation set (the reference answer's);
  // -1 for synthetic items.
  int demo_index = -1;
};

// What a conversation's earlier turns were answered, in every later prompt.
inline constexpr char kAssistantReply[] = "Noted.";

struct Workload {
  // A conversation's turns are consecutive, first turn first.
  std::vector<WorkItem> items;
  int turns = 1;
  double think_time_s = 0;
  // Owns every distinct image the items point to.
  std::vector<std::unique_ptr<std::string>> image_store;
  // demo: the expected answers (eval.json's), by demo_index.
  std::vector<std::string> demo_answers;
};

// INVALID_ARGUMENT for a bad spec; NOT_FOUND when the evaluation set is
// missing.
absl::StatusOr<Workload> BuildWorkload(const WorkloadSpec& spec);

// The item as the router's public request (streamed, token ids included).
v1::GenerateRequest GrpcRequest(const WorkItem& item);
// The item as an OpenAI chat completion body (streamed, usage included).
std::string HttpBody(const WorkItem& item);
// A text-only item as a language instance's Prefill call (role both).
// INVALID_ARGUMENT when the item has images (they need an encoder).
absl::StatusOr<internal::v1::PrefillRequest> LanguageRequest(const WorkItem& item,
                                                             const std::string& request_id);

}  // namespace mmserve::loadgen

#endif  // MMSERVE_BENCH_LOADGEN_WORKLOAD_H_
