#!/usr/bin/python3
"""Writes Qwen2's 151,643 ordinary tokens as a compact vocabulary file.

The source is `qwen.tiktoken` (base64 token, rank per line) as the Apache-2.0
`dashscope` wheel ships it:

  pip download --no-deps dashscope==2.0.2 -d /tmp/dashscope
  tools/qwen_vocab.py /tmp/dashscope/dashscope-2.0.2-py3-none-any.whl \
      grammar/testdata/qwen2_vocab.bin

Output: b"MMVOCAB1", a little-endian uint32 token count, then per token id in
order one length byte and the token's bytes. Read by QwenVocabulary in
grammar/grammar_testing.h.
"""
import base64
import struct
import sys
import zipfile


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    wheel, out = sys.argv[1:]
    with zipfile.ZipFile(wheel) as z:
        text = z.read("dashscope/resources/qwen.tiktoken").decode()
    tokens = []
    for line in text.splitlines():
        if not line:
            continue
        b64, rank = line.split()
        if int(rank) != len(tokens):
            sys.exit(f"rank {rank} out of order")
        tokens.append(base64.b64decode(b64))
    with open(out, "wb") as f:
        f.write(b"MMVOCAB1" + struct.pack("<I", len(tokens)))
        for t in tokens:
            if len(t) > 255:
                sys.exit("token longer than 255 bytes")
            f.write(bytes([len(t)]) + t)
    print(f"{len(tokens)} tokens -> {out}")


if __name__ == "__main__":
    main()
