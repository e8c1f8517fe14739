#!/usr/bin/env python3
"""A model directory with random weights at Qwen2-0.5B's text dimensions.

For timing only (bench/seed003_bench.cc's Qwen2-0.5B run): the answers are
nonsense. Standard library only (no numpy): the bf16 weights are one random
block of 64 Ki values in [-0.05, 0.05) tiled over every matrix; norms are 1,
biases 0. The tokenizer, chat template and vision config are the demo
model's (models/shapes-demo; its token ids are all below the vocabulary
size), so the language service loads it with no vision weights (it never
loads the vision tower). About 1 GB.

    python3 tools/make_random_qwen2.py --out /tmp/qwen2-0.5b-random
    # fewer decoder layers (quicker benchmarks of what is not the layers):
    python3 tools/make_random_qwen2.py --out /tmp/qwen2-4l --layers 4
    # a small vocabulary (the demo tokenizer's ids are below 1038), so that
    # the LM head does not outweigh a few layers (elastic_experiment.sh):
    python3 tools/make_random_qwen2.py --out /tmp/qwen2-2l --layers 2 --vocab 2048
    # Qwen2's real vocabulary (bench:constrained_bench):
    python3 tools/make_random_qwen2.py --out /tmp/qwen2-4l --layers 4 \\
        --qwen_vocab grammar/testdata/qwen2_vocab.bin

--qwen_vocab puts Qwen2's 151,643 token byte strings (tools/qwen_vocab.py's
file) in tokenizer.json, with no merges (a prompt then tokenizes to single
bytes: fine for timing), and moves the demo's special tokens and every id
that names one (eos, image pad, ...) to Qwen2's ids 151643 and up: a model
whose every id is a real Qwen2 token. The directory gets a QWEN_VOCAB note.
"""
import argparse
import json
import os
import random
import shutil
import struct

DIMS = {  # Qwen/Qwen2-0.5B config.json
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "max_position_embeddings": 32768,
    "rope_theta": 1000000.0,
    "tie_word_embeddings": True,
}


def bf16_block(n, rng):
    floats = struct.pack("<%df" % n, *(rng.uniform(-0.05, 0.05) for _ in range(n)))
    # bf16: the upper two bytes of each little-endian float32.
    return b"".join(floats[i + 2:i + 4] for i in range(0, len(floats), 4))


def bytes_to_unicode():
    """GPT-2's byte-level alphabet: byte -> the character tokenizer.json uses."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) + \
        list(range(ord("\xae"), ord("\xff") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


DEMO_SPECIAL = range(1024, 1038)  # the demo's added tokens: Qwen2-VL's, in its order
QWEN_SPECIAL_SHIFT = 151643 - 1024  # Qwen2's first added token id
DEMO_VOCAB = DEMO_SPECIAL.stop  # the demo tokenizer's ids are all below this


def read_vocab_file(path):
    """Token byte strings from a MMVOCAB1 file (tools/qwen_vocab.py)."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:8] != b"MMVOCAB1":
        raise SystemExit("%s: not a MMVOCAB1 file" % path)
    (count,) = struct.unpack("<I", data[8:12])
    tokens, at = [], 12
    for _ in range(count):
        n = data[at]
        tokens.append(data[at + 1:at + 1 + n])
        at += 1 + n
    return tokens


