#!/usr/bin/env python3
"""A tiny random Qwen3-VL-MoE checkpoint and its transformers goldens.

Writes model/testdata/models/qwen3vlmoe-tiny/ (config.json,
generation_config.json and the weights in several shards with
model.safetensors.index.json, as large checkpoints are saved; the tiny
tokenizer and qwen3vl-tiny's patch-16 preprocessor, so that the services
serve it) and
model/testdata/goldens/qwen3vlmoe-tiny/mm_golden.{json,safetensors}: the
vision tower on one image and on two images of different sizes in one call
(main embedding and one DeepStack feature per deepstack index), and three
chats, text only, with that image, and with both images (ids, M-RoPE
positions, last logits, 16 greedy tokens with eos masked).

What the model exercises beyond qwen3vl-tiny: the sparse layers of
Qwen3VLMoeTextSparseMoeBlock (a softmax router, top 2 of 4 experts, always
renormalized) whose experts transformers stores fused and input-major
(mlp.experts.gate_up_proj [experts, hidden, 2 x width], mlp.experts.down_proj
[experts, width, hidden]), with a dense layer among them (mlp_only_layers).

The images' pixel values are a fixed pattern, ((i * 7919) % 2001 - 1000) /
1000 in float32 for the i-th value (the second image's continuing where
the first's end), that the C++ test computes bit for bit, so that the
goldens stay a few KB.

  /work/venv-ml/bin/python tools/gen_qwen3vlmoe_goldens.py  # versions: tools/requirements.txt
"""
import os
import shutil
import sys

import torch
import transformers
from transformers import (Qwen2TokenizerFast, Qwen3VLMoeConfig,
                          Qwen3VLMoeForConditionalGeneration)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_goldens import SEED, init_params  # noqa: E402
from gen_qwen3vl_goldens import PREPROCESSOR_CONFIG  # noqa: E402
from golden_util import generate_greedy, special_ids, write_json, write_safetensors  # noqa: E402

NAME = "qwen3vlmoe-tiny"
N_NEW = 16
IMAGE_GRID = [1, 4, 6]  # 24 patches of 16 x 16 pixels: 6 image tokens
SECOND_GRID = [1, 8, 4]  # the two_images chat's second image: 32 patches, 8 tokens
PATCH_VALUES = 3 * 2 * 16 * 16
CHATS = [
    ("text", [{"role": "user", "content": [{"type": "text", "text": "Name three colors."}]}]),
    ("one_image", [{"role": "user", "content": [{"type": "image"},
                                                {"type": "text", "text": "Describe this image."}]}]),
    ("two_images", [{"role": "user", "content": [{"type": "text", "text": "Compare "},
                                                 {"type": "image"},
                                                 {"type": "text", "text": " and "},
                                                 {"type": "image"},
                                                 {"type": "text", "text": ". Which is taller?"}]}]),
]


def pattern_pixels(grids):
    n = sum(t * h * w for t, h, w in grids) * PATCH_VALUES
    i = torch.arange(n, dtype=torch.int64)
    return (((i * 7919) % 2001 - 1000).float() / 1000.0).reshape(-1, PATCH_VALUES)


def build(tok, tok_dir, models_dir):
    ids = special_ids(tok)
    text = dict(vocab_size=len(tok), hidden_size=64, intermediate_size=128, head_dim=32,
                num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                rms_norm_eps=1e-6, rope_theta=5000000.0, max_position_embeddings=4096,
                hidden_act="silu", attention_bias=False, tie_word_embeddings=True,
                num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                decoder_sparse_step=1, mlp_only_layers=[1], norm_topk_prob=True,
                rope_scaling={"rope_type": "default", "mrope_section": [6, 5, 5],
                              "mrope_interleaved": True})
    vision = dict(depth=4, hidden_size=32, intermediate_size=64, num_heads=2, in_channels=3,
                  patch_size=16, spatial_merge_size=2, temporal_patch_size=2,
                  out_hidden_size=64, num_position_embeddings=36,
                  deepstack_visual_indexes=[1, 2], hidden_act="gelu_pytorch_tanh")
    config = Qwen3VLMoeConfig(text_config=text, vision_config=vision,
                              image_token_id=ids["<|image_pad|>"],
                              video_token_id=ids["<|video_pad|>"],
                              vision_start_token_id=ids["<|vision_start|>"],
                              vision_end_token_id=ids["<|vision_end|>"],
                              tie_word_embeddings=True)
    config.text_config.bos_token_id = ids["<|endoftext|>"]
    config.text_config.eos_token_id = ids["<|im_end|>"]
    config.text_config.pad_token_id = ids["<|endoftext|>"]
    model = Qwen3VLMoeForConditionalGeneration(config)
    init_params(model, SEED)
    # init_params takes a 3-D tensor's fan-in over both trailing dims; the
    # fused experts multiply x @ W[e], so theirs is the middle one.
    gen = torch.Generator().manual_seed(SEED + 1)
    for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
        if name.endswith("experts.gate_up_proj") or name.endswith("experts.down_proj"):
            gain = 3.0 if name.endswith("down_proj") else 1.0
            with torch.no_grad():
                p.copy_(torch.randn(p.shape, generator=gen) * (gain / p.shape[1] ** 0.5))
    model.tie_weights()
    # bf16 weights keep the files small; the goldens compute in fp32 from them.
    model.to(torch.bfloat16)
    out = os.path.join(models_dir, NAME)
    if os.path.exists(out):
        shutil.rmtree(out)
    model.save_pretrained(out, safe_serialization=True, max_shard_size="300KB")
    write_json(os.path.join(out, "preprocessor_config.json"), PREPROCESSOR_CONFIG)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(tok_dir, f), os.path.join(out, f))
    return out


