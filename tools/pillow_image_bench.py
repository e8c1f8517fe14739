#!/usr/bin/env python3
"""Pillow's time for the work bench:image_bench times in C++: decode an
encoded image (bytes in memory), convert("RGB"), resize with BICUBIC to the
Qwen2-VL smart-resize size, and rescale + normalize to float32 (numpy, as
transformers' slow processor does after its resize).

  python tools/pillow_image_bench.py DIR REPS
DIR holds the files the benchmark wrote, named <name>.<ext>, and sizes.json
({name: [resized_w, resized_h]}). Prints one JSON object: name -> median
milliseconds. Run by bench:image_bench in the same run (one thread).
"""
import io
import json
import os
import sys
import time

import numpy as np
from PIL import Image

MEAN = np.array([0.48145466, 0.4578275, 0.40821073], np.float32)
STD = np.array([0.26862954, 0.26130258, 0.27577711], np.float32)


def once(data, size):
    with Image.open(io.BytesIO(data)) as im:
        rgb = im.convert("RGB")
    resized = rgb.resize(size, resample=Image.BICUBIC)
    x = np.asarray(resized).astype(np.float32) * np.float32(1 / 255)
    return (x - MEAN) / STD


def main():
    folder, reps = sys.argv[1], int(sys.argv[2])
    with open(os.path.join(folder, "sizes.json")) as f:
        sizes = json.load(f)
    out = {"pillow": Image.__version__}
    for name in sorted(sizes):
        path = [p for p in os.listdir(folder) if p.startswith(name + ".")][0]
        with open(os.path.join(folder, path), "rb") as f:
            data = f.read()
        once(data, tuple(sizes[name]))  # warm-up
        times = []
        for _ in range(reps):
            t = time.perf_counter()
            once(data, tuple(sizes[name]))
            times.append((time.perf_counter() - t) * 1e3)
        out[name] = sorted(times)[len(times) // 2]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
