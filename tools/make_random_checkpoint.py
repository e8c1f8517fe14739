#!/usr/bin/env python3
"""A model directory at a published model's real dimensions, for benchmarks.

Writes config.json, generation_config.json and preprocessor_config.json in
the layout the model's own checkpoint uses (Qwen2-VL's flat one, or
text_config / vision_config), with the dimensions of the named preset. With
--weights it also writes the language model's weights as safetensors (bf16,
one random block of 64 Ki values in [-0.05, 0.05) tiled over every matrix;
norms 1), in shards of --shard_gb with model.safetensors.index.json, and
for Qwen3-VL-MoE the experts fused and input-major as transformers saves
them. Without --weights, bench:lm_bench and bench:vision_bench draw random
weights at the config's dimensions (no disk: a 4B model is 8 GB in bf16).
For timing only: the answers are nonsense. Standard library only.

    python3 tools/make_random_checkpoint.py --preset=qwen3-vl-4b --out=/tmp/qwen3-vl-4b
    bazel run --config=opt //bench:lm_bench -- --model_dir=/tmp/qwen3-vl-4b
    bazel run --config=opt //bench:vision_bench -- --model_dir=/tmp/qwen3-vl-4b

Presets (Hugging Face config.json of the named model):
    qwen2-vl-2b        Qwen/Qwen2-VL-2B-Instruct
    qwen2.5-vl-3b      Qwen/Qwen2.5-VL-3B-Instruct
    qwen3-vl-2b        Qwen/Qwen3-VL-2B-Instruct
    qwen3-vl-4b        Qwen/Qwen3-VL-4B-Instruct
    qwen3-vl-30b-a3b   Qwen/Qwen3-VL-30B-A3B-Instruct (128 experts: 61 GB in bf16)
    qwen3-vl-moe-16e   the same with 16 experts (8 per token, as in the
                       original: the same active parameters, 5.1 G in all)
"""
import argparse
import json
import os
import random
import struct

IDS = {"bos_token_id": 151643, "eos_token_id": 151645, "vision_start_token_id": 151652,
       "vision_end_token_id": 151653, "image_token_id": 151655, "video_token_id": 151656}
QWEN2_PRE = {"min_pixels": 3136, "max_pixels": 12845056, "patch_size": 14,
             "temporal_patch_size": 2, "merge_size": 2,
             "image_mean": [0.48145466, 0.4578275, 0.40821073],
             "image_std": [0.26862954, 0.26130258, 0.27577711]}
QWEN3_PRE = {"size": {"shortest_edge": 65536, "longest_edge": 16777216}, "patch_size": 16,
             "temporal_patch_size": 2, "merge_size": 2, "image_mean": [0.5, 0.5, 0.5],
             "image_std": [0.5, 0.5, 0.5]}


def qwen3_vl(text, vision):
    text = dict(dict(vocab_size=151936, head_dim=128, rms_norm_eps=1e-6, rope_theta=5000000.0,
                     max_position_embeddings=262144, hidden_act="silu", attention_bias=False,
                     tie_word_embeddings=True,
                     rope_scaling={"rope_type": "default", "mrope_section": [24, 20, 20],
                                   "mrope_interleaved": True}), **text)
    vision = dict(dict(depth=24, hidden_size=1024, intermediate_size=4096, num_heads=16,
                       in_channels=3, patch_size=16, spatial_merge_size=2, temporal_patch_size=2,
                       num_position_embeddings=2304, deepstack_visual_indexes=[5, 11, 17],
                       hidden_act="gelu_pytorch_tanh", out_hidden_size=text["hidden_size"]),
                  **vision)
    moe = "num_experts" in text
    return {"architectures": ["Qwen3VLMoeForConditionalGeneration" if moe
                              else "Qwen3VLForConditionalGeneration"],
            "model_type": "qwen3_vl_moe" if moe else "qwen3_vl", "dtype": "bfloat16",
            "tie_word_embeddings": text["tie_word_embeddings"], "text_config": text,
            "vision_config": vision, **{k: v for k, v in IDS.items() if "token" in k}}, QWEN3_PRE


