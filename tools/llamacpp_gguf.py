#!/usr/bin/env python3
"""Writes Qwen2 weights as GGUF for llama.cpp (bench/peer/).

Two kinds of model:

--dims: random weights for the speed comparison.

The same shapes and the same value distribution as lm_bench's random weights
(model/qwen2_weights.cc Qwen2Weights::Random: uniform on [-a, a] with
a = 0.02 * sqrt(3), norms all ones, tied embeddings), drawn with numpy (not
the C++ xorshift stream: throughput does not depend on the values). The
tokenizer is llama.cpp's "none" model with <arch>.vocab_size dummy tokens, so
llama-bench and llama-batched-bench draw random token ids as lm_bench does.

--checkpoint=DIR: a Hugging Face Qwen2 / Qwen2-VL checkpoint's language model
(fp32 safetensors, read here with numpy) with its byte-level BPE tokenizer
(tokenizer.json: vocabulary, merges, added tokens as control tokens, the
"qwen2" pre-tokenizer, no BOS added), for the quality comparison: llama.cpp's
llama-perplexity reads the same text as bench:quality and tokenizes it into
the same ids. Qwen2-VL's M-RoPE is the plain rotary embedding on text (all
three position components are equal), so the GGUF is arch qwen2.
--bf16_dir also writes the checkpoint with every weight matrix rounded to
bf16 (config, tokenizer alongside) for bench:quality's bf16 modes.

Uses the `gguf` package of the llama.cpp tree being benchmarked (put its
gguf-py on PYTHONPATH) or the PyPI one.

  python3 tools/llamacpp_gguf.py --dims=qwen2-0.5b --types=bf16,f16,q8_0,q4_0 \
      --out_dir=$HOME/.cache/mmserve/llamacpp/models
  python3 tools/llamacpp_gguf.py --checkpoint=models/shapes-demo \
      --types=f32,bf16,q8_0,q4_0 --out_dir=... --bf16_dir=...
"""

import argparse
import json
import os
import shutil
import struct
import sys

import numpy as np

import gguf

# The dims of lm_bench's NamedDims (bench/lm_bench.cc).
DIMS = {
    "qwen2-0.5b": dict(vocab=151936, hidden=896, inter=4864, layers=24, heads=14, kv_heads=2),
    "qwen2-vl-2b": dict(vocab=151936, hidden=1536, inter=8960, layers=28, heads=12, kv_heads=2),
    "tiny": dict(vocab=2048, hidden=128, inter=256, layers=2, heads=4, kv_heads=2),
}
TYPES = {
    "f32": (gguf.GGMLQuantizationType.F32, gguf.LlamaFileType.ALL_F32),
    "bf16": (gguf.GGMLQuantizationType.BF16, gguf.LlamaFileType.MOSTLY_BF16),
    "f16": (gguf.GGMLQuantizationType.F16, gguf.LlamaFileType.MOSTLY_F16),
    "q8_0": (gguf.GGMLQuantizationType.Q8_0, gguf.LlamaFileType.MOSTLY_Q8_0),
    "q4_0": (gguf.GGMLQuantizationType.Q4_0, gguf.LlamaFileType.MOSTLY_Q4_0),
}
BOUND = 0.034641  # 0.02 * sqrt(3), as RandomDraws


def tensors(d, rng):
    """Yields (name, array) in lm_bench's draw order; 1-D ones stay fp32."""
    hidden, inter = d["hidden"], d["inter"]
    head_dim = hidden // d["heads"]
    q_out, kv_out = d["heads"] * head_dim, d["kv_heads"] * head_dim

    def draw(*shape):
        return rng.uniform(-BOUND, BOUND, size=shape).astype(np.float32)

    ones = np.ones(hidden, dtype=np.float32)
    yield "token_embd.weight", draw(d["vocab"], hidden)
    for i in range(d["layers"]):
        b = f"blk.{i}."
        yield b + "attn_norm.weight", ones
        yield b + "attn_q.weight", draw(q_out, hidden)
        yield b + "attn_k.weight", draw(kv_out, hidden)
        yield b + "attn_v.weight", draw(kv_out, hidden)
        yield b + "attn_q.bias", draw(q_out)
        yield b + "attn_k.bias", draw(kv_out)
        yield b + "attn_v.bias", draw(kv_out)
        yield b + "attn_output.weight", draw(hidden, q_out)
        yield b + "ffn_norm.weight", ones
        yield b + "ffn_gate.weight", draw(inter, hidden)
        yield b + "ffn_up.weight", draw(inter, hidden)
        yield b + "ffn_down.weight", draw(hidden, inter)
    yield "output_norm.weight", ones