def goldens(path, tok, gdir):
    model = Qwen3VLMoeForConditionalGeneration.from_pretrained(
        path, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    tensors = {}
    for suffix, grids in (("", [IMAGE_GRID]), (".two_images", [IMAGE_GRID, SECOND_GRID])):
        with torch.no_grad():
            vout, deepstack = model.model.visual(pattern_pixels(grids),
                                                 grid_thw=torch.tensor(grids))
        tensors["vision_out" + suffix] = vout.float()
        for k, d in enumerate(deepstack):
            tensors[f"vision_deepstack{k}{suffix}"] = d.float()
    chats = []
    for chat_name, messages in CHATS:
        text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        grids = [IMAGE_GRID, SECOND_GRID][:text.count("<|image_pad|>")]
        # Expand each <|image_pad|> to its token count, as the processor does.
        parts = text.split("<|image_pad|>")
        expanded = parts[0] + "".join("<|image_pad|>" * (t * h * w // 4) + p
                                      for (t, h, w), p in zip(grids, parts[1:]))
        enc = tok(expanded, return_tensors="pt")
        inputs = dict(enc)
        grid = torch.tensor(grids) if grids else None
        if grids:
            inputs.update(pixel_values=pattern_pixels(grids), image_grid_thw=grid)
        with torch.no_grad():
            pos, delta = model.model.get_rope_index(inputs["input_ids"], grid, None,
                                                    inputs["attention_mask"])
            logits = model(**inputs).logits[0].float()
        tensors[f"logits_last.{chat_name}"] = logits[-1]
        new, chosen, margins = generate_greedy(model, tok, inputs, N_NEW)
        print(f"  {NAME} {chat_name}: {len(set(new))} distinct, min margin {min(margins):.4f}")
        chats.append({"name": chat_name, "greedy_ids": new, "greedy_text": tok.decode(new),
                      "greedy_top2_margin": margins, "rendered": expanded,
                      "input_ids": inputs["input_ids"][0].tolist(),
                      "image_grid_thw": grids,
                      "position_ids": pos[:, 0].tolist(), "rope_delta": int(delta.flatten()[0])})
    write_safetensors(os.path.join(gdir, "mm_golden.safetensors"), tensors,
                      {"model": NAME, "seed": SEED})
    write_json(os.path.join(gdir, "mm_golden.json"), {
        "about": ("Qwen3VLMoeForConditionalGeneration (transformers %s), fp32 from bf16 "
                  "weights, eager. Vision tower on the pattern image of grid %s: vision_out "
                  "[tokens, 64] and vision_deepstack<k>; on it and a second image of grid %s "
                  "in one call (the pattern continued): the same with the suffix .two_images. "
                  "Chats: ids with image pads expanded, "
                  "get_rope_index positions and delta, last logits, greedy %d tokens with eos "
                  "masked." % (transformers.__version__, IMAGE_GRID, SECOND_GRID, N_NEW)),
        "model": NAME,
        "image_grid_thw": IMAGE_GRID,
        "second_image_grid_thw": SECOND_GRID,
        "chats": chats,
    })


def main():
    torch.manual_seed(0)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    transformers.logging.set_verbosity_error()
    testdata = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "model", "testdata")
    tok_dir = os.path.join(testdata, "tokenizer")
    tok = Qwen2TokenizerFast.from_pretrained(tok_dir)
    path = build(tok, tok_dir, os.path.join(testdata, "models"))
    os.makedirs(os.path.join(testdata, "goldens", NAME), exist_ok=True)
    goldens(path, tok, os.path.join(testdata, "goldens", NAME))


if __name__ == "__main__":
    main()
