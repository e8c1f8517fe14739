#include "router/tool_call_parser.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <utility>

#include "absl/random/random.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "model/py_json.h"

namespace mmserve::router {
namespace {

constexpr size_t kStartLen = sizeof(kToolCallStart) - 1;
constexpr size_t kEndLen = sizeof(kToolCallEnd) - 1;

// The length of the longest suffix of `text` that is a proper prefix of
// `tag` (text that may still become the tag).
size_t PartialTagSuffix(absl::string_view text, absl::string_view tag) {
  for (size_t n = std::min(text.size(), tag.size() - 1); n > 0; --n) {
    if (text.substr(text.size() - n) == tag.substr(0, n)) return n;
  }
  return 0;
}

}  // namespace

std::string NewToolCallId() {
  static constexpr char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  thread_local absl::BitGen gen;
  std::string id = "call_";
  for (int i = 0; i < 24; ++i)
    id += kAlphabet[absl::Uniform<size_t>(gen, 0, sizeof(kAlphabet) - 1)];
  return id;
}

ToolCallParser::ToolCallParser(Options options) : options_(std::move(options)) {}

ToolCallParser::Output ToolCallParser::Add(absl::string_view text) {
  Output out;
  pending_.append(text.data(), text.size());
  Drain(/*final=*/false, &out);
  return out;
}

ToolCallParser::Output ToolCallParser::Finish() {
  Output out;
  Drain(/*final=*/true, &out);
  if (in_block_) {  // never closed: text as written
    held_space_ = space_before_ + held_space_;
    EmitText(absl::StrCat(kToolCallStart, pending_), &out);
    in_block_ = false;
  } else {
    EmitText(pending_, &out);
  }
  pending_.clear();
  if (calls_ == 0) out.text += held_space_;
  held_space_.clear();
  return out;
}

void ToolCallParser::Drain(bool final, Output* out) {
  for (;;) {
    if (in_block_) {
      const size_t end = pending_.find(kToolCallEnd);
      if (end == std::string::npos) return;
      const std::string body = pending_.substr(0, end);
      pending_.erase(0, end + kEndLen);
      in_block_ = false;
      EndBlock(body, out);
      continue;
    }
    const size_t start = pending_.find(kToolCallStart);
    if (start == std::string::npos) {
      const size_t keep = final ? 0 : PartialTagSuffix(pending_, kToolCallStart);
      EmitText(absl::string_view(pending_).substr(0, pending_.size() - keep), out);
      pending_.erase(0, pending_.size() - keep);
      return;
    }
    EmitText(absl::string_view(pending_).substr(0, start), out);
    pending_.erase(0, start + kStartLen);
    in_block_ = true;
    space_before_ = std::move(held_space_);
    held_space_.clear();
  }
}

void ToolCallParser::EmitText(absl::string_view text, Output* out) {
  const size_t last = text.find_last_not_of(" \t\n\r");
  if (last == absl::string_view::npos) {
    held_space_.append(text.data(), text.size());
    return;
  }
  absl::StrAppend(&out->text, held_space_, text.substr(0, last + 1));
  held_space_ = std::string(text.substr(last + 1));
}

void ToolCallParser::EndBlock(absl::string_view body, Output* out) {
  using json = nlohmann::ordered_json;
  const json call = json::parse(absl::StripAsciiWhitespace(body), nullptr,
                                /*allow_exceptions=*/false);
  const json* name = nullptr;
  const json* args = nullptr;
  if (!call.is_discarded() && call.is_object()) {
    if (auto it = call.find("name"); it != call.end() && it->is_string()) name = &*it;
    if (auto it = call.find("arguments"); it != call.end()) args = &*it;
  }
  const bool known = name != nullptr &&
                     std::find(options_.tool_names.begin(), options_.tool_names.end(),
                               name->get_ref<const std::string&>()) != options_.tool_names.end();
  if (!known || (args != nullptr && !args->is_object())) {
    held_space_ = space_before_ + held_space_;
    EmitText(absl::StrCat(kToolCallStart, body, kToolCallEnd), out);
    return;
  }
  if (calls_ > 0 && !options_.parallel) return;
  const uint32_t index = static_cast<uint32_t>(calls_++);
  mmserve::v1::ToolCallDelta& first = out->calls.emplace_back();
  first.set_index(index);
  first.set_id(options_.new_id ? options_.new_id() : NewToolCallId());
  first.set_name(name->get<std::string>());
  mmserve::v1::ToolCallDelta& rest = out->calls.emplace_back();
  rest.set_index(index);
  rest.set_arguments(args != nullptr ? model::PyJsonDumps(*args) : "{}");
}

}  // namespace mmserve::router
