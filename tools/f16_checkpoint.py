#!/usr/bin/env python3
"""Writes model/testdata/f16/: a small F16 checkpoint and its exact F32 twin.

Checkpoints published in fp16 are quantized (or widened) at load by mmserve
(model/qwen2_weights.h). To test that path without a real fp16 model, this
takes the language-model tensors of one committed tiny model, rounds every
tensor to fp16, and writes them twice: as F16 (f16/model.safetensors) and as
the same values in F32 (f32/model.safetensors), each with the model's
config.json. fp16 -> fp32 is exact, so mmserve must give bitwise the same
logits from both (//model:qwen2_f16_test), with and without --quantize.
The untied model is used, so the embedding table stays a separate F16
matrix (looked up row by row) while lm_head is quantized or widened.

Usage (venv as in tools/README.md; needs only numpy and safetensors):
  python tools/f16_checkpoint.py [--out model/testdata/f16]
"""

import argparse
import os
import shutil

import numpy as np
from safetensors.numpy import load_file, save_file

MODEL = "qwen2vl-tiny-gqa2-untied-sharded"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    here = os.path.dirname(os.path.abspath(__file__))
    data = os.path.join(here, "..", "model", "testdata")
    ap.add_argument("--out", default=os.path.join(data, "f16"))
    args = ap.parse_args()
    src = os.path.join(data, "models", MODEL)
    tensors = {}
    for name in sorted(os.listdir(src)):
        if name.endswith(".safetensors"):
            for key, value in load_file(os.path.join(src, name)).items():
                if not key.startswith("model.visual."):
                    tensors[key] = value.astype(np.float16)
    for kind, dtype in (("f16", np.float16), ("f32", np.float32)):
        out = os.path.join(args.out, MODEL, kind)
        os.makedirs(out, exist_ok=True)
        shutil.copy(os.path.join(src, "config.json"), out)
        save_file({k: v.astype(dtype) for k, v in sorted(tensors.items())},
                  os.path.join(out, "model.safetensors"),
                  metadata={"about": f"tools/f16_checkpoint.py: {MODEL} language model, "
                                     f"rounded to fp16, stored as {kind}"})
        print(f"  wrote {out}: {len(tensors)} tensors")


if __name__ == "__main__":
    main()
