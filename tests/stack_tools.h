// Tool calls through a running stack's public APIs (the stack sampling
// test's role-both stack runs these): tools rendered into the prompt the
// language side tokenizes, tool results in a multi-turn chat, an image with
// tools, the streamed reply reassembled equal to the whole one, and
// refusals with the field named over HTTP and gRPC; with constrained
// decoding, tool_choice named and required produce parseable calls whose
// arguments follow the tool's schema.
#ifndef MMSERVE_TESTS_STACK_TOOLS_H_
#define MMSERVE_TESTS_STACK_TOOLS_H_

#include "deploy/launcher/local_stack.h"

namespace mmserve::testing {

// Tool choice auto (and none): prompts, multi-turn, image, streaming,
// refusals.
void CheckToolCalls(launcher::LocalStack& stack);

// Tool choice named and required, enforced by the engine's constrained
// decoding (sampling.constraint).
void CheckToolChoiceEnforced(launcher::LocalStack& stack);

}  // namespace mmserve::testing

#endif  // MMSERVE_TESTS_STACK_TOOLS_H_
