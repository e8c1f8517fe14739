// Test-only: a small Qwen2-style tokenizer.json built in code (the 256-byte
// alphabet as ids 0..255, a few merges such as "hello" and " world", and
// Qwen2's chat special tokens after the vocab), for tests that need a real
// Tokenizer without a model directory.
#ifndef MMSERVE_MODEL_TINY_TOKENIZER_TESTING_H_
#define MMSERVE_MODEL_TINY_TOKENIZER_TESTING_H_

#include <memory>
#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "model/tokenizer.h"

namespace mmserve::model {

nlohmann::json TinyTokenizerJson();
absl::StatusOr<std::unique_ptr<Tokenizer>> MakeTinyTokenizer();

}  // namespace mmserve::model

#endif  // MMSERVE_MODEL_TINY_TOKENIZER_TESTING_H_
