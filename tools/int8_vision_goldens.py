#!/usr/bin/env python3
"""Generates model/testdata/int8_goldens/<model>/vision_<scheme>.safetensors.

The vision tower's --quantize=int8 (and int8_g32) quantizes every linear layer
of the tower at load (model/vision_tower.h, VisionTowerOptions::int8_group):
the patch embedding (its [embed, 3, 2, 14, 14] kernel as an [embed, 1176]
matrix), each block's attn.qkv, attn.proj, mlp.fc1 and mlp.fc2, and the
merger's two layers, with the scheme of tools/int8_goldens.py (the same
dequantize_int8). This script applies it to the committed tiny checkpoints
and runs transformers 4.57.6's model.visual in fp32 on the two images the
fp32 vision golden uses (pixel_values.square56 and .rect300x200 from
model/testdata/goldens/image_processor.safetensors, grids [1,4,4] and
[1,6,8], in one call). Writes vision_out.<scheme> [16, hidden] f32, and for
information the largest change quantization itself causes against the
unquantized tower (in the metadata).

Usage (venv as in tools/README.md; reads model/testdata/):
  python tools/int8_vision_goldens.py [--out model/testdata/int8_goldens]
"""

import argparse
import os
import sys

import torch
import transformers
from safetensors.torch import load_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from golden_util import load_model, write_safetensors  # noqa: E402
from int8_goldens import MODELS, SCHEMES, dequantize_int8  # noqa: E402

IMAGES = ["square56", "rect300x200"]
GRIDS = [[1, 4, 4], [1, 6, 8]]
LINEARS = ("attn.qkv", "attn.proj", "mlp.fc1", "mlp.fc2")


def quantize_visual(visual, group):
    with torch.no_grad():
        conv = visual.patch_embed.proj.weight
        conv.copy_(dequantize_int8(conv.float().reshape(conv.shape[0], -1), group).view_as(conv))
        mods = [block.get_submodule(name) for block in visual.blocks for name in LINEARS]
        mods += [visual.merger.mlp[0], visual.merger.mlp[2]]
        for mod in mods:
            mod.weight.copy_(dequantize_int8(mod.weight.float(), group))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    here = os.path.dirname(os.path.abspath(__file__))
    data = os.path.join(here, "..", "model", "testdata")
    ap.add_argument("--out", default=os.path.join(data, "int8_goldens"))
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    transformers.logging.set_verbosity_error()
    pixels_file = load_file(os.path.join(data, "goldens", "image_processor.safetensors"))
    pixels = torch.cat([pixels_file[f"pixel_values.{n}"] for n in IMAGES]).float()
    grid = torch.tensor(GRIDS)
    for name in MODELS:
        path = os.path.join(data, "models", name)
        with torch.no_grad():
            base = load_model(path, torch.float32).model.visual(pixels, grid_thw=grid).float()
        for scheme, group in SCHEMES.items():
            model = load_model(path, torch.float32)
            quantize_visual(model.model.visual, group)
            with torch.no_grad():
                out = model.model.visual(pixels, grid_thw=grid).float()
            shift = float((out - base).abs().max())
            print(f"  {name} {scheme}: max |vision int8 - fp32| {shift:.5f}, "
                  f"max |out| {float(out.abs().max()):.4f}")
            write_safetensors(
                os.path.join(args.out, name, f"vision_{scheme}.safetensors"),
                {f"vision_out.{scheme}": out},
                {"model": name, "scheme": scheme, "group": str(group),
                 "images": "+".join(IMAGES), "quantization_shift": f"{shift:.6f}",
                 "about": "transformers fp32 model.visual on the tower with every linear layer "
                          "replaced by its int8 dequantization (tools/int8_vision_goldens.py)"})
            del model


if __name__ == "__main__":
    main()
