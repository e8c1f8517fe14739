#!/usr/bin/env python3
"""Writes the seed corpora of //fuzz:router_request_fuzzer (GenerateRequest
wire bytes, through protoc --encode) and //fuzz:openai_request_fuzzer
(Chat Completions JSON bodies), from the small images of
fuzz/corpus/image_decode_fuzzer and clips of fuzz/corpus/video_probe_fuzzer. Run from the workspace root:

    tools/fuzz/gen_router_seeds.py
"""
import base64
import os
import subprocess

IMAGES = "fuzz/corpus/image_decode_fuzzer"
CLIPS = "fuzz/corpus/video_probe_fuzzer"
PLACEHOLDER = "<|vision_start|><|image_pad|><|vision_end|>"
VIDEO_PLACEHOLDER = "<|vision_start|><|video_pad|><|vision_end|>"


def image(name):
    with open(os.path.join(IMAGES, name), "rb") as f:
        return f.read()


def clip(name):
    with open(os.path.join(CLIPS, name), "rb") as f:
        return f.read()


def text_bytes(b):
    return '"' + "".join("\\%03o" % c for c in b) + '"'


def chat(*messages, extra=""):
    out = "chat { "
    for role, parts in messages:
        out += 'messages { role: "%s" ' % role
        for p in parts:
            if isinstance(p, bytes):
                out += "content { image { data: %s } } " % text_bytes(p)
            elif isinstance(p, tuple):  # a video: ("video", text format of its fields)
                out += "content { video { %s } } " % p[1]
            else:
                out += 'content { text: "%s" } ' % p
        out += "} "
    return out + "} " + extra


PROTO_SEEDS = {
    "chat_text": chat(("system", ["Be brief."]), ("user", ["Hello"])),
    "chat_png": chat(("user", ["What is this?", image("rgba.png")]),
                     extra="sampling { temperature: 0.5 max_tokens: 8 }"),
    "chat_jpeg_two_images": chat(("user", [image("baseline.jpg"), "and", image("palette.png")])),
    "chat_image_in_assistant": chat(("assistant", [image("tiny.bmp")])),
    "chat_bad_role": chat(("tool", ["x"])),
    "chat_not_an_image": chat(("user", [image("not_an_image")])),
    "raw_placeholder_gif": 'raw { text: "%sDescribe." images { data: %s } }'
                           % (PLACEHOLDER, text_bytes(image("anim.gif"))),
    "raw_placeholder_mismatch": 'raw { text: "%s%s" images { data: %s } }'
                                % (PLACEHOLDER, PLACEHOLDER, text_bytes(image("wide.png"))),
    "raw_token_ids": 'request_id: "r1" model: "qwen2vl-tiny" raw { token_ids: [1, 2, 3] } '
                     "sampling { top_k: 5 top_p: 0.9 seed: 7 stop: \"x\" logprobs: 2 }",
    "raw_token_out_of_vocab": "raw { token_ids: [4000000000] }",
    "chat_video_webm": chat(("user", [("video", "data: %s fps: 2 max_frames: 8"
                                       % text_bytes(clip("vp9_70x54_16f.webm"))), "What happens?"])),
    "chat_video_frames": chat(("user", [("video", "frames { frames { data: %s } frames { data: %s } "
                                                  "frames { data: %s } }"
                                       % (text_bytes(image("tiny.bmp")), text_bytes(image("tiny.bmp")),
                                          text_bytes(image("wide.png")))), "And?"])),
    "raw_video_and_image": 'raw { text: "%s then %s" images { data: %s } videos { data: %s } }'
                           % (VIDEO_PLACEHOLDER, PLACEHOLDER, text_bytes(image("gray.png")),
                              text_bytes(clip("mpeg4_48x112_9f.avi"))),
    "sampling_out_of_range": chat(("user", ["hi"]),
                                  extra="sampling { temperature: -1 min_tokens: 99999 }"),
    "unknown_model": 'model: "gpt" ' + chat(("user", ["hi"])),
}

JSON_SEEDS = {
    "text": '{"model":"qwen2vl-tiny","messages":[{"role":"user","content":"Hello"}]}',
    "parts_png": '{"messages":[{"role":"system","content":"Be brief."},{"role":"user",'
                 '"content":[{"type":"text","text":"What is this?"},{"type":"image_url",'
                 '"image_url":{"url":"data:image/png;base64,%s"}}]}],"max_tokens":8,'
                 '"temperature":0.2,"stream":true,"stream_options":{"include_usage":true}}'
                 % base64.b64encode(image("gray.png")).decode(),
    "jpeg_sampling": '{"messages":[{"role":"user","content":[{"type":"image_url","image_url":'
                     '{"url":"data:image/jpeg;base64,%s"}}]}],"top_k":-1,"top_p":0.5,"seed":3,'
                     '"stop":["a","b"],"logprobs":true,"top_logprobs":2,"n":1,'
                     '"max_completion_tokens":4,"ignore_eos":true,"min_tokens":1}'
                     % base64.b64encode(image("baseline.jpg")).decode(),
    "developer_assistant": '{"messages":[{"role":"developer","content":"x"},{"role":"user",'
                           '"content":"y"},{"role":"assistant","content":"z"}],'
                           '"add_generation_prompt":false,"presence_penalty":0}',
    "bad_image_url": '{"messages":[{"role":"user","content":[{"type":"image_url","image_url":'
                     '{"url":"https://example.com/a.png"}}]}]}',
    "not_an_image": '{"messages":[{"role":"user","content":[{"type":"image_url","image_url":'
                    '{"url":"data:image/png;base64,aGVsbG8="}}]}]}',
    "bad_values": '{"messages":[{"role":"user","content":"x"}],"temperature":-2,"n":3,'
                  '"max_tokens":1.5}',
    "truncated": '{"messages":[{"role":"us',
    "video_url_webm": '{"messages":[{"role":"user","content":[{"type":"video_url","video_url":'
                      '{"url":"data:video/webm;base64,%s","fps":2,"max_pixels":12544}},'
                      '{"type":"text","text":"What happens?"}]}]}'
                      % base64.b64encode(clip("vp9_70x54_16f.webm")).decode(),
    "video_url_remote": '{"messages":[{"role":"user","content":[{"type":"video_url","video_url":'
                        '{"url":"https://example.com/a.mp4"}}]}]}',
}


def main():
    out = "fuzz/corpus/router_request_fuzzer"
    os.makedirs(out, exist_ok=True)
    for name, text in PROTO_SEEDS.items():
        wire = subprocess.run(
            ["protoc", "-I.", "--encode=mmserve.v1.GenerateRequest", "proto/inference.proto"],
            input=text.encode(), capture_output=True, check=True).stdout
        with open(os.path.join(out, name), "wb") as f:
            f.write(wire)
    out = "fuzz/corpus/openai_request_fuzzer"
    os.makedirs(out, exist_ok=True)
    for name, body in JSON_SEEDS.items():
        with open(os.path.join(out, name), "w") as f:
            f.write(body)


if __name__ == "__main__":
    main()