def preset(name):
    if name == "qwen2-vl-2b":
        return {"architectures": ["Qwen2VLForConditionalGeneration"], "model_type": "qwen2_vl",
                "torch_dtype": "bfloat16", "vocab_size": 151936, "hidden_size": 1536,
                "intermediate_size": 8960, "num_hidden_layers": 28, "num_attention_heads": 12,
                "num_key_value_heads": 2, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
                "max_position_embeddings": 32768, "hidden_act": "silu",
                "tie_word_embeddings": True,
                "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
                "vision_config": {"depth": 32, "embed_dim": 1280, "mlp_ratio": 4,
                                  "num_heads": 16, "in_chans": 3, "hidden_size": 1536,
                                  "patch_size": 14, "spatial_merge_size": 2,
                                  "temporal_patch_size": 2}, **IDS}, QWEN2_PRE
    if name == "qwen2.5-vl-3b":
        return {"architectures": ["Qwen2_5_VLForConditionalGeneration"],
                "model_type": "qwen2_5_vl", "torch_dtype": "bfloat16", "vocab_size": 151936,
                "hidden_size": 2048, "intermediate_size": 11008, "num_hidden_layers": 36,
                "num_attention_heads": 16, "num_key_value_heads": 2, "rms_norm_eps": 1e-6,
                "rope_theta": 1000000.0, "max_position_embeddings": 128000,
                "hidden_act": "silu", "tie_word_embeddings": True,
                "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
                "vision_config": {"depth": 32, "hidden_size": 1280, "intermediate_size": 3420,
                                  "num_heads": 16, "in_chans": 3, "out_hidden_size": 2048,
                                  "patch_size": 14, "spatial_merge_size": 2,
                                  "temporal_patch_size": 2, "window_size": 112,
                                  "fullatt_block_indexes": [7, 15, 23, 31],
                                  "tokens_per_second": 2, "hidden_act": "silu"},
                **IDS}, QWEN2_PRE
    if name == "qwen3-vl-2b":
        return qwen3_vl({"hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 28,
                         "num_attention_heads": 16, "num_key_value_heads": 8}, {})
    if name == "qwen3-vl-4b":
        return qwen3_vl({"hidden_size": 2560, "intermediate_size": 9728, "num_hidden_layers": 36,
                         "num_attention_heads": 32, "num_key_value_heads": 8}, {})
    if name in ("qwen3-vl-30b-a3b", "qwen3-vl-moe-16e"):
        return qwen3_vl({"hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 48,
                         "num_attention_heads": 32, "num_key_value_heads": 4,
                         "tie_word_embeddings": False, "moe_intermediate_size": 768,
                         "num_experts": 128 if name == "qwen3-vl-30b-a3b" else 16,
                         "num_experts_per_tok": 8, "norm_topk_prob": True,
                         "decoder_sparse_step": 1, "mlp_only_layers": []},
                        {"depth": 27, "hidden_size": 1152, "intermediate_size": 4304,
                         "deepstack_visual_indexes": [8, 16, 24]})
    raise SystemExit("unknown --preset " + name)


