#!/usr/bin/env python3
"""Video goldens for the language side: the vision tower on video
pixel values, M-RoPE positions and greedy tokens of chats holding videos.

Reads the committed tiny checkpoints (model/testdata/models/, written by
gen_goldens.py) and the committed image goldens, and writes under
model/testdata/video_goldens/ (about 300 KB):

  video_pixels.safetensors          pixel_values_videos.<video> [t*h*w, 1176]
                                    float32, as Qwen2VLVideoProcessor makes them
                                    from the frame lists drawn here
  video_lm.json                     videos (frame count, size, grid_thw) and,
                                    per model, chats: rendered text, input_ids,
                                    grids, position_ids, rope_delta, 16 greedy ids
                                    (Qwen2.5-VL's also fps and second_per_grid_ts)
  <model>/video_lm.safetensors      vision_out.<videos> (tower on both videos
                                    in one call), logits_last.<chat>

The C++ tests feed the stored pixel values to the tower directly, so they do
not depend on the encoder's video preprocessing.

Usage (the venv of tools/README.md):
  python tools/gen_video_lm_goldens.py [--out model/testdata/video_goldens]
"""

import os
import sys

import numpy as np
import torch
from PIL import Image

from transformers import (AutoTokenizer, Qwen2_5_VLForConditionalGeneration,
                          Qwen2_5_VLProcessor, Qwen2VLImageProcessor, Qwen2VLProcessor,
                          Qwen2VLVideoProcessor)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from golden_util import (generate_greedy, load_model, start_script,  # noqa: E402
                         write_json, write_safetensors)
from vision_goldens import draw_image  # noqa: E402

SEED = 20261125
# Qwen2.5-VL (written by gen_qwen25vl_goldens.py) scales the M-RoPE time axis
# by second_per_grid_ts (temporal_patch_size / fps) and tokens_per_second.
MODELS = ["qwen2vl-tiny-mha-tied", "qwen2vl-tiny-gqa2-untied-sharded", "qwen25vl-tiny"]
N_NEW = 16
# Video pixel bounds (the tiny image bounds allow no frame under 56x56).
VIDEO_MIN_PIXELS = 28 * 28
VIDEO_MAX_PIXELS = 12544

# (name, frames, width, height): an even count, and an odd one (the processor
# repeats the last frame) whose time axis outgrows its grid (t 3 > h 1, w 2).
VIDEOS = [("clip4x56x56", 4, 56, 56), ("clip5x56x28", 5, 56, 28)]

# (name, videos, images, content). Images come from goldens/images/.
CHATS = [
    ("one_video", ["clip4x56x56"], [],
     [{"type": "video"}, {"type": "text", "text": "What happens here?"}]),
    ("video_and_image", ["clip5x56x28"], ["square56"],
     [{"type": "text", "text": "Compare "}, {"type": "video"}, {"type": "text", "text": " with "},
      {"type": "image"}, {"type": "text", "text": "."}]),
    ("two_videos", ["clip4x56x56", "clip5x56x28"], [],
     [{"type": "video"}, {"type": "text", "text": " then "}, {"type": "video"},
      {"type": "text", "text": " Which is longer?"}]),
]
# Chats only the Qwen2.5-VL model gets, with the processor's fps (the frames
# are given as they are; fps only sets second_per_grid_ts): 1 fps gives two
# seconds per temporal patch, 4 fps half a second (transformers truncates it
# to 0: every temporal patch at one time position).
FPS_CHATS = [
    ("one_video_fps1", ["clip5x56x28"], [], 1.0,
     [{"type": "video"}, {"type": "text", "text": "What happens here?"}]),
    ("video_and_image_fps4", ["clip4x56x56"], ["square56"], 4.0,
     [{"type": "text", "text": "Compare "}, {"type": "video"}, {"type": "text", "text": " with "},
      {"type": "image"}, {"type": "text", "text": "."}]),
]


def draw_frames(name, n, w, h, seed):
    """n frames: one drawn picture shifted a few pixels per frame."""
    rng = np.random.default_rng(seed)
    base = np.asarray(draw_image(name, w, h, "RGB", rng))
    return np.stack([np.roll(base, shift=(2 * i, 3 * i), axis=(0, 1)) for i in range(n)])


