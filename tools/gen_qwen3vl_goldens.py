#!/usr/bin/env python3
"""A tiny random Qwen3-VL checkpoint and its transformers goldens.

Writes model/testdata/models/qwen3vl-tiny/ (the tiny tokenizer of
model/testdata/tokenizer, a patch-16 preprocessor) and
model/testdata/goldens/qwen3vl-tiny/mm_golden.{json,safetensors}: the
vision tower on two images of different sizes in one call (pixel values,
merged output and one DeepStack feature per deepstack index), and image
chats with one and two images of that batch, a video chat, a text chat and
an image-then-video chat
(ids, grids, M-RoPE positions, last logits, greedy tokens).

What the model exercises: the Qwen3 decoder (explicit head_dim 32, q/k
RMSNorm, no biases, tied embeddings) with interleaved M-RoPE (sections
[6, 5, 5] of 16 pairs: t h w ... then a trailing t pair) and DeepStack
(features added after layers 0 and 1 of 3); the tower's learned position
embeddings (a 6x6 grid, bilinearly interpolated down to a 4x4 and up to a
6x8 patch grid), patch embedding with bias, LayerNorm blocks with the
GELU(tanh) MLP, the merger and the post-shuffle-norm DeepStack mergers on
blocks 1 and 2 of 4.

  /work/venv-ml/bin/python tools/gen_qwen3vl_goldens.py  # versions: tools/requirements.txt
"""
import json
import os
import shutil
import sys

import torch
import transformers
from PIL import Image
from transformers import (Qwen2TokenizerFast, Qwen2VLImageProcessor, Qwen3VLConfig,
                          Qwen3VLForConditionalGeneration)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_goldens import SEED, init_params  # noqa: E402
from golden_util import generate_greedy, special_ids, write_json, write_safetensors  # noqa: E402
from vision_goldens import VISION_BATCH  # noqa: E402

NAME = "qwen3vl-tiny"
# Chats on the images of VISION_BATCH only, so that their pixel values are
# rows of the vision batch's (each image is preprocessed on its own).
MM_CHATS = [
    ("one_image", ["rect300x200"],
     [{"role": "user", "content": [{"type": "image"},
                                   {"type": "text", "text": "Describe this image."}]}]),
    ("two_images", ["rect300x200", "square56"],
     [{"role": "user", "content": [{"type": "text", "text": "Compare "}, {"type": "image"},
                                   {"type": "text", "text": " and "}, {"type": "image"},
                                   {"type": "text", "text": ". Which is wider?"}]}]),
]
N_NEW = 16
# Qwen3-VL's processor: patch 16, merge 2 (32-pixel units), mean/std 0.5.
PREPROCESSOR_CONFIG = {
    "image_processor_type": "Qwen2VLImageProcessor", "do_resize": True, "do_rescale": True,
    "rescale_factor": 1 / 255, "do_normalize": True, "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5], "do_convert_rgb": True, "min_pixels": 4096,
    "max_pixels": 16384, "patch_size": 16, "temporal_patch_size": 2, "merge_size": 2,
}


def build(tok, tok_dir, models_dir):
    ids = special_ids(tok)
    text = dict(vocab_size=len(tok), hidden_size=64, intermediate_size=128, head_dim=32,
                num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                rms_norm_eps=1e-6, rope_theta=5000000.0, max_position_embeddings=4096,
                hidden_act="silu", attention_bias=False, tie_word_embeddings=True,
                rope_scaling={"rope_type": "default", "mrope_section": [6, 5, 5],
                              "mrope_interleaved": True})
    vision = dict(depth=4, hidden_size=32, intermediate_size=64, num_heads=2, in_channels=3,
                  patch_size=16, spatial_merge_size=2, temporal_patch_size=2,
                  out_hidden_size=64, num_position_embeddings=36,
                  deepstack_visual_indexes=[1, 2], hidden_act="gelu_pytorch_tanh")
    config = Qwen3VLConfig(text_config=text, vision_config=vision,
                           image_token_id=ids["<|image_pad|>"],
                           video_token_id=ids["<|video_pad|>"],
                           vision_start_token_id=ids["<|vision_start|>"],
                           vision_end_token_id=ids["<|vision_end|>"],
                           tie_word_embeddings=True)
    config.text_config.bos_token_id = ids["<|endoftext|>"]
    config.text_config.eos_token_id = ids["<|im_end|>"]
    config.text_config.pad_token_id = ids["<|endoftext|>"]
    model = Qwen3VLForConditionalGeneration(config)
    init_params(model, SEED)
    model.tie_weights()
    # bf16 weights keep the files small; the goldens compute in fp32 from them.
    model.to(torch.bfloat16)
    out = os.path.join(models_dir, NAME)
    if os.path.exists(out):
        shutil.rmtree(out)
    model.save_pretrained(out, safe_serialization=True)
    write_json(os.path.join(out, "preprocessor_config.json"), PREPROCESSOR_CONFIG)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(tok_dir, f), os.path.join(out, f))
    return out


