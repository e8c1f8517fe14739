#include "model/tokenizer.h"

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/file.h"
#include "common/status_macros.h"
#include "model/byte_level.h"
#include "model/qwen2_pretokenizer.h"
#include "model/unicode.h"

namespace mmserve::model {
namespace {

using nlohmann::json;

absl::Status Unsupported(const std::string& origin, const std::string& what) {
  return absl::UnimplementedError(absl::StrCat(origin, ": unsupported ", what));
}

std::string TypeOf(const json& j) {
  return j.is_object() && j.contains("type") && j["type"].is_string() ? j["type"].get<std::string>()
                                                                      : std::string("?");
}

// normalizer: null, NFC, or a Sequence holding only NFC.
absl::Status CheckNormalizer(const json& n, const std::string& origin, bool* nfc) {
  *nfc = false;
  if (n.is_null()) return absl::OkStatus();
  std::string type = TypeOf(n);
  if (type == "NFC") {
    *nfc = true;
    return absl::OkStatus();
  }
  if (type == "Sequence" && n.contains("normalizers") && n["normalizers"].is_array()) {
    for (const json& inner : n["normalizers"]) {
      if (TypeOf(inner) != "NFC") return Unsupported(origin, "normalizer " + TypeOf(inner));
      *nfc = true;
    }
    return absl::OkStatus();
  }
  return Unsupported(origin, "normalizer " + type);
}

// pre_tokenizer: Sequence[Split(Qwen2 pattern, Isolated), ByteLevel(use_regex=false)].
absl::Status CheckPreTokenizer(const json& p, const std::string& origin) {
  const std::string qwen2 = "Sequence[Split(Qwen2 pattern, Isolated), ByteLevel(use_regex=false)]";
  if (TypeOf(p) != "Sequence" || !p.contains("pretokenizers") || !p["pretokenizers"].is_array() ||
      p["pretokenizers"].size() != 2) {
    return Unsupported(origin, "pre_tokenizer " + TypeOf(p) + " (supported: " + qwen2 + ")");
  }
  const json& split = p["pretokenizers"][0];
  const json& byte_level = p["pretokenizers"][1];
  bool split_ok = TypeOf(split) == "Split" && split.contains("pattern") &&
                  split["pattern"].is_object() && split["pattern"].contains("Regex") &&
                  split["pattern"]["Regex"] == kQwen2SplitPattern &&
                  split.value("behavior", "") == "Isolated" && !split.value("invert", false);
  bool byte_ok = TypeOf(byte_level) == "ByteLevel" && !byte_level.value("use_regex", true) &&
                 !byte_level.value("add_prefix_space", false);
  if (!split_ok || !byte_ok) return Unsupported(origin, "pre_tokenizer (supported: " + qwen2 + ")");
  return absl::OkStatus();
}

absl::Status ParseMerges(const json& merges, const std::string& origin,
                         std::vector<std::pair<std::string, std::string>>* out) {
  if (!merges.is_array())
    return absl::InvalidArgumentError(origin + ": model.merges is not a list");
  out->reserve(merges.size());
  for (const json& m : merges) {
    if (m.is_string()) {  // "a b"
      const std::string& s = m.get_ref<const std::string&>();
      size_t space = s.find(' ');
      if (space == std::string::npos || space == 0 || space + 1 == s.size()) {
        return absl::InvalidArgumentError(absl::StrCat(origin, ": bad merge \"", s, "\""));
      }
      out->emplace_back(s.substr(0, space), s.substr(space + 1));
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      out->emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
    } else {
      return absl::InvalidArgumentError(absl::StrCat(origin, ": bad merge ", m.dump()));
    }
  }
  return absl::OkStatus();
}

bool IsWordChar(char32_t cp) { return IsLetter(cp) || IsNumber(cp) || cp == '_'; }

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromFile(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  return FromJson(text, path);
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromJson(const std::string& text,
                                                               const std::string& origin) {
  json root = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded() || !root.is_object() || !root.contains("model")) {
    return absl::InvalidArgumentError(origin + ": not a tokenizer.json (no \"model\")");
  }
  std::unique_ptr<Tokenizer> tok(new Tokenizer());
  RETURN_IF_ERROR(CheckNormalizer(root.value("normalizer", json()), origin, &tok->nfc_));
  RETURN_IF_ERROR(CheckPreTokenizer(root.value("pre_tokenizer", json()), origin));
  const json decoder = root.value("decoder", json());
  if (!decoder.is_null() && TypeOf(decoder) != "ByteLevel") {
    return Unsupported(origin, "decoder " + TypeOf(decoder));
  }
  const json post = root.value("post_processor", json());
  if (!post.is_null() && TypeOf(post) != "ByteLevel") {
    return Unsupported(origin, "post_processor " + TypeOf(post));
  }
  const json& model = root["model"];
  if (TypeOf(model) != "BPE") return Unsupported(origin, "model " + TypeOf(model));
  if (model.value("byte_fallback", false)) return Unsupported(origin, "BPE byte_fallback");
  if (!model.value("dropout", json()).is_null()) return Unsupported(origin, "BPE dropout");
  if (!model.value("continuing_subword_prefix", json()).is_null() &&
      model["continuing_subword_prefix"] != "") {
    return Unsupported(origin, "BPE continuing_subword_prefix");
  }
  if (!model.contains("vocab") || !model["vocab"].is_object()) {
    return absl::InvalidArgumentError(origin + ": model.vocab is not an object");
  }
  absl::flat_hash_map<std::string, int32_t> vocab;
  int32_t max_id = -1;
  for (auto it = model["vocab"].begin(); it != model["vocab"].end(); ++it) {
    if (!it->is_number_integer() || it->get<int64_t>() < 0 || it->get<int64_t>() > INT32_MAX) {
      return absl::InvalidArgumentError(absl::StrCat(origin, ": bad id for \"", it.key(), "\""));
    }
    vocab[it.key()] = it->get<int32_t>();
    max_id = std::max(max_id, it->get<int32_t>());
  }
  std::vector<std::pair<std::string, std::string>> merges;
  RETURN_IF_ERROR(ParseMerges(model.value("merges", json::array()), origin, &merges));
  for (const json& a : root.value("added_tokens", json::array())) {
    AddedToken t;
    if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() ||
        !a.contains("content") || !a["content"].is_string() || a["content"] == "") {
      return absl::InvalidArgumentError(absl::StrCat(origin, ": bad added token ", a.dump()));
    }
    t.id = a["id"].get<int32_t>();
    t.content = a["content"].get<std::string>();
    t.special = a.value("special", false);
    t.lstrip = a.value("lstrip", false);
    t.rstrip = a.value("rstrip", false);
    t.single_word = a.value("single_word", false);
    max_id = std::max(max_id, t.id);
    tok->added_by_id_[t.id] = tok->added_.size();
    tok->added_.push_back(std::move(t));
  }
  tok->id_to_token_.resize(max_id + 1);
  for (const auto& [token, id] : vocab) tok->id_to_token_[id] = token;
  for (const AddedToken& t : tok->added_) tok->id_to_token_[t.id] = t.content;
  ASSIGN_OR_RETURN(BpeModel bpe,
                   BpeModel::Create(std::move(vocab), merges, model.value("ignore_merges", false)));
  tok->bpe_ = std::make_unique<BpeModel>(std::move(bpe));
  return tok;
}

bool Tokenizer::FindAddedToken(absl::string_view text, size_t from, bool parse_special,
                               size_t* begin, size_t* end, const AddedToken** token) const {
  for (size_t pos = from; pos < text.size(); ++pos) {
    const AddedToken* best = nullptr;
    for (const AddedToken& t : added_) {
      if (t.special && !parse_special) continue;
      if (text.compare(pos, t.content.size(), t.content) != 0) continue;
      if (best != nullptr && t.content.size() <= best->content.size()) continue;
      if (t.single_word) {
        size_t before = pos, after = pos + t.content.size();
        bool word_before = false, word_after = false;
        if (before > 0) {
          size_t p = before - 1;
          while (p > 0 && (static_cast<uint8_t>(text[p]) & 0xc0) == 0x80) --p;
          word_before = IsWordChar(NextCodePoint(text, &p));
        }
        if (after < text.size()) word_after = IsWordChar(NextCodePoint(text, &after));
        if (word_before || word_after) continue;
      }
      best = &t;
    }
    if (best == nullptr) continue;
    size_t b = pos, e = pos + best->content.size();
    auto space = [&](size_t i) { return text[i] == ' ' || (text[i] >= '\t' && text[i] <= '\r'); };
    if (best->lstrip) {
      while (b > from && space(b - 1)) --b;
    }
    if (best->rstrip) {
      while (e < text.size() && space(e)) ++e;
    }
    *begin = b;
    *end = e;
    *token = best;
    return true;
  }
  return false;
}

absl::Status Tokenizer::EncodePlain(absl::string_view text, std::vector<int32_t>* out) const {
  if (text.empty()) return absl::OkStatus();
  std::string normalized;
  if (nfc_) {
    normalized = NormalizeNfc(text);
    text = normalized;
  }
  std::vector<absl::string_view> pieces;
  SplitQwen2(text, &pieces);
  for (absl::string_view piece : pieces) {
    RETURN_IF_ERROR(bpe_->Encode(BytesToByteLevel(piece), out));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int32_t>> Tokenizer::Encode(absl::string_view text,
                                                       bool parse_special) const {
  std::vector<int32_t> ids;
  size_t pos = 0;
  size_t begin, end;
  const AddedToken* token;
  while (FindAddedToken(text, pos, parse_special, &begin, &end, &token)) {
    RETURN_IF_ERROR(EncodePlain(text.substr(pos, begin - pos), &ids));
    ids.push_back(token->id);
    pos = end;
  }
  RETURN_IF_ERROR(EncodePlain(text.substr(pos), &ids));
  return ids;
}

bool Tokenizer::AppendTokenBytes(int32_t id, std::string* out) const {
  if (id < 0 || id >= vocab_size() || id_to_token_[id].empty()) return false;
  if (added_by_id_.contains(id)) {
    out->append(id_to_token_[id]);
  } else {
    model::AppendTokenBytes(id_to_token_[id], out);
  }
  return true;
}

absl::StatusOr<std::string> Tokenizer::Decode(absl::Span<const int32_t> ids,
                                              bool skip_special) const {
  std::string bytes;
  for (int32_t id : ids) {
    if (skip_special && IsSpecial(id)) continue;
    if (!AppendTokenBytes(id, &bytes)) {
      return absl::InvalidArgumentError(absl::StrCat("token id ", id, " is not in the vocabulary"));
    }
  }
  return Utf8Lossy(bytes);
}

int32_t Tokenizer::TokenToId(absl::string_view token) const {
  for (const AddedToken& t : added_) {
    if (t.content == token) return t.id;
  }
  return bpe_->TokenToId(token);
}

absl::string_view Tokenizer::IdToToken(int32_t id) const {
  return id >= 0 && id < vocab_size() ? absl::string_view(id_to_token_[id]) : absl::string_view();
}

bool Tokenizer::IsSpecial(int32_t id) const {
  auto it = added_by_id_.find(id);
  return it != added_by_id_.end() && added_[it->second].special;
}

}  // namespace mmserve::model