def main():
    out, models_dir = start_script(__doc__, "video_goldens")
    testdata = os.path.dirname(models_dir)
    tok = AutoTokenizer.from_pretrained(os.path.join(models_dir, MODELS[0]))
    image_proc = Qwen2VLImageProcessor.from_pretrained(os.path.join(models_dir, MODELS[0]))
    video_proc = Qwen2VLVideoProcessor(
        min_pixels=VIDEO_MIN_PIXELS, max_pixels=VIDEO_MAX_PIXELS,
        image_mean=image_proc.image_mean, image_std=image_proc.image_std)
    processors = {
        cls: cls(image_processor=image_proc, tokenizer=tok, video_processor=video_proc,
                 chat_template=tok.chat_template)
        for cls in (Qwen2VLProcessor, Qwen2_5_VLProcessor)}

    frames, pixels, videos = {}, {}, []
    for i, (name, n, w, h) in enumerate(VIDEOS):
        frames[name] = draw_frames(name, n, w, h, SEED + i)
        feats = video_proc(videos=[frames[name]], return_tensors="pt")
        pixels[f"pixel_values_videos.{name}"] = feats["pixel_values_videos"].float()
        videos.append({"name": name, "frames": n, "width": w, "height": h,
                       "grid_thw": feats["video_grid_thw"][0].tolist(),
                       "num_patches": int(feats["pixel_values_videos"].shape[0])})
    write_safetensors(os.path.join(out, "video_pixels.safetensors"), pixels, {"seed": SEED})

    images = {}
    for chat in CHATS + FPS_CHATS:
        for n in chat[2]:
            images[n] = Image.open(os.path.join(testdata, "goldens", "images", n + ".png"))
            images[n].load()

    per_model = {}
    for model_name in MODELS:
        qwen25 = model_name.startswith("qwen25vl")
        if qwen25:
            model = Qwen2_5_VLForConditionalGeneration.from_pretrained(
                os.path.join(models_dir, model_name), dtype=torch.float32,
                attn_implementation="eager")
            model.eval()
        else:
            model = load_model(os.path.join(models_dir, model_name), torch.float32)
        processor = processors[Qwen2_5_VLProcessor if qwen25 else Qwen2VLProcessor]
        tensors, chats = {}, []
        names = [v[0] for v in VIDEOS]
        batch = video_proc(videos=[frames[n] for n in names], return_tensors="pt")
        with torch.no_grad():
            vout = model.model.visual(batch["pixel_values_videos"],
                                      grid_thw=batch["video_grid_thw"])
        tensors["vision_out." + "+".join(names)] = vout.float()
        chats_here = [(n, v, i, None, c) for n, v, i, c in CHATS]
        if qwen25:
            chats_here += FPS_CHATS
        for chat_name, vids, imgs, fps, content in chats_here:
            messages = [{"role": "user", "content": content}]
            text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            kwargs = {} if fps is None else {"fps": fps}
            inputs = processor(text=[text], videos=[frames[n] for n in vids],
                               images=[images[n] for n in imgs] or None, return_tensors="pt",
                               **kwargs)
            with torch.no_grad():
                if qwen25:
                    pos, delta = model.model.get_rope_index(
                        inputs["input_ids"], inputs.get("image_grid_thw"),
                        inputs["video_grid_thw"], inputs["second_per_grid_ts"],
                        inputs["attention_mask"])
                else:
                    pos, delta = model.model.get_rope_index(
                        inputs["input_ids"], inputs.get("image_grid_thw"),
                        inputs["video_grid_thw"], inputs["attention_mask"])
                logits = model(**inputs).logits[0].float()
            tensors[f"logits_last.{chat_name}"] = logits[-1]
            new, _, margins = generate_greedy(model, tok, inputs, N_NEW)
            print(f"  {model_name} {chat_name}: min margin {min(margins):.4f}")
            chats.append({
                "name": chat_name, "videos": vids, "images": imgs, "rendered": text,
                "input_ids": inputs["input_ids"][0].tolist(),
                "video_grid_thw": inputs["video_grid_thw"].tolist(),
                "image_grid_thw": inputs["image_grid_thw"].tolist() if imgs else [],
                "position_ids": pos[:, 0].tolist(), "rope_delta": int(delta.flatten()[0]),
                "greedy_ids": new, "greedy_top2_margin": margins,
            })
            if qwen25:
                chats[-1]["fps"] = fps
                chats[-1]["second_per_grid_ts"] = inputs["second_per_grid_ts"].tolist()
        write_safetensors(os.path.join(out, model_name, "video_lm.safetensors"), tensors,
                          {"model": model_name, "seed": SEED})
        per_model[model_name] = chats
        del model

    write_json(os.path.join(out, "video_lm.json"), {
        "about": ("transformers %s Qwen2-VL on the tiny checkpoints, fp32. Videos are frame "
                  "lists (uint8 RGB drawn here) through Qwen2VLVideoProcessor(min_pixels=%d, "
                  "max_pixels=%d, image mean/std of the tiny preprocessor_config); an odd frame "
                  "count repeats the last frame. video_pixels.safetensors: "
                  "pixel_values_videos.<name> [t*h*w, 3*2*14*14]. <model>/video_lm.safetensors: "
                  "vision_out.<v1>+<v2> = model.visual on both videos in one call (grid_thw "
                  "stacked), logits_last.<chat> [vocab]. Chats: processor(text=chat template, "
                  "videos, images) expands each <|video_pad|> to t*h*w/4 copies; position_ids "
                  "[3][L] from get_rope_index(ids, image_grid_thw, video_grid_thw); rope_delta "
                  "as in mm_golden.json; greedy_ids: 16 greedy tokens (eos masked). qwen25vl-tiny: "
                  "Qwen2_5_VLProcessor (fps: the processor's, null for its default 2), "
                  "get_rope_index(ids, image_grid_thw, video_grid_thw, second_per_grid_ts)."
                  % (__import__("transformers").__version__, VIDEO_MIN_PIXELS,
                     VIDEO_MAX_PIXELS)),
        "video_min_pixels": VIDEO_MIN_PIXELS, "video_max_pixels": VIDEO_MAX_PIXELS,
        "videos": videos,
        "models": per_model,
    })


if __name__ == "__main__":
    main()
