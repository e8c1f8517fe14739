#include "model/text_streamer.h"

#include <catch2/catch.hpp>

#include "model/tiny_tokenizer_testing.h"

namespace mmserve::model {
namespace {

struct Run {
  std::string streamed;
  bool stopped = false;
  std::string matched;
  std::vector<std::string> deltas;
};

Run Stream(const Tokenizer& tok, const std::string& text, const SamplingParams& p) {
  Run run;
  TextStreamer s(tok, p);
  int n = 0;
  auto ids = tok.Encode(text);
  REQUIRE(ids.ok());
  for (int32_t id : *ids) {
    auto step = s.Push(id, ++n);
    REQUIRE(step.ok());
    run.deltas.push_back(step->text);
    run.streamed += step->text;
    if (step->stopped) {
      run.stopped = true;
      run.matched = step->matched_stop;
      return run;
    }
  }
  run.streamed += s.Finish();
  return run;
}

TEST_CASE("without stop strings the stream is the whole text", "[streamer]") {
  auto tok = *MakeTinyTokenizer();
  Run r = Stream(*tok, "hello world, hello 世界", SamplingParams());
  CHECK(r.streamed == "hello world, hello 世界");
  CHECK_FALSE(r.stopped);
}

TEST_CASE("a stop string ends the stream and is not emitted", "[streamer]") {
  auto tok = *MakeTinyTokenizer();
  SamplingParams p;
  p.stop = {"wor", "xyz"};
  Run r = Stream(*tok, "hello world again", p);
  CHECK(r.stopped);
  CHECK(r.matched == "wor");
  CHECK(r.streamed == "hello ");
}

TEST_CASE("text that may start a stop string is held back, then released", "[streamer]") {
  auto tok = *MakeTinyTokenizer();
  SamplingParams p;
  p.stop = {"hello there"};
  Run r = Stream(*tok, "say hello world", p);
  CHECK_FALSE(r.stopped);
  CHECK(r.streamed == "say hello world");
  // "hello" was never emitted on its own: it could have begun "hello there".
  for (const std::string& d : r.deltas) CHECK(d != "hello");
}

TEST_CASE("the earliest stop string wins over one listed first", "[streamer]") {
  auto tok = *MakeTinyTokenizer();
  SamplingParams p;
  p.stop = {"d", "o"};
  Run r = Stream(*tok, "hello world", p);
  CHECK(r.matched == "o");
  CHECK(r.streamed == "hell");
}

TEST_CASE("stop strings do not fire before min_tokens", "[streamer]") {
  auto tok = *MakeTinyTokenizer();
  SamplingParams p;
  p.stop = {"hello"};
  p.min_tokens = 3;
  Run r = Stream(*tok, "hello world hello", p);  // tokens: hello, " world", " hello"
  CHECK(r.stopped);
  CHECK(r.streamed == "hello world ");
}

}  // namespace
}  // namespace mmserve::model