def goldens(path, tok, images, gdir):
    model = Qwen3VLForConditionalGeneration.from_pretrained(
        path, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    proc = Qwen2VLImageProcessor.from_dict(PREPROCESSOR_CONFIG)
    visual = model.model.visual
    feats = proc(images=[images[n] for n in VISION_BATCH], return_tensors="pt")
    with torch.no_grad():
        vout, deepstack = visual(feats["pixel_values"], grid_thw=feats["image_grid_thw"])
    key = "fp32." + "+".join(VISION_BATCH)
    tensors = {f"pixel_values.{key}": feats["pixel_values"].float(),
               f"vision_out.{key}": vout.float()}
    for k, d in enumerate(deepstack):
        tensors[f"vision_deepstack{k}.{key}"] = d.float()
    chats = []
    for chat_name, img_names, messages in MM_CHATS:
        text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        imgs = [images[n] for n in img_names]
        f = proc(images=imgs, return_tensors="pt")
        # Expand each <|image_pad|> to its token count, as the processor does.
        parts, counts = text.split("<|image_pad|>"), [int(g.prod()) // 4 for g in f["image_grid_thw"]]
        expanded = parts[0] + "".join("<|image_pad|>" * c + p for c, p in zip(counts, parts[1:]))
        enc = tok(expanded, return_tensors="pt")
        inputs = dict(enc, pixel_values=f["pixel_values"], image_grid_thw=f["image_grid_thw"])
        with torch.no_grad():
            pos, delta = model.model.get_rope_index(inputs["input_ids"], inputs["image_grid_thw"],
                                                    None, inputs["attention_mask"])
            logits = model(**inputs).logits[0].float()
        n0 = int(feats["image_grid_thw"][0].prod())
        rows = {VISION_BATCH[0]: feats["pixel_values"][:n0],
                VISION_BATCH[1]: feats["pixel_values"][n0:]}
        assert torch.equal(f["pixel_values"], torch.cat([rows[n] for n in img_names]))
        tensors[f"logits_last.fp32.{chat_name}"] = logits[-1]
        new, chosen, margins = generate_greedy(model, tok, inputs, N_NEW)
        print(f"  {NAME} {chat_name}: {len(set(new))} distinct, min margin {min(margins):.4f}")
        chats.append({"name": chat_name, "compute_dtype": "fp32", "greedy_ids": new,
                      "greedy_text": tok.decode(new), "greedy_chosen_logit": chosen,
                      "greedy_top2_margin": margins,
                      "logits_last_argmax": int(logits[-1].argmax()), "images": img_names,
                      "rendered": text, "input_ids": inputs["input_ids"][0].tolist(),
                      "image_grid_thw": inputs["image_grid_thw"].tolist(),
                      "position_ids": pos[:, 0].tolist(), "rope_delta": int(delta.flatten()[0])})
    chats.append(video_chat(model, tok, tensors))
    chats.append(text_chat(model, tok, tensors))
    chats.append(image_video_chat(model, tok, proc, images["rect300x200"], tensors))
    write_safetensors(os.path.join(gdir, "mm_golden.safetensors"), tensors,
                      {"model": NAME, "seed": SEED})
    write_json(os.path.join(gdir, "mm_golden.json"), {
        "about": ("Qwen3VLForConditionalGeneration (transformers %s), fp32, eager. Vision "
                  "tower on images %s in ONE call: pixel_values, vision_out [tokens, 64] and "
                  "vision_deepstack<k> [tokens, 64] (deepstack_merger_list[k] on block "
                  "deepstack_visual_indexes[k]). Chats: ids with image pads expanded, "
                  "image_grid_thw (pixel values: the batch's rows of each image), get_rope_index positions and delta, "
                  "last logits, greedy %d tokens with eos masked. The video chat: "
                  "pixel_values_videos.video (a fixed pattern), video_grid_thw, the prompt "
                  "with per-temporal-patch timestamps as Qwen3VLProcessor writes it."
                  % (transformers.__version__, VISION_BATCH, N_NEW)),
        "model": NAME,
        "vision_batch": VISION_BATCH,
        "vision_batch_grid_thw": feats["image_grid_thw"].tolist(),
        "chats": chats,
    })


# A video chat: 2 temporal patches (4 frames sampled at 2 fps) of 4x4
# patches. Its pixel values are a fixed pattern (the tower does not care
# where they come from); the prompt places each temporal patch after its
# timestamp as Qwen3VLProcessor does.
VIDEO_GRID = [2, 4, 4]
VIDEO_FPS = 2.0


def image_video_chat(model, tok, proc, image, tensors):
    """An image, then a video, in one chat: the image's pads expanded, the
    video's temporal patches after their timestamps (as in video_chat)."""
    name = "image_video"
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "video"},
                                             {"type": "text", "text": "What changed?"}]}]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    f = proc(images=[image], return_tensors="pt")
    text = text.replace("<|image_pad|>", "<|image_pad|>" * (int(f["image_grid_thw"][0].prod()) // 4),
                        1)
    t, h, w = VIDEO_GRID
    gen = torch.Generator().manual_seed(SEED + 1)
    pixels = torch.randn(t * h * w, 3 * 2 * 16 * 16, generator=gen)
    frames = [i / VIDEO_FPS for i in range(2 * t)]
    stamps = [(frames[i] + frames[i + 1]) / 2 for i in range(0, 2 * t, 2)]
    placeholder = "".join(f"<{s:.1f} seconds><|vision_start|>" + "<|video_pad|>" * (h * w // 4)
                          + "<|vision_end|>" for s in stamps)
    block = "<|vision_start|><|video_pad|><|vision_end|>"
    assert block in text
    expanded = text.replace(block, placeholder, 1)
    enc = tok(expanded, return_tensors="pt")
    grid = torch.tensor([VIDEO_GRID])
    inputs = dict(enc, pixel_values=f["pixel_values"], image_grid_thw=f["image_grid_thw"],
                  pixel_values_videos=pixels, video_grid_thw=grid)
    with torch.no_grad():
        pos, delta = model.model.get_rope_index(inputs["input_ids"], f["image_grid_thw"], grid,
                                                inputs["attention_mask"])
        logits = model(**inputs).logits[0].float()
    tensors[f"pixel_values_videos.{name}"] = pixels
    tensors[f"logits_last.fp32.{name}"] = logits[-1]
    new, chosen, margins = generate_greedy(model, tok, inputs, N_NEW)
    print(f"  {NAME} {name}: {len(set(new))} distinct, min margin {min(margins):.4f}")
    return {"name": name, "compute_dtype": "fp32", "greedy_ids": new,
            "greedy_text": tok.decode(new), "greedy_chosen_logit": chosen,
            "greedy_top2_margin": margins, "logits_last_argmax": int(logits[-1].argmax()),
            "images": ["rect300x200"], "rendered": expanded,
            "input_ids": inputs["input_ids"][0].tolist(),
            "image_grid_thw": f["image_grid_thw"].tolist(), "video_grid_thw": [VIDEO_GRID],
            "position_ids": pos[:, 0].tolist(), "rope_delta": int(delta.flatten()[0])}


def text_chat(model, tok, tensors):
    name = "text"
    messages = [{"role": "user", "content": [{"type": "text", "text": "Name three shapes."}]}]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    inputs = dict(tok(text, return_tensors="pt"))
    with torch.no_grad():
        pos, delta = model.model.get_rope_index(inputs["input_ids"], None, None,
                                                inputs["attention_mask"])
        logits = model(**inputs).logits[0].float()
    tensors[f"logits_last.fp32.{name}"] = logits[-1]
    new, chosen, margins = generate_greedy(model, tok, inputs, N_NEW)
    print(f"  {NAME} {name}: {len(set(new))} distinct, min margin {min(margins):.4f}")
    return {"name": name, "compute_dtype": "fp32", "greedy_ids": new,
            "greedy_text": tok.decode(new), "greedy_chosen_logit": chosen,
            "greedy_top2_margin": margins, "logits_last_argmax": int(logits[-1].argmax()),
            "images": [], "rendered": text, "input_ids": inputs["input_ids"][0].tolist(),
            "image_grid_thw": [], "position_ids": pos[:, 0].tolist(),
            "rope_delta": int(delta.flatten()[0])}


def video_chat(model, tok, tensors):
    name = "video"
    messages = [{"role": "user", "content": [{"type": "video"},
                                             {"type": "text", "text": "What moves?"}]}]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    t, h, w = VIDEO_GRID
    gen = torch.Generator().manual_seed(SEED)
    pixels = torch.randn(t * h * w, 3 * 2 * 16 * 16, generator=gen)
    # Qwen3VLProcessor._calculate_timestamps: each temporal patch at the mean
    # time of its first and last frame.
    frames = [i / VIDEO_FPS for i in range(2 * t)]
    stamps = [(frames[i] + frames[i + 1]) / 2 for i in range(0, 2 * t, 2)]
    placeholder = "".join(f"<{s:.1f} seconds><|vision_start|>" + "<|video_pad|>" * (h * w // 4)
                          + "<|vision_end|>" for s in stamps)
    block = "<|vision_start|><|video_pad|><|vision_end|>"
    assert block in text
    expanded = text.replace(block, placeholder, 1)
    enc = tok(expanded, return_tensors="pt")
    grid = torch.tensor([VIDEO_GRID])
    inputs = dict(enc, pixel_values_videos=pixels, video_grid_thw=grid)
    with torch.no_grad():
        pos, delta = model.model.get_rope_index(inputs["input_ids"], None, grid,
                                                inputs["attention_mask"])
        logits = model(**inputs).logits[0].float()
    tensors[f"pixel_values_videos.{name}"] = pixels
    tensors[f"logits_last.fp32.{name}"] = logits[-1]
    new, chosen, margins = generate_greedy(model, tok, inputs, N_NEW)
    print(f"  {NAME} {name}: {len(set(new))} distinct, min margin {min(margins):.4f}")
    return {"name": name, "compute_dtype": "fp32", "greedy_ids": new,
            "greedy_text": tok.decode(new), "greedy_chosen_logit": chosen,
            "greedy_top2_margin": margins, "logits_last_argmax": int(logits[-1].argmax()),
            "images": [], "rendered": expanded, "input_ids": inputs["input_ids"][0].tolist(),
            "image_grid_thw": [], "video_grid_thw": [VIDEO_GRID],
            "position_ids": pos[:, 0].tolist(), "rope_delta": int(delta.flatten()[0])}


def main():
    torch.manual_seed(0)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    transformers.logging.set_verbosity_error()
    testdata = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "model", "testdata")
    tok_dir = os.path.join(testdata, "tokenizer")
    tok = Qwen2TokenizerFast.from_pretrained(tok_dir)
    images = {}
    for _, names, _ in MM_CHATS:
        for n in names + VISION_BATCH:
            img = Image.open(os.path.join(testdata, "goldens", "images", n + ".png"))
            img.load()
            images[n] = img
    path = build(tok, tok_dir, os.path.join(testdata, "models"))
    os.makedirs(os.path.join(testdata, "goldens", NAME), exist_ok=True)
    goldens(path, tok, images, os.path.join(testdata, "goldens", NAME))


if __name__ == "__main__":
    main()