def shift_special(value, key=""):
    """The demo's special token ids moved to Qwen2's (151643...): values of
    keys named *token_id or id (and in lists under them), and numeric keys."""
    if isinstance(value, dict):
        return {(str(int(k) + QWEN_SPECIAL_SHIFT) if k.isdigit() and int(k) in DEMO_SPECIAL
                 else k): shift_special(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [shift_special(v, key) for v in value]
    if (isinstance(value, int) and not isinstance(value, bool) and value in DEMO_SPECIAL and
            (key.endswith("token_id") or key == "id")):
        return value + QWEN_SPECIAL_SHIFT
    return value


def use_qwen_vocab(out, vocab_path):
    """Qwen2's real token ids and bytes in place of the demo's (see the doc)."""
    alphabet = bytes_to_unicode()
    tokens = read_vocab_file(vocab_path)
    path = os.path.join(out, "tokenizer.json")
    with open(path) as f:
        tok = json.load(f)
    tok["model"]["vocab"] = {"".join(alphabet[x] for x in t): i for i, t in enumerate(tokens)}
    tok["model"]["merges"] = []
    tok["added_tokens"] = shift_special(tok["added_tokens"])
    with open(path, "w") as f:
        json.dump(tok, f, ensure_ascii=False)
    for name in ("config.json", "generation_config.json", "tokenizer_config.json"):
        p = os.path.join(out, name)
        if os.path.exists(p):
            with open(p) as f:
                cfg = shift_special(json.load(f))
            with open(p, "w") as f:
                json.dump(cfg, f, indent=2)
    return len(tokens)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--demo", default=os.path.join(os.path.dirname(__file__), "..", "models",
                                                   "shapes-demo"))
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--layers", type=int, default=DIMS["num_hidden_layers"],
                    help="decoder layers (Qwen2-0.5B has 24)")
    ap.add_argument("--vocab", type=int, default=DIMS["vocab_size"],
                    help="vocabulary size (Qwen2 has 151936; the demo tokenizer needs 1038)")
    ap.add_argument("--qwen_vocab", default="",
                    help="Qwen2's vocabulary file (grammar/testdata/qwen2_vocab.bin)")
    args = ap.parse_args()
    DIMS["num_hidden_layers"] = args.layers
    if args.vocab < DEMO_VOCAB or (args.qwen_vocab and args.vocab < DIMS["vocab_size"]):
        raise SystemExit("--vocab %d: the tokenizer's ids need at least %d" % (
            args.vocab, DIMS["vocab_size"] if args.qwen_vocab else DEMO_VOCAB))
    DIMS["vocab_size"] = args.vocab
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.demo, "config.json")) as f:
        cfg = json.load(f)
    cfg.update(DIMS)
    cfg["sliding_window"] = DIMS["max_position_embeddings"]
    cfg["max_window_layers"] = DIMS["num_hidden_layers"]
    head_dim = DIMS["hidden_size"] // DIMS["num_attention_heads"]
    # Qwen2-VL's split of the rotary half (16, 24, 24 of 64) at head_dim 64.
    cfg["rope_scaling"] = {"type": "mrope", "mrope_section": [head_dim // 8, 3 * head_dim // 16,
                                                             3 * head_dim // 16]}
    cfg["torch_dtype"] = "bfloat16"
    # The vision merger's output width is the language hidden size.
    cfg["vision_config"]["hidden_size"] = DIMS["hidden_size"]
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.json",
                 "generation_config.json", "preprocessor_config.json"):
        src = os.path.join(args.demo, name)
        if os.path.exists(src):
            shutil.copy(src, os.path.join(args.out, name))
    if args.qwen_vocab:
        n = use_qwen_vocab(args.out, args.qwen_vocab)
        with open(os.path.join(args.out, "QWEN_VOCAB"), "w") as f:
            f.write("tokenizer.json: Qwen2's %d tokens (%s), no merges; special tokens at "
                    "Qwen2's ids\n" % (n, args.qwen_vocab))

    h, inter = DIMS["hidden_size"], DIMS["intermediate_size"]
    kv = DIMS["num_key_value_heads"] * head_dim
    tensors = [("model.embed_tokens.weight", [DIMS["vocab_size"], h], "rand")]
    for l in range(DIMS["num_hidden_layers"]):
        p = "model.layers.%d." % l
        tensors += [
            (p + "input_layernorm.weight", [h], "one"),
            (p + "self_attn.q_proj.weight", [h, h], "rand"),
            (p + "self_attn.q_proj.bias", [h], "zero"),
            (p + "self_attn.k_proj.weight", [kv, h], "rand"),
            (p + "self_attn.k_proj.bias", [kv], "zero"),
            (p + "self_attn.v_proj.weight", [kv, h], "rand"),
            (p + "self_attn.v_proj.bias", [kv], "zero"),
            (p + "self_attn.o_proj.weight", [h, h], "rand"),
            (p + "post_attention_layernorm.weight", [h], "one"),
            (p + "mlp.gate_proj.weight", [inter, h], "rand"),
            (p + "mlp.up_proj.weight", [inter, h], "rand"),
            (p + "mlp.down_proj.weight", [h, inter], "rand"),
        ]
    tensors.append(("model.norm.weight", [h], "one"))

    header, offset = {}, 0
    for name, shape, _ in tensors:
        size = 2
        for d in shape:
            size *= d
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    block = bf16_block(1 << 16, random.Random(args.seed))
    one = struct.pack("<f", 1.0)[2:4]
    with open(os.path.join(args.out, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for name, shape, kind in tensors:
            size = header[name]["data_offsets"][1] - header[name]["data_offsets"][0]
            if kind == "one":
                f.write(one * (size // 2))
            elif kind == "zero":
                f.write(b"\0" * size)
            else:
                while size > 0:
                    chunk = block[:size]
                    f.write(chunk)
                    size -= len(chunk)
    print("wrote %s (%.2f GB)" % (args.out, (offset + len(blob)) / 1e9))


if __name__ == "__main__":
    main()
