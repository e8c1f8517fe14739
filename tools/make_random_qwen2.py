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
    # a vocabulary of the model's full size (bench:constrained_bench):
    python3 tools/make_random_qwen2.py --out /tmp/qwen2-4l --layers 4 --synthetic_vocab

--synthetic_vocab extends the demo tokenizer to the model's vocabulary size
with made-up tokens (ids 1038 and up): words and word pieces harvested from
the text files under /usr/share/doc and /usr/include, with and without a
leading space or capital, numbers, punctuation and whitespace runs, so a
constrained decoder sees a vocabulary of realistic size and byte structure.
No merge produces them (prompts still tokenize as the demo's); they exist to
be sampled and decoded. The directory gets a SYNTHETIC_VOCAB note.
"""
import argparse
import glob
import json
import os
import random
import re
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


def synthetic_tokens(count, seed):
    """`count` distinct made-up token byte strings (see the module doc)."""
    rng = random.Random(seed)
    words = {}
    files = glob.glob("/usr/share/doc/*/copyright") + glob.glob("/usr/include/*.h")
    for path in sorted(files):
        try:
            with open(path, encoding="utf-8", errors="ignore") as f:
                for w in re.findall(r"[A-Za-z]{2,14}", f.read(200000)):
                    words[w.lower()] = words.get(w.lower(), 0) + 1
        except OSError:
            continue
    ranked = sorted(words, key=lambda w: -words[w])
    seen, out = set(), []

    def add(t):
        b = t.encode()
        if b and b not in seen and len(out) < count:
            seen.add(b)
            out.append(b)

    punct = ['"', ",", ":", "{", "}", "[", "]", ".", "(", ")", ";", "-", "_", "/", "'", "!",
             "?", "=", "*", "#", "<", ">", "\\", "|", "&", "+", "@", "%", "$", "`", "~", "^"]
    for ws in ["\n", " ", "\t", "\n\n"]:
        for k in range(1, 17):
            add(ws * k)
            add("\n" + " " * k)
    for a in punct:
        for b in punct + [""]:
            for c in ["", " ", "\n", '"']:
                add(a + b + c)
                add(" " + a + b + c)
    for i in range(1000):
        add(str(i))
        add(" " + str(i))
    for w in ranked:
        for form in (w, " " + w, w.capitalize(), " " + w.capitalize(), w.upper()):
            add(form)
        for k in range(2, len(w)):
            add(w[:k])
            add(" " + w[:k])
            add(w[k:])
    while len(out) < count:  # pieces of random words, if the text ran out
        w = rng.choice(ranked) if ranked else "x"
        add(w[rng.randrange(len(w)):] + w[:rng.randrange(1, len(w) + 1)] + str(len(out)))
    return out


def extend_tokenizer(path, vocab_size, seed):
    with open(path) as f:
        tok = json.load(f)
    vocab = tok["model"]["vocab"]
    first = 1 + max(list(vocab.values()) + [a["id"] for a in tok["added_tokens"]])
    alphabet = bytes_to_unicode()
    have = set(vocab)
    extra = synthetic_tokens(vocab_size - first + 2000, seed)
    next_id = first
    for b in extra:
        if next_id == vocab_size:
            break
        s = "".join(alphabet[x] for x in b)
        if s in have:
            continue
        have.add(s)
        vocab[s] = next_id
        next_id += 1
    with open(path, "w") as f:
        json.dump(tok, f, ensure_ascii=False)
    return first, next_id


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--demo", default=os.path.join(os.path.dirname(__file__), "..", "models",
                                                   "shapes-demo"))
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--layers", type=int, default=DIMS["num_hidden_layers"],
                    help="decoder layers (Qwen2-0.5B has 24)")
    ap.add_argument("--synthetic_vocab", action="store_true",
                    help="extend the tokenizer to vocab_size with made-up tokens")
    args = ap.parse_args()
    DIMS["num_hidden_layers"] = args.layers
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
    if args.synthetic_vocab:
        first, end = extend_tokenizer(os.path.join(args.out, "tokenizer.json"),
                                      DIMS["vocab_size"], args.seed)
        with open(os.path.join(args.out, "SYNTHETIC_VOCAB"), "w") as f:
            f.write("tokenizer.json: the demo's tokens, then ids %d..%d made up by "
                    "tools/make_random_qwen2.py --synthetic_vocab from text on this machine\n"
                    % (first, end - 1))

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
