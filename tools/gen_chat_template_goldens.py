#!/usr/bin/env python3
"""Writes model/testdata/chat_template_goldens.json: a corpus of chats
rendered by each model family's own Jinja chat template, for
model/chat_template_tools_test.cc (byte-for-byte comparison with
model/chat_template.h).

The templates below are the checkpoints' own, verbatim (data, not code of
ours); each names where its text was taken from. They are rendered the way
transformers' apply_chat_template does: a sandboxed jinja2 environment with
trim_blocks and lstrip_blocks, the loopcontrols extension, and `tojson` as
json.dumps(x, ensure_ascii=False) (key order kept). As in vLLM, the arguments
of earlier tool calls are parsed (json.loads) before rendering, and each tool
is {"type": "function", "function": {name, description?, parameters?}}.

Families (model/chat_template.h, ChatFamily):
  qwen2_vl  Qwen2-VL-Instruct's template (Qwen2.5-VL-Instruct ships the same
            text). Tools are not part of it; mmserve's tool extension for this
            family is covered by tools/gen_tool_template_goldens.py.
  qwen2_5   Qwen2.5-Instruct (text; model_type "qwen2").
  qwen3     Qwen3 (model_type "qwen3", "qwen3_moe").
  qwen3_vl  Qwen3-VL-Instruct (model_type "qwen3_vl", "qwen3_vl_moe").

Needs only jinja2 (Debian python3-jinja2 or pip). Deterministic.

Usage:
  python3 tools/gen_chat_template_goldens.py [--out model/testdata/chat_template_goldens.json]
"""

import argparse
import ast
import json
import os

from jinja2.sandbox import ImmutableSandboxedEnvironment
import jinja2.ext

HERE = os.path.dirname(os.path.abspath(__file__))


def qwen2_vl_template():
    """Qwen2-VL-Instruct's chat template as tools/qwen2vl_layout.py carries it
    (read from that file's CHAT_TEMPLATE so the text lives in one place)."""
    with open(os.path.join(HERE, "qwen2vl_layout.py"), encoding="utf-8") as f:
        tree = ast.parse(f.read())
    for node in tree.body:
        if isinstance(node, ast.Assign) and node.targets[0].id == "CHAT_TEMPLATE":
            return ast.literal_eval(node.value)
    raise RuntimeError("tools/qwen2vl_layout.py has no CHAT_TEMPLATE")


# Qwen/Qwen2.5-7B-Instruct's chat_template. Source: github.com/ye-NX/llama.cpp
# (a llama.cpp fork), models/templates/Qwen-Qwen2.5-7B-Instruct.jinja at commit
# 1eeb523c3e0c7ffbd59469f5463dcbdecba3535e (written by its
# scripts/get_chat_template.py from the Hugging Face checkpoint); the same text
# is in github.com/johnmai-dev/minja-swift Tests/MinjaTests/ChatTemplateTests.swift
# at 681e92a1dcbf03b7ac14fc8d55335f1b6ae5cb7a.
QWEN2_5_TEMPLATE = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
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
        {{- message.content }}
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

