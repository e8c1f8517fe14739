#!/usr/bin/env python3
"""A tiny random Qwen2.5-VL checkpoint and its transformers goldens.

Writes model/testdata/models/qwen25vl-tiny/ (the tiny tokenizer and
preprocessor of the Qwen2-VL tiny models) and
model/testdata/goldens/qwen25vl-tiny/mm_golden.{json,safetensors} in the
layout of vision_goldens.py: the vision tower on two images in one call
(patch embedding, first block, merged output), and chats (ids, M-RoPE
positions, last logits, greedy tokens): the image chats of the Qwen2-VL
goldens and a text chat (the Qwen2 decoder with M-RoPE, no media). The images are the committed ones
under model/testdata/goldens/images/ (written by gen_goldens.py).

What the model exercises beyond Qwen2-VL's tower: RMSNorm in the blocks and
the merger, the gated SiLU MLP with biases, window attention (window_size 56:
windows of 2x2 merged tokens, so both images need padded windows) with full
attention in blocks 1 and 3, the window permutation and its inverse, and a
merger output width (128) other than the tower's (64).

  python3 tools/gen_qwen25vl_goldens.py   # versions: tools/requirements.txt
"""
import json
import os
import shutil
import sys

import torch
import transformers
from PIL import Image
from transformers import (Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration,
                          Qwen2TokenizerFast, Qwen2VLImageProcessor)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_goldens import PREPROCESSOR_CONFIG, SEED, init_params  # noqa: E402
from golden_util import (generate_greedy, special_ids, write_json,  # noqa: E402
                         write_safetensors)
from vision_goldens import MM_CHATS, VISION_BATCH  # noqa: E402

NAME = "qwen25vl-tiny"
N_NEW = 16
# The image chats of the Qwen2-VL goldens, then a text chat.
CHATS = MM_CHATS + [
    ("text", [], [{"role": "user", "content": [{"type": "text", "text": "Name three colors."}]}]),
]


def build(tok, tok_dir, models_dir):
    ids = special_ids(tok)
    text = dict(vocab_size=len(tok), hidden_size=128, intermediate_size=256,
                num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                rms_norm_eps=1e-6, rope_theta=1000000.0, max_position_embeddings=4096,
                tie_word_embeddings=False, rope_scaling={"type": "mrope",
                                                         "mrope_section": [4, 6, 6]})
    vision = dict(depth=4, hidden_size=64, intermediate_size=96, num_heads=4, in_channels=3,
                  patch_size=14, spatial_merge_size=2, temporal_patch_size=2,
                  tokens_per_second=2, window_size=56, out_hidden_size=128,
                  fullatt_block_indexes=[1, 3], hidden_act="silu")
    config = Qwen2_5_VLConfig(text_config=text, vision_config=vision,
                              image_token_id=ids["<|image_pad|>"],
                              video_token_id=ids["<|video_pad|>"],
                              vision_start_token_id=ids["<|vision_start|>"],
                              vision_end_token_id=ids["<|vision_end|>"],
                              bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"],
                              pad_token_id=ids["<|endoftext|>"], **text)
    model = Qwen2_5_VLForConditionalGeneration(config)
    init_params(model, SEED)
    out = os.path.join(models_dir, NAME)
    if os.path.exists(out):
        shutil.rmtree(out)
    model.save_pretrained(out, safe_serialization=True)
    write_json(os.path.join(out, "preprocessor_config.json"), PREPROCESSOR_CONFIG)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(tok_dir, f), os.path.join(out, f))
    return out