def write(path, dims_name, type_name, seed):
    d = DIMS[dims_name]
    qtype, ftype = TYPES[type_name]
    w = gguf.GGUFWriter(path, "qwen2")
    w.add_name(f"mmserve-random-{dims_name}")
    w.add_context_length(32768)
    w.add_embedding_length(d["hidden"])
    w.add_block_count(d["layers"])
    w.add_feed_forward_length(d["inter"])
    w.add_head_count(d["heads"])
    w.add_head_count_kv(d["kv_heads"])
    w.add_rope_freq_base(1000000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_vocab_size(d["vocab"])
    w.add_tokenizer_model("none")
    w.add_file_type(ftype)
    rng = np.random.default_rng(seed)
    for name, a in tensors(d, rng):
        if a.ndim == 1:
            w.add_tensor(name, a)
        else:
            w.add_tensor(name, gguf.quants.quantize(a, qtype), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

# Hugging Face language-model tensor names -> GGUF names (per layer, then global).
HF_LAYER = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
HF_GLOBAL = {"embed_tokens.weight": "token_embd.weight", "norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}


def read_safetensors(path):
    """{name: (dtype, shape, raw bytes)} of one safetensors file."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    header.pop("__metadata__", None)
    return {k: (v["dtype"], v["shape"], data[v["data_offsets"][0]:v["data_offsets"][1]])
            for k, v in header.items()}


def checkpoint_tensors(ckpt_dir):
    """(config, [(gguf name, fp32 array)]) of the language model, in file order."""
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        if not os.path.exists(os.path.join(ckpt_dir, name)):
            sys.exit(f"llamacpp_gguf: --checkpoint: no {name} in {ckpt_dir} (one unsharded "
                     "safetensors file, its config.json and tokenizer.json are read)")
    with open(os.path.join(ckpt_dir, "config.json")) as f:
        cfg = json.load(f)
    path = os.path.join(ckpt_dir, "model.safetensors")
    raw = read_safetensors(path)
    out = []
    for name, (dtype, shape, data) in raw.items():
        if dtype != "F32":
            sys.exit(f"llamacpp_gguf: {name} is {dtype}; the reference needs fp32 weights")
        for prefix in ("model.language_model.", "model.", ""):
            if name.startswith(prefix):
                rest = name[len(prefix):]
                break
        gname = HF_GLOBAL.get(rest)
        if rest.startswith("layers."):
            _, layer, tail = rest.split(".", 2)
            gname = f"blk.{layer}.{HF_LAYER[tail]}" if tail in HF_LAYER else None
        if gname is None or "visual" in name:
            continue  # the vision tower
        out.append((gname, np.frombuffer(data, dtype=np.float32).reshape(shape)))
    if cfg.get("text_config"):
        cfg = {**cfg, **cfg["text_config"]}
    return cfg, out


def add_bpe_tokenizer(w, ckpt_dir):
    """The checkpoint's byte-level BPE tokenizer as llama.cpp's "gpt2" model."""
    with open(os.path.join(ckpt_dir, "tokenizer.json")) as f:
        tok = json.load(f)
    vocab = tok["model"]["vocab"]
    added = {t["id"]: t for t in tok.get("added_tokens", [])}
    n = max(list(vocab.values()) + list(added)) + 1
    tokens = [f"[PAD{i}]" for i in range(n)]
    types = [gguf.TokenType.UNUSED] * n
    for text, i in vocab.items():
        tokens[i], types[i] = text, gguf.TokenType.NORMAL
    for i, t in added.items():
        tokens[i] = t["content"]
        types[i] = gguf.TokenType.CONTROL if t.get("special") else gguf.TokenType.USER_DEFINED
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_add_bos_token(False)
    return n


def write_checkpoint(path, ckpt_dir, type_name):
    cfg, named = checkpoint_tensors(ckpt_dir)
    qtype, ftype = TYPES[type_name]
    w = gguf.GGUFWriter(path, "qwen2")
    w.add_name(os.path.basename(os.path.normpath(ckpt_dir)))
    w.add_context_length(cfg.get("max_position_embeddings", 4096))
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_rope_freq_base(float(cfg.get("rope_theta", 1000000.0)))
    w.add_layer_norm_rms_eps(float(cfg.get("rms_norm_eps", 1e-6)))
    n_vocab = add_bpe_tokenizer(w, ckpt_dir)
    if n_vocab != cfg["vocab_size"]:
        sys.exit(f"llamacpp_gguf: tokenizer has {n_vocab} ids, config.json vocab_size "
                 f"{cfg['vocab_size']}")
    for key, add in (("bos_token_id", w.add_bos_token_id), ("eos_token_id", w.add_eos_token_id)):
        if isinstance(cfg.get(key), int):
            add(cfg[key])
    w.add_file_type(ftype)
    for name, a in named:
        if a.ndim == 1:
            w.add_tensor(name, a.copy())
        else:
            w.add_tensor(name, gguf.quants.quantize(a, qtype), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def to_bf16_bits(a):
    """Round-to-nearest-even fp32 -> bf16 bit patterns (uint16)."""
    u = a.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def write_bf16_checkpoint(ckpt_dir, out_dir):
    """The checkpoint with every 2-D tensor rounded to bf16 (1-D ones stay fp32)."""
    os.makedirs(out_dir, exist_ok=True)
    raw = read_safetensors(os.path.join(ckpt_dir, "model.safetensors"))
    header, blobs, offset = {}, [], 0
    for name, (dtype, shape, data) in raw.items():
        if dtype == "F32" and len(shape) == 2:
            dtype, data = "BF16", to_bf16_bits(np.frombuffer(data, np.float32)).tobytes()
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    tmp = os.path.join(out_dir, "model.safetensors.tmp")
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)
    os.replace(tmp, os.path.join(out_dir, "model.safetensors"))
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        if os.path.exists(os.path.join(ckpt_dir, name)):
            shutil.copy(os.path.join(ckpt_dir, name), out_dir)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dims", default="qwen2-0.5b", choices=sorted(DIMS))
    p.add_argument("--checkpoint", default="",
                   help="a Hugging Face checkpoint directory instead of --dims")
    p.add_argument("--bf16_dir", default="", help="with --checkpoint: write its bf16 twin here")
    p.add_argument("--types", default="bf16,f16,q8_0")
    p.add_argument("--out_dir", required=True)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    stem = os.path.basename(os.path.normpath(args.checkpoint)) if args.checkpoint else args.dims
    if args.checkpoint and args.bf16_dir:
        write_bf16_checkpoint(args.checkpoint, args.bf16_dir)
        print(f"llamacpp_gguf: wrote {args.bf16_dir}", file=sys.stderr)
    for t in args.types.split(","):
        if t not in TYPES:
            sys.exit(f"llamacpp_gguf: --types: unknown type '{t}' (one of {', '.join(TYPES)})")
        path = os.path.join(args.out_dir, f"{stem}-{t}.gguf")
        if os.path.exists(path):
            print(f"llamacpp_gguf: {path} exists", file=sys.stderr)
            continue
        if args.checkpoint:
            write_checkpoint(path + ".tmp", args.checkpoint, t)
        else:
            write(path + ".tmp", args.dims, t, args.seed)
        os.replace(path + ".tmp", path)
        print(f"llamacpp_gguf: wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