# Qwen/Qwen3-0.6B's chat_template. Source: github.com/ye-NX/llama.cpp,
# models/templates/Qwen-Qwen3-0.6B.jinja at commit
# 1eeb523c3e0c7ffbd59469f5463dcbdecba3535e (scripts/get_chat_template.py
# Qwen/Qwen3-0.6B).
QWEN3_TEMPLATE = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- set content = message.content %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is defined and message.reasoning_content is not none %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in message.content %}
                {%- set content = message.content.split('</think>')[-1].lstrip('\n') %}
                {%- set reasoning_content = message.content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}"""

# Qwen/Qwen3-VL-8B-Instruct's chat_template (5292 bytes, SHA-256
# 3636d0f0bd6bef02654cdffdc447b79cb2cef8ab02cc75267345946291a489e4). Source:
# github.com/zhongkaifu/TensorSharp, InferenceWeb.Tests/QwenImageIntentScorerTests.cs
# at commit 1c46d8b8908e77c5d4a892cf404cd5df63396b1a (ShippedTemplate: the
# template of Qwen/Qwen3-VL-8B-Instruct-GGUF, pinned there by that hash).
QWEN3_VL_TEMPLATE = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {%- if messages[0].content is string %}
            {{- messages[0].content }}
        {%- else %}
            {%- for content in messages[0].content %}
                {%- if 'text' in content %}
                    {{- content.text }}
                {%- endif %}
            {%- endfor %}
        {%- endif %}
        {{- '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\n' }}
        {%- if messages[0].content is string %}
            {{- messages[0].content }}
        {%- else %}
            {%- for content in messages[0].content %}
                {%- if 'text' in content %}
                    {{- content.text }}
                {%- endif %}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- set image_count = namespace(value=0) %}
{%- set video_count = namespace(value=0) %}
{%- for message in messages %}
    {%- if message.role == "user" %}
        {{- '<|im_start|>' + message.role + '\n' }}
        {%- if message.content is string %}
            {{- message.content }}
        {%- else %}
            {%- for content in message.content %}
                {%- if content.type == 'image' or 'image' in content or 'image_url' in content %}
                    {%- set image_count.value = image_count.value + 1 %}
                    {%- if add_vision_id %}Picture {{ image_count.value }}: {% endif -%}
                    <|vision_start|><|image_pad|><|vision_end|>
                {%- elif content.type == 'video' or 'video' in content %}
                    {%- set video_count.value = video_count.value + 1 %}
                    {%- if add_vision_id %}Video {{ video_count.value }}: {% endif -%}
                    <|vision_start|><|video_pad|><|vision_end|>
                {%- elif 'text' in content %}
                    {{- content.text }}
                {%- endif %}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role + '\n' }}
        {%- if message.content is string %}
            {{- message.content }}
        {%- else %}
            {%- for content_item in message.content %}
                {%- if 'text' in content_item %}
                    {{- content_item.text }}
                {%- endif %}
            {%- endfor %}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and message.content) or (not loop.first) %}
                    {{- '\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {%- if message.content is string %}
            {{- message.content }}
        {%- else %}
            {%- for content in message.content %}
                {%- if content.type == 'image' or 'image' in content or 'image_url' in content %}
                    {%- set image_count.value = image_count.value + 1 %}
                    {%- if add_vision_id %}Picture {{ image_count.value }}: {% endif -%}
                    <|vision_start|><|image_pad|><|vision_end|>
                {%- elif content.type == 'video' or 'video' in content %}
                    {%- set video_count.value = video_count.value + 1 %}
                    {%- if add_vision_id %}Video {{ video_count.value }}: {% endif -%}
                    <|vision_start|><|video_pad|><|vision_end|>
                {%- elif 'text' in content %}
                    {{- content.text }}
                {%- endif %}
            {%- endfor %}
        {%- endif %}
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
            "properties": {"min_area": {"type": "number", "minimum": 0.5, "maximum": 1e6}},
        },
    },
}
NO_PARAMS = {"type": "function", "function": {"name": "now", "description": "Tab\there, \"quoted\"\n"}}


def call(name, arguments, call_id="c"):
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def user(*parts):
    """A user turn: one string, or parts ("<image>", "<video>" or text)."""
    if len(parts) == 1 and parts[0] not in ("<image>", "<video>"):
        return {"role": "user", "content": parts[0]}
    content = []
    for p in parts:
        if p == "<image>":
            content.append({"type": "image"})
        elif p == "<video>":
            content.append({"type": "video"})
        else:
            content.append({"type": "text", "text": p})
    return {"role": "user", "content": content}


def system(text):
    return {"role": "system", "content": text}


def assistant(text, calls=None, reasoning=None):
    m = {"role": "assistant", "content": text}
    if calls:
        m["tool_calls"] = calls
    if reasoning is not None:
        m["reasoning_content"] = reasoning
    return m


def tool(text, call_id="c"):
    return {"role": "tool", "tool_call_id": call_id, "content": text}


ROUND_TRIP = [
    user("Weather in Zürich and Köln?"),
    assistant("", [call("get_weather", "{\"city\":\"Zürich\",\"unit\":\"celsius\"}", "c1"),
                   call("get_weather", "{\"city\": \"Köln\"}", "c2")]),
    tool("{\"temp\": 21.5}", "c1"),
    tool("rain", "c2"),
    assistant("Zürich 21.5 °C, rain in Köln."),
    user("Thanks"),
]
TEXT_AND_CALL = [
    user("How many shapes?"),
    assistant("Let me count.", [call("count_shapes", "{\"min_area\": 1e-05, \"n\": [1, 2.0, true, null]}")]),
    tool("3"),
]

# Cases every family renders: (name, messages, tools, options).
COMMON = [
    ("plain", [user("Hello")], [], {}),
    ("system_multi_turn", [system("Be terse."), user("hi"), assistant("hello"), user("more?")], [], {}),
    ("no_generation_prompt", [user("hi"), assistant("hello")], [], {"add_generation_prompt": False}),
    ("empty_system", [system(""), user("x")], [], {}),
]
TOOLS = [
    ("tools_default_system", [user("Weather in Paris?")], [WEATHER], {}),
    ("tools_own_system", [system("Be brief."), user("Hi")], [WEATHER, COUNT, NO_PARAMS], {}),
    ("tool_round_trip", ROUND_TRIP, [WEATHER], {}),
    ("assistant_text_and_call", TEXT_AND_CALL, [COUNT], {}),
    ("calls_without_tools", [user("x"), assistant("", [call("now", "{}")]), tool("noon")], [],
     {"add_generation_prompt": False}),
]
VISION = [
    ("image", [user("<image>", "What is this?")], [], {}),
    ("images_and_videos", [system("Look closely."), user("<video>", "then", "<image>", "<video>"),
                           assistant("ok"), user("<image>", "and this?")], [], {}),
    ("vision_ids", [user("<image>", "and", "<video>"), assistant("ok"), user("<image>", "<video>")],
     [], {"add_vision_id": True}),
]
THINKING = [
    ("thinking_off", [user("hi")], [], {"enable_thinking": False}),
    ("thinking_on", [user("hi")], [], {"enable_thinking": True}),
    ("thinking_off_history", [system("S"), user("a"), assistant("b"), user("c")], [],
     {"enable_thinking": False}),
    ("earlier_thinking_dropped",
     [user("q1"), assistant("<think>\nfirst thoughts\n</think>\n\nanswer 1"), user("q2")], [], {}),
    ("last_turn_keeps_thinking",
     [user("q1"), assistant("<think>\nr1\n</think>\n\na1"), user("q2"),
      assistant("\n<think>\n\nr2\n\n</think>\n\n\na2")], [], {"add_generation_prompt": False}),
    ("reasoning_content_field",
     [user("q"), assistant("\nanswer", reasoning="\nbecause\n")], [], {"add_generation_prompt": False}),
    ("last_turn_without_reasoning", [user("q"), assistant("plain")], [],
     {"add_generation_prompt": False}),
    ("multi_step_tools",
     [user("Weather?"), assistant("", [call("get_weather", "{\"city\": \"Oslo\"}")], reasoning="need data"),
      tool("snow"), assistant("", [call("now", "{}", "d")]), tool("noon", "d")],
     [WEATHER, NO_PARAMS], {}),
    ("tool_response_typed_by_user",
     [user("q"), assistant("<think>x</think>a"), user("<tool_response>\nr\n</tool_response>")], [], {}),
    ("think_split_twice",
     [user("q"), assistant("<think>a</think>b</think>c"), user("again")], [], {"enable_thinking": False}),
]

FAMILIES = {
    "qwen2_vl": COMMON + VISION,
    "qwen2_5": COMMON + TOOLS,
    "qwen3": COMMON + TOOLS + THINKING,
    "qwen3_vl": COMMON + TOOLS + VISION + [THINKING[0]],
}


def render(env, template, messages, tools, options):
    msgs = json.loads(json.dumps(messages))
    for m in msgs:  # vLLM parses earlier calls' arguments before rendering
        for c in m.get("tool_calls") or []:
            c["function"]["arguments"] = json.loads(c["function"]["arguments"])
    kwargs = {"add_generation_prompt": options.get("add_generation_prompt", True)}
    for key in ("enable_thinking", "add_vision_id"):
        if key in options:
            kwargs[key] = options[key]
    return env.from_string(template).render(messages=msgs, tools=tools or None, **kwargs)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=os.path.join(HERE, "..", "model", "testdata",
                                                      "chat_template_goldens.json"))
    args = parser.parse_args()
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = lambda x: json.dumps(x, ensure_ascii=False)
    templates = {"qwen2_vl": qwen2_vl_template(), "qwen2_5": QWEN2_5_TEMPLATE,
                 "qwen3": QWEN3_TEMPLATE, "qwen3_vl": QWEN3_VL_TEMPLATE}
    out = []
    for family, cases in FAMILIES.items():
        for name, messages, tools, options in cases:
            out.append({"family": family, "name": name, "messages": messages, "tools": tools,
                        "options": options,
                        "text": render(env, templates[family], messages, tools, options)})
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
