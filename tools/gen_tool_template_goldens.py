#!/usr/bin/env python3
"""Writes model/testdata/tool_template_goldens.json: chats with tools rendered
by the Jinja chat template, for model/chat_template_tools_test.cc.

The template is Qwen2.5-Instruct's tool-calling template (the "# Tools"
system block, <tool_call> blocks in assistant turns, <tool_response> blocks in
user turns), with the two things Qwen2-VL does differently: the default system
prompt ("You are a helpful assistant.") and content given as a list of parts
(images and videos as their vision placeholders). It is rendered the way
transformers' apply_chat_template does: a sandboxed jinja2 environment with
trim_blocks and lstrip_blocks, and `tojson` as
json.dumps(x, ensure_ascii=False) (key order kept). As in vLLM, the
arguments of earlier tool calls are parsed (json.loads) before rendering, and
each tool is {"type": "function", "function": {name, description?,
parameters?}}.

Needs only jinja2 (Debian python3-jinja2 or pip). Deterministic.

Usage:
  python3 tools/gen_tool_template_goldens.py [--out model/testdata/tool_template_goldens.json]
"""

import argparse
import json
import os

from jinja2.sandbox import ImmutableSandboxedEnvironment
import jinja2.ext

TEMPLATE = r"""
{%- macro render_content(content) -%}
    {%- if content is string -%}
        {{- content }}
    {%- else -%}
        {%- for part in content -%}
            {%- if part['type'] == 'image' -%}
                {{- '<|vision_start|><|image_pad|><|vision_end|>' }}
            {%- elif part['type'] == 'video' -%}
                {{- '<|vision_start|><|video_pad|><|vision_end|>' }}
            {%- elif 'text' in part -%}
                {{- part['text'] }}
            {%- endif -%}
        {%- endfor -%}
    {%- endif -%}
{%- endmacro -%}
{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- render_content(messages[0]['content']) }}
    {%- else %}
        {{- 'You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + render_content(messages[0]['content']) + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + render_content(message.content) + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + render_content(message.content) }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- render_content(message.content) }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. Zürich"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}
COUNT = {
    "type": "function",
    "function": {
        "name": "count_shapes",
        "parameters": {
            "type": "object",
            "properties": {
                "shape": {"type": "string", "enum": ["circle", "square"]},
                "min_area": {"type": "number", "minimum": 0.5, "maximum": 1e6},
            },
        },
    },
}
NO_PARAMS = {"type": "function", "function": {"name": "now", "description": "Tab\there, \"quoted\"\n"}}

# (name, messages, tools, add_generation_prompt). Assistant tool call
# arguments are JSON text, as OpenAI clients send them.
CASES = [
    ("tools_default_system", [{"role": "user", "content": "Weather in Paris?"}], [WEATHER], True),
    ("tools_own_system",
     [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
     [WEATHER, COUNT, NO_PARAMS], True),
    ("tool_round_trip",
     [{"role": "user", "content": "Weather in Zürich and Köln?"},
      {"role": "assistant", "content": None, "tool_calls": [
          {"id": "call_1", "type": "function",
           "function": {"name": "get_weather", "arguments": "{\"city\":\"Zürich\",\"unit\":\"celsius\"}"}},
          {"id": "call_2", "type": "function",
           "function": {"name": "get_weather", "arguments": "{\"city\": \"Köln\"}"}}]},
      {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 21.5}"},
      {"role": "tool", "tool_call_id": "call_2", "content": "rain"},
      {"role": "assistant", "content": "Zürich 21.5 °C, rain in Köln."},
      {"role": "user", "content": "Thanks"}],
     [WEATHER], True),
    ("assistant_text_and_call",
     [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "How many circles?"}]},
      {"role": "assistant", "content": "Let me count.", "tool_calls": [
          {"id": "c", "type": "function",
           "function": {"name": "count_shapes", "arguments": "{\"shape\": \"circle\", \"min_area\": 1e-05, \"n\": [1, 2.0, true, null]}"}}]},
      {"role": "tool", "tool_call_id": "c", "content": "3"}],
     [COUNT], True),
    ("calls_without_tools",
     [{"role": "user", "content": "x"},
      {"role": "assistant", "content": "", "tool_calls": [
          {"id": "c", "type": "function", "function": {"name": "now", "arguments": "{}"}}]},
      {"role": "tool", "tool_call_id": "c", "content": "noon"}],
     [], False),
]


def render(env, messages, tools, add_generation_prompt):
    msgs = json.loads(json.dumps(messages))
    for m in msgs:  # vLLM parses earlier calls' arguments before rendering
        for call in m.get("tool_calls") or []:
            call["function"]["arguments"] = json.loads(call["function"]["arguments"])
    return env.from_string(TEMPLATE).render(
        messages=msgs, tools=tools or None, add_generation_prompt=add_generation_prompt)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=os.path.join(here, "..", "model", "testdata",
                                                      "tool_template_goldens.json"))
    args = parser.parse_args()
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = lambda x: json.dumps(x, ensure_ascii=False)
    out = []
    for name, messages, tools, gen in CASES:
        out.append({"name": name, "messages": messages, "tools": tools,
                    "add_generation_prompt": gen,
                    "text": render(env, messages, tools, gen)})
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