def goldens(path, tok, images, gdir):
    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(
        path, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    proc = Qwen2VLImageProcessor.from_dict(PREPROCESSOR_CONFIG)
    visual = model.model.visual
    feats = proc(images=[images[n] for n in VISION_BATCH], return_tensors="pt")
    acts = {}
    hooks = [visual.patch_embed.register_forward_hook(
                 lambda m, i, o: acts.__setitem__("patch_embed", o)),
             visual.blocks[0].register_forward_hook(
                 lambda m, i, o: acts.__setitem__("block0", o))]
    with torch.no_grad():
        vout = visual(feats["pixel_values"], grid_thw=feats["image_grid_thw"])
    for hk in hooks:
        hk.remove()
    # block0's output is in window order; store it in patch order (the
    # tower's input order) by undoing the permutation of merge groups.
    window_index, _ = visual.get_window_index(feats["image_grid_thw"])
    unit = visual.spatial_merge_unit
    b0 = acts["block0"].reshape(-1, unit, acts["block0"].shape[-1])
    b0 = b0[torch.argsort(window_index)].reshape(-1, b0.shape[-1])
    key = "fp32." + "+".join(VISION_BATCH)
    tensors = {f"vision_out.{key}": vout.float(),
               f"vision_patch_embed.{key}": acts["patch_embed"].float(),
               f"vision_block0.{key}": b0.float()}
    chats = []
    for chat_name, img_names, messages in CHATS:
        text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        inputs = dict(tok(text, return_tensors="pt"))
        grid = None
        if img_names:
            f = proc(images=[images[n] for n in img_names], return_tensors="pt")
            # Expand each <|image_pad|> to its token count, as the processor does.
            grid = f["image_grid_thw"]
            parts, counts = text.split("<|image_pad|>"), [int(g.prod()) // 4 for g in grid]
            expanded = parts[0] + "".join("<|image_pad|>" * c + p
                                          for c, p in zip(counts, parts[1:]))
            inputs = dict(tok(expanded, return_tensors="pt"), pixel_values=f["pixel_values"],
                          image_grid_thw=grid)
        with torch.no_grad():
            pos, delta = model.model.get_rope_index(inputs["input_ids"], grid, None, None,
                                                    inputs["attention_mask"])
            logits = model(**inputs).logits[0].float()
            if grid is not None:
                # The tower on the chat's images in one call: the rows its
                # image pads get.
                tensors[f"vision_out.fp32.{chat_name}"] = visual(
                    inputs["pixel_values"], grid_thw=grid).float()
        tensors[f"logits_last.fp32.{chat_name}"] = logits[-1]
        new, chosen, margins = generate_greedy(model, tok, inputs, N_NEW)
        print(f"  {NAME} {chat_name}: {len(set(new))} distinct, min margin {min(margins):.4f}")
        chats.append({"name": chat_name, "compute_dtype": "fp32", "greedy_ids": new,
                      "greedy_text": tok.decode(new), "greedy_chosen_logit": chosen,
                      "greedy_top2_margin": margins,
                      "logits_last_argmax": int(logits[-1].argmax()), "images": img_names,
                      "messages": messages, "rendered": text,
                      "input_ids": inputs["input_ids"][0].tolist(),
                      "image_grid_thw": grid.tolist() if grid is not None else [],
                      "position_ids": pos[:, 0].tolist(), "rope_delta": int(delta.flatten()[0])})
    write_safetensors(os.path.join(gdir, "mm_golden.safetensors"), tensors,
                      {"model": NAME, "seed": SEED})
    write_json(os.path.join(gdir, "mm_golden.json"), {
        "about": ("Qwen2_5_VLForConditionalGeneration (transformers %s), fp32, eager. Vision "
                  "tower on images %s in ONE call: vision_out [tokens, 128] in patch order "
                  "(after the merger and the inverse window permutation), vision_patch_embed "
                  "and vision_block0 [patches, 64] in patch order (block0 un-permuted from "
                  "window order here); vision_out.fp32.<chat>: the tower on a chat's images. "
                  "Chats as in the Qwen2-VL mm goldens, then a text chat; "
                  "greedy %d tokens, eos masked."
                  % (transformers.__version__, VISION_BATCH, N_NEW)),
        "model": NAME,
        "vision_batch": VISION_BATCH,
        "vision_batch_grid_thw": feats["image_grid_thw"].tolist(),
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
    images = {}
    for _, names, _ in CHATS:
        for n in names + VISION_BATCH:
            img = Image.open(os.path.join(testdata, "goldens", "images", n + ".png"))
            img.load()
            images[n] = img
    path = build(tok, tok_dir, os.path.join(testdata, "models"))
    goldens(path, tok, images, os.path.join(testdata, "goldens", NAME))


if __name__ == "__main__":
    main()
