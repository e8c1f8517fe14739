#include "router/tool_call_sink.h"

#include <algorithm>
#include <memory>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "router/tool_call_parser.h"
#include "router/tool_request.h"

namespace mmserve::router {
namespace {

struct ChoiceParser {
  explicit ChoiceParser(ToolCallParser::Options options) : parser(std::move(options)) {}
  absl::Mutex mu;  // held while a response is parsed and forwarded
  ToolCallParser parser ABSL_GUARDED_BY(mu);
};

}  // namespace

CallSink ParseToolCalls(const mmserve::v1::GenerateRequest& request, CallSink sink) {
  ToolCallParser::Options options;
  options.tool_names = ToolNames(request.chat());
  options.parallel =
      !request.chat().has_parallel_tool_calls() || request.chat().parallel_tool_calls();
  auto parsers = std::make_shared<std::vector<std::unique_ptr<ChoiceParser>>>();
  for (uint32_t i = 0; i < std::max<uint32_t>(request.n(), 1); ++i) {
    parsers->push_back(std::make_unique<ChoiceParser>(options));
  }
  auto on_response = [parsers,
                      forward = std::move(sink.on_response)](mmserve::v1::GenerateResponse r) {
    if (r.index() >= parsers->size()) return forward(std::move(r));
    ChoiceParser& choice = *(*parsers)[r.index()];
    absl::MutexLock lock(&choice.mu);
    ToolCallParser::Output out = choice.parser.Add(r.text());
    if (r.finish_reason() != mmserve::v1::FINISH_REASON_UNSPECIFIED) {
      ToolCallParser::Output last = choice.parser.Finish();
      out.text += last.text;
      for (auto& d : last.calls) out.calls.push_back(std::move(d));
    }
    r.set_text(std::move(out.text));
    for (auto& d : out.calls) *r.add_tool_calls() = std::move(d);
    forward(std::move(r));
  };
  return {.on_response = std::move(on_response), .on_end = std::move(sink.on_end)};
}

}  // namespace mmserve::router
