// A call's sink with its output parsed for tool calls (ToolCallsParsed):
// each choice's text goes through its own ToolCallParser, so responses carry
// the text that is not calls and the calls as ToolCallDelta; a choice's
// final response also carries what was held back. Used for both front ends.
//
//   if (ToolCallsParsed(request)) sink = ParseToolCalls(request, std::move(sink));
//
// Thread-safe as CallSink requires: choices may deliver concurrently (each
// choice's responses in order, forwarded in order under its own lock).
#ifndef MMSERVE_ROUTER_TOOL_CALL_SINK_H_
#define MMSERVE_ROUTER_TOOL_CALL_SINK_H_

#include "proto/inference.pb.h"
#include "router/router_context.h"

namespace mmserve::router {

CallSink ParseToolCalls(const mmserve::v1::GenerateRequest& request, CallSink sink);

}  // namespace mmserve::router

#endif  // MMSERVE_ROUTER_TOOL_CALL_SINK_H_
