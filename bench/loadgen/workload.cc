#include "bench/loadgen/workload.h"

#include <stb/stb_image_write.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <random>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/file.h"

namespace mmserve::loadgen {
namespace {

absl::Status LoadDemo(const WorkloadSpec& spec, Workload& w) {
  auto text = ReadFileToString(spec.eval_dir + "/eval.json");
  if (!text.ok()) return absl::NotFoundError(absl::StrCat("demo set: ", text.status().message()));
  const nlohmann::json eval = nlohmann::json::parse(*text, nullptr, false);
  if (eval.is_discarded() || !eval.contains("items") || eval["items"].empty()) {
    return absl::InvalidArgumentError(spec.eval_dir + "/eval.json holds no items");
  }
  std::map<std::string, const std::string*> images;
  std::vector<WorkItem> set;
  for (const auto& it : eval["items"]) {
    const std::string file = it["image"];
    if (images.count(file) == 0) {
      auto bytes = ReadFileToString(spec.eval_dir + "/" + file);
      if (!bytes.ok()) return bytes.status();
      w.image_store.push_back(std::make_unique<std::string>(std::move(*bytes)));
      images[file] = w.image_store.back().get();
    }
    WorkItem item;
    item.images = {images[file]};
    item.text = it["question"];
    item.max_tokens = 8;
    item.demo_index = static_cast<int>(set.size());
    w.demo_answers.push_back(it["answer"]);
    set.push_back(std::move(item));
  }
  // Past the set's end the questions repeat.
  for (int i = 0; i < spec.num_requests; ++i) w.items.push_back(set[i % set.size()]);
  return absl::OkStatus();
}

std::string RandomPng(int width, int height, std::mt19937_64& rng) {
  std::vector<uint8_t> pixels(static_cast<size_t>(width) * height * 3);
  for (uint8_t& p : pixels) p = static_cast<uint8_t>(rng());
  std::string out;
  stbi_write_png_to_func(
      [](void* ctx, void* data, int size) {
        static_cast<std::string*>(ctx)->append(static_cast<char*>(data), size);
      },
      &out, width, height, 3, pixels.data(), width * 3);
  return out;
}

// `first`'s conversation: `turns` items over its images, each turn's text
// a new question after the turns before it.
void AddConversation(WorkItem first, int turns, int first_index, Workload& w) {
  const int conversation = w.items.empty() ? 0 : w.items.back().conversation + 1;
  first.conversation = conversation;
  for (int t = 0; t < turns; ++t) {
    WorkItem item = first;
    item.turn = t;
    if (t > 0) {
      item.earlier_turns = w.items.back().earlier_turns;
      item.earlier_turns.push_back(w.items.back().text);
      item.text = absl::StrCat(first_index + t, " and now the next question about it");
    }
    w.items.push_back(std::move(item));
  }
}

absl::Status BuildSynthetic(const WorkloadSpec& spec, Workload& w) {
  if (spec.images < 0 || spec.image_width <= 0 || spec.image_height <= 0 ||
      spec.image_width > 4096 || spec.image_height > 4096) {
    return absl::InvalidArgumentError("synthetic: images >= 0 and sizes in [1, 4096]");
  }
  if (spec.prompt_tokens < 1 || spec.output_tokens < 1) {
    return absl::InvalidArgumentError("synthetic: prompt_tokens and output_tokens must be >= 1");
  }
  for (int n : spec.prompt_tokens_mix) {
    if (n < 1)
      return absl::InvalidArgumentError("synthetic: prompt_tokens_mix entries must be >= 1");
  }
  if (spec.repeat_share < 0 || spec.repeat_share > 1) {
    return absl::InvalidArgumentError("synthetic: repeat_share must be in [0, 1]");
  }
  if (spec.turns < 1 || spec.think_time_s < 0) {
    return absl::InvalidArgumentError("synthetic: turns must be >= 1 and think_time_s >= 0");
  }
  std::mt19937_64 rng(spec.seed);
  std::uniform_real_distribution<double> coin(0, 1);
  static const char* kWords[] = {"describe", "the", "picture", "and", "count",
                                 "every",    "red", "shape",   "in",  "it"};
  for (int i = 0; i < spec.num_requests; ++i) {
    WorkItem item;
    for (int k = 0; k < spec.images; ++k) {
      if (!w.image_store.empty() && coin(rng) < spec.repeat_share) {
        item.images.push_back(w.image_store[rng() % w.image_store.size()].get());
      } else {
        w.image_store.push_back(
            std::make_unique<std::string>(RandomPng(spec.image_width, spec.image_height, rng)));
        item.images.push_back(w.image_store.back().get());
      }
    }
    // About one token per word; a number makes prompts differ.
    item.prompt_tokens = spec.prompt_tokens;
    if (!spec.prompt_tokens_mix.empty()) {
      item.prompt_tokens = spec.prompt_tokens_mix[rng() % spec.prompt_tokens_mix.size()];
    }
    item.text = absl::StrCat(i);
    for (int t = 1; t < item.prompt_tokens; ++t) absl::StrAppend(&item.text, " ", kWords[t % 10]);
    item.max_tokens = spec.output_tokens;
    item.ignore_eos = true;
    if (spec.turns > 1) {
      AddConversation(std::move(item), spec.turns, i, w);
      i += spec.turns - 1;
    } else {
      w.items.push_back(std::move(item));
    }
  }
  w.turns = spec.turns;
  w.think_time_s = spec.think_time_s;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Workload> BuildWorkload(const WorkloadSpec& spec) {
  if (spec.num_requests < 1) return absl::InvalidArgumentError("num_requests must be >= 1");
  Workload w;
  absl::Status s;
  if (spec.dataset == "demo") {
    s = LoadDemo(spec, w);
  } else if (spec.dataset == "synthetic") {
    s = BuildSynthetic(spec, w);
  } else {
    s = absl::InvalidArgumentError(
        absl::StrCat("unknown dataset '", spec.dataset, "' (demo or synthetic)"));
  }
  if (!s.ok()) return s;
  return w;
}

v1::GenerateRequest GrpcRequest(const WorkItem& item) {
  v1::GenerateRequest req;
  auto* msg = req.mutable_chat()->add_messages();
  msg->set_role("user");
  for (const std::string* image : item.images) {
    msg->add_content()->mutable_image()->set_data(*image);
  }
  for (const std::string& earlier : item.earlier_turns) {
    msg->add_content()->set_text(earlier);
    msg = req.mutable_chat()->add_messages();
    msg->set_role("assistant");
    msg->add_content()->set_text(kAssistantReply);
    msg = req.mutable_chat()->add_messages();
    msg->set_role("user");
  }
  msg->add_content()->set_text(item.text);
  req.mutable_sampling()->set_temperature(0);
  req.mutable_sampling()->set_max_tokens(item.max_tokens);
  req.mutable_sampling()->set_ignore_eos(item.ignore_eos);
  req.mutable_stream()->set_include_token_ids(true);
  return req;
}

std::string HttpBody(const WorkItem& item) {
  nlohmann::json content = nlohmann::json::array();
  for (const std::string* image : item.images) {
    content.push_back(
        {{"type", "image_url"},
         {"image_url", {{"url", "data:image/png;base64," + absl::Base64Escape(*image)}}}});
  }
  nlohmann::json messages = nlohmann::json::array();
  for (const std::string& earlier : item.earlier_turns) {
    content.push_back({{"type", "text"}, {"text", earlier}});
    messages.push_back({{"role", "user"}, {"content", content}});
    messages.push_back({{"role", "assistant"}, {"content", kAssistantReply}});
    content = nlohmann::json::array();
  }
  content.push_back({{"type", "text"}, {"text", item.text}});
  messages.push_back({{"role", "user"}, {"content", content}});
  nlohmann::json body;
  body["messages"] = std::move(messages);
  body["temperature"] = 0;
  body["max_tokens"] = item.max_tokens;
  body["ignore_eos"] = item.ignore_eos;
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  return body.dump();
}

absl::StatusOr<internal::v1::PrefillRequest> LanguageRequest(const WorkItem& item,
                                                             const std::string& request_id) {
  if (!item.images.empty()) {
    return absl::InvalidArgumentError(
        "the language target takes text-only requests (--images=0): images need an encoder");
  }
  if (!item.earlier_turns.empty()) {
    return absl::InvalidArgumentError("the language target takes single turns (--turns=1)");
  }
  internal::v1::PrefillRequest req;
  req.set_request_id(request_id);
  auto* msg = req.mutable_chat()->add_messages();
  msg->set_role("user");
  msg->add_content()->set_text(item.text);
  req.mutable_sampling()->set_temperature(0);
  req.mutable_sampling()->set_max_tokens(item.max_tokens);
  req.mutable_sampling()->set_ignore_eos(item.ignore_eos);
  req.mutable_stream()->set_include_token_ids(true);
  return req;
}

}  // namespace mmserve::loadgen
