#!/usr/bin/env python3
"""Writes random Qwen2 weights as GGUF for llama.cpp (bench/peer/).

The same shapes and the same value distribution as lm_bench's random weights
(model/qwen2_weights.cc Qwen2Weights::Random: uniform on [-a, a] with
a = 0.02 * sqrt(3), norms all ones, tied embeddings), drawn with numpy (not
the C++ xorshift stream: throughput does not depend on the values). The
tokenizer is llama.cpp's "none" model with <arch>.vocab_size dummy tokens, so
llama-bench and llama-batched-bench draw random token ids as lm_bench does.

Uses the `gguf` package of the llama.cpp tree being benchmarked (put its
gguf-py on PYTHONPATH) or the PyPI one.

  python3 tools/llamacpp_gguf.py --dims=qwen2-0.5b --types=bf16,f16,q8_0,q4_0 \
      --out_dir=$HOME/.cache/mmserve/llamacpp/models
"""

import argparse
import os
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


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dims", default="qwen2-0.5b", choices=sorted(DIMS))
    p.add_argument("--types", default="bf16,f16,q8_0")
    p.add_argument("--out_dir", required=True)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    for t in args.types.split(","):
        path = os.path.join(args.out_dir, f"{args.dims}-{t}.gguf")
        if os.path.exists(path):
            print(f"llamacpp_gguf: {path} exists", file=sys.stderr)
            continue
        write(path + ".tmp", args.dims, t, args.seed)
        os.replace(path + ".tmp", path)
        print(f"llamacpp_gguf: wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