def text_tensors(config):
    """(name, shape) of every language-model tensor, in Qwen2Weights' names."""
    t = config.get("text_config", config)
    nested = "text_config" in config
    p = "model.language_model." if nested else "model."
    hidden, inter = t["hidden_size"], t["intermediate_size"]
    head_dim = t.get("head_dim") or hidden // t["num_attention_heads"]
    q, kv = t["num_attention_heads"] * head_dim, t["num_key_value_heads"] * head_dim
    qwen3 = config["model_type"].startswith("qwen3")
    out = [(p + "embed_tokens.weight", [t["vocab_size"], hidden]), (p + "norm.weight", [hidden])]
    if not t["tie_word_embeddings"]:
        out.append(("lm_head.weight", [t["vocab_size"], hidden]))
    for l in range(t["num_hidden_layers"]):
        lp = "%slayers.%d." % (p, l)
        out += [(lp + "input_layernorm.weight", [hidden]),
                (lp + "post_attention_layernorm.weight", [hidden]),
                (lp + "self_attn.q_proj.weight", [q, hidden]),
                (lp + "self_attn.k_proj.weight", [kv, hidden]),
                (lp + "self_attn.v_proj.weight", [kv, hidden]),
                (lp + "self_attn.o_proj.weight", [hidden, q])]
        if qwen3:
            out += [(lp + "self_attn.q_norm.weight", [head_dim]),
                    (lp + "self_attn.k_norm.weight", [head_dim])]
        else:
            out += [(lp + "self_attn.%s_proj.bias" % x, [n]) for x, n in (("q", q), ("k", kv),
                                                                           ("v", kv))]
        experts = t.get("num_experts", 0)
        if experts and l not in t.get("mlp_only_layers", []):
            width = t["moe_intermediate_size"]
            out += [(lp + "mlp.gate.weight", [experts, hidden]),
                    (lp + "mlp.experts.gate_up_proj", [experts, hidden, 2 * width]),
                    (lp + "mlp.experts.down_proj", [experts, width, hidden])]
        else:
            out += [(lp + "mlp.gate_proj.weight", [inter, hidden]),
                    (lp + "mlp.up_proj.weight", [inter, hidden]),
                    (lp + "mlp.down_proj.weight", [hidden, inter])]
    return out


def write_weights(out, config, shard_bytes):
    rng = random.Random(0)
    floats = struct.pack("<65536f", *(rng.uniform(-0.05, 0.05) for _ in range(65536)))
    block = b"".join(floats[i + 2:i + 4] for i in range(0, len(floats), 4))  # bf16: upper halves
    one = struct.pack("<f", 1.0)[2:] * 65536
    shards, current, size = [], [], 0
    for name, shape in text_tensors(config):
        n = 2
        for d in shape:
            n *= d
        if current and size + n > shard_bytes:
            shards.append(current)
            current, size = [], 0
        current.append((name, shape, n))
        size += n
    shards.append(current)
    weight_map = {}
    for i, tensors in enumerate(shards):
        fname = "model-%05d-of-%05d.safetensors" % (i + 1, len(shards))
        header, offset = {}, 0
        for name, shape, n in tensors:
            header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + n]}
            offset += n
            weight_map[name] = fname
        h = json.dumps(header).encode()
        h += b" " * ((8 - len(h) % 8) % 8)
        with open(os.path.join(out, fname), "wb") as f:
            f.write(struct.pack("<Q", len(h)) + h)
            for name, shape, n in tensors:
                src = one if len(shape) == 1 and name.endswith("norm.weight") else block
                while n > 0:
                    chunk = min(n, len(src))
                    f.write(src[:chunk])
                    n -= chunk
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f, indent=1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--weights", action="store_true", help="also write the language model")
    ap.add_argument("--shard_gb", type=float, default=4.0)
    args = ap.parse_args()
    config, pre = preset(args.preset)
    os.makedirs(args.out, exist_ok=True)
    for stale in os.listdir(args.out):
        if stale.endswith(".safetensors") or stale == "model.safetensors.index.json":
            os.remove(os.path.join(args.out, stale))
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    with open(os.path.join(args.out, "preprocessor_config.json"), "w") as f:
        json.dump(pre, f, indent=2)
    with open(os.path.join(args.out, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": IDS["bos_token_id"],
                   "eos_token_id": [IDS["eos_token_id"], IDS["bos_token_id"]]}, f, indent=2)
    if args.weights:
        write_weights(args.out, config, int(args.shard_gb * (1 << 30)))


if __name__ == "__main__":
    main()
