#!/usr/bin/env python3
"""Writes model/testdata/images/*: small real image files of every accepted
format; for each, the RGB pixels the reference pipeline decodes
(PIL + transformers.image_transforms.convert_to_rgb, which in transformers
4.57 is PIL convert("RGB"): alpha is dropped, not composited), as raw interleaved uint8 files "<name>.rgb"; and preprocessing goldens from
Qwen2VLImageProcessor for a few sizes and pixel bounds: "<case>.resized.rgb"
(PIL's bicubic resize, uint8), "<case>.pixels.f32" (pixel_values, float32
little-endian) and "preprocess_cases.json" (inputs, configs, grid_thw).

Run with the tools venv (see tools/README.md):
  python tools/gen_image_goldens.py
Deterministic: re-running rewrites identical files.
"""
import json
import os

import numpy as np
from PIL import Image, ImageDraw
from transformers import Qwen2VLImageProcessor
from transformers.image_transforms import convert_to_rgb

OUT = os.path.join(os.path.dirname(__file__), "..", "model", "testdata", "images")


def scene(w, h):
    im = Image.new("RGB", (w, h), (30, 60, 90))
    d = ImageDraw.Draw(im)
    d.rectangle([w // 8, h // 8, w // 2, h // 2], fill=(220, 40, 40))
    d.ellipse([w // 2, h // 3, w - 4, h - 4], fill=(40, 200, 80))
    return im


def main():
    os.makedirs(OUT, exist_ok=True)
    im = scene(64, 48)
    im.save(f"{OUT}/rgb.png")
    im.save(f"{OUT}/baseline.jpg", quality=90)
    im.save(f"{OUT}/progressive.jpg", quality=90, progressive=True)
    im.save(f"{OUT}/rgb.bmp")
    rgba = scene(40, 30).convert("RGBA")
    px = rgba.load()
    for y in range(30):
        for x in range(40):
            r, g, b, _ = px[x, y]
            px[x, y] = (r, g, b, (x * 255) // 39)  # alpha ramp 0..255
    rgba.save(f"{OUT}/rgba.png")
    im.convert("P", palette=Image.ADAPTIVE, colors=8).save(f"{OUT}/palette.png")
    im.convert("L").save(f"{OUT}/gray.png")
    g16 = Image.new("I;16", (16, 8))
    g16.putdata([(i * 4099) % 65536 for i in range(128)])
    g16.save(f"{OUT}/gray16.png")
    f1 = scene(32, 24)
    f2 = Image.new("RGB", (32, 24), (255, 255, 0))
    f1.save(f"{OUT}/anim.gif", save_all=True, append_images=[f2], duration=100, loop=0)

    # What the reference decodes (first frame for GIF).
    for name in ["rgb.png", "baseline.jpg", "progressive.jpg", "rgb.bmp", "rgba.png",
                 "palette.png", "gray.png", "anim.gif"]:
        with Image.open(f"{OUT}/{name}") as src:
            rgb = np.asarray(convert_to_rgb(src), dtype=np.uint8)
        rgb.tofile(f"{OUT}/{name}.rgb")
        print(name, rgb.shape)

    # Preprocessing: (case, source image, min_pixels, max_pixels).
    wide = scene(200, 20)
    wide.save(f"{OUT}/wide.png")
    cases = [
        ("up", "rgb.png", 56 * 56 * 4, 28 * 28 * 1280),    # upscale to reach min_pixels
        ("down", "rgb.png", 56 * 56, 28 * 28 * 2),         # downscale under max_pixels
        ("default", "gray.png", 56 * 56, 28 * 28 * 1280),  # the default bounds
        ("wide", "wide.png", 56 * 56, 28 * 28 * 1280),     # 10:1 aspect ratio
    ]
    meta = []
    for case, src_name, min_px, max_px in cases:
        with Image.open(f"{OUT}/{src_name}") as src:
            rgb = convert_to_rgb(src)
            rgb.load()
        proc = Qwen2VLImageProcessor(min_pixels=min_px, max_pixels=max_px)
        out = proc(images=[rgb], return_tensors="np")
        grid = [int(v) for v in out["image_grid_thw"][0]]
        h, w = grid[1] * proc.patch_size, grid[2] * proc.patch_size
        np.asarray(rgb.resize((w, h), resample=Image.BICUBIC), dtype=np.uint8).tofile(
            f"{OUT}/{case}.resized.rgb")
        out["pixel_values"].astype("<f4").tofile(f"{OUT}/{case}.pixels.f32")
        meta.append({"case": case, "image": src_name, "min_pixels": min_px,
                     "max_pixels": max_px, "grid_thw": grid,
                     "resized_hw": [h, w], "patches": list(out["pixel_values"].shape)})
        print(case, grid, out["pixel_values"].shape)
    with open(f"{OUT}/preprocess_cases.json", "w") as f:
        json.dump(meta, f, indent=1, sort_keys=True)


if __name__ == "__main__":
    main()
