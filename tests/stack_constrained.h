// Structured output through a whole stack, for the stack tests that start
// one per topology (role both, E + P + D with a TP=2 decode instance,
// elastic instances alone and as a group): the same constrained requests
// give the in-process engine's tokens over gRPC (sampling.constraint) and
// the gRPC chat's text over HTTP (response_format json_schema), complete
// (finish_reason "stop") and valid against the schema; bad schemas are
// refused with the reason.
//
//   CheckConstrainedOutput(**stack, /*refusals=*/true);
#ifndef MMSERVE_TESTS_STACK_CONSTRAINED_H_
#define MMSERVE_TESTS_STACK_CONSTRAINED_H_

#include <string>

#include "deploy/launcher/local_stack.h"

namespace mmserve::testing {

// Raw prompts over gRPC (greedy and seeded, two schemas): the in-process
// engine's tokens; chats over HTTP: the gRPC chat's text, which parses and
// validates. With `refusals`, a bad schema over HTTP (400 naming
// response_format.json_schema.schema) and gRPC (INVALID_ARGUMENT naming
// constraint.json_schema), and two constraints at once over HTTP.
void CheckConstrainedOutput(launcher::LocalStack& stack, bool refusals);

// `text` (a long raw prompt) under a schema, greedy: the in-process
// engine's tokens (an elastic group samples and decodes it).
void CheckConstrainedPrompt(launcher::LocalStack& stack, const std::string& text);

}  // namespace mmserve::testing

#endif  // MMSERVE_TESTS_STACK_CONSTRAINED_H_
