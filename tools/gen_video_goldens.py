#!/usr/bin/env python3
"""Writes model/testdata/video/: goldens that pin mmserve's video pipeline
(model/video_preprocess.h, model/video_decode.h) to transformers 4.57.6's
Qwen2VLVideoProcessor, bit for bit.

- frames/*.{jpg,png} + frames.json: frame lists (encoded images) of several
  sizes and counts, odd counts included. Frames are decoded by Pillow
  (convert("RGB")), as mmserve's image decoders do, and processed with
  do_sample_frames=False. For each case: the pixel limits, video_grid_thw
  and XXH3-64 hashes of each resized uint8 frame and of pixel_values_videos
  (float32 little-endian).
- clips.json: the clips of clips/ (tools/make_video_clips.sh), read by
  transformers' read_video_pyav (PyAV on Debian's FFmpeg 5.1, python3-av,
  so the comparison is of sampling and processing, not of decoders), with
  and without fps sampling: the container metadata, the sampled indices,
  the hash of each decoded RGB frame, the grid and the pixel_values hash.
- sampling.json: sample_frames indices for a grid of frame counts, frame
  rates and options (or the error).

Hashes are xxhash.xxh3_64 (seed 0), the same function as mmserve::Hash64.
Run with the tools venv (tools/README.md); PyAV comes from Debian's
python3-av (apt), added to sys.path here:
  python tools/gen_video_goldens.py
Deterministic: re-running rewrites identical files.
"""
import io
import json
import os
import sys
from functools import partial

import numpy as np
import xxhash
from PIL import Image

sys.path.append("/usr/lib/python3/dist-packages")  # python3-av (Debian's FFmpeg)
import av  # noqa: E402,F401  pylint: disable=unused-import
from transformers import Qwen2VLVideoProcessor  # noqa: E402
from transformers.video_utils import VideoMetadata, load_video  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "model", "testdata", "video")
TINY = (3136, 12544)  # the test checkpoints' min/max pixels


def h64(arr):
    return xxhash.xxh3_64_intdigest(np.ascontiguousarray(arr).tobytes())


def synth(w, h, seed):
    """Smooth gradients and moving bars (compress well as JPEG/PNG)."""
    y, x = np.mgrid[0:h, 0:w].astype(np.int64)
    out = np.empty((h, w, 3), np.uint8)
    for c in range(3):
        v = (x * (c + 1) * 255 // max(w, 1) + y * (3 - c) * 255 // max(h, 1)) // 2
        v += ((x + 7 * seed) // 9 % 2) * 60 + ((y + 5 * seed) // 13 % 2) * 40 * c
        out[:, :, c] = (v % 256).astype(np.uint8)
    return out


def processor(min_pixels, max_pixels):
    return Qwen2VLVideoProcessor(min_pixels=min_pixels, max_pixels=max_pixels)


def process(proc, video):
    """video: uint8 [T, H, W, 3]. Returns grid, resized-frame hashes and the
    pixel_values hash."""
    out = proc(videos=[video], do_sample_frames=False, return_tensors="pt")
    grid = [int(v) for v in out["video_grid_thw"][0]]
    import torch
    from torchvision.transforms.v2 import functional as F
    rh, rw = grid[1] * proc.patch_size, grid[2] * proc.patch_size
    t = torch.from_numpy(video).permute(0, 3, 1, 2).contiguous()
    resized = F.resize(t, [rh, rw], interpolation=F.InterpolationMode.BICUBIC, antialias=True)
    resized = resized.permute(0, 2, 3, 1).numpy()
    pv = out["pixel_values_videos"].numpy().astype("<f4")
    return {"grid_thw": grid, "resized_xxh64": [h64(f) for f in resized],
            "pixel_values_xxh64": h64(pv), "pixel_values_shape": list(pv.shape)}


FRAME_CASES = [  # name, width, height, count, format, (min_pixels, max_pixels)
    ("jpg_64x48_x5", 64, 48, 5, "jpg", TINY),
    ("jpg_120x90_x4", 120, 90, 4, "jpg", TINY),
    ("png_45x30_x1", 45, 30, 1, "png", TINY),
    ("png_37x90_x3", 37, 90, 3, "png", TINY),
    ("jpg_160x90_x6", 160, 90, 6, "jpg", (3136, 28 * 28 * 48)),
    ("jpg_150x20_x7", 150, 20, 7, "jpg", (128 * 28 * 28, 28 * 28 * 768)),
]


def frame_cases():
    os.makedirs(f"{OUT}/frames", exist_ok=True)
    cases = []
    for name, w, h, n, fmt, (lo, hi) in FRAME_CASES:
        files, frames = [], []
        for i in range(n):
            path = f"frames/{name}_{i}.{fmt}"
            img = Image.fromarray(synth(w, h, i))
            if fmt == "jpg":
                img.save(f"{OUT}/{path}", quality=60)
            else:
                img.save(f"{OUT}/{path}", optimize=True)
            files.append(path)
            frames.append(np.asarray(Image.open(f"{OUT}/{path}").convert("RGB")))
        rec = {"name": name, "files": files, "min_pixels": lo, "max_pixels": hi,
               "decoded_xxh64": [h64(f) for f in frames]}
        rec.update(process(processor(lo, hi), np.stack(frames)))
        print("frames", name, rec["grid_thw"])
        cases.append(rec)
    return cases


def clip_cases():
    cases = []
    for clip in ("h264_96x64_21f.mp4", "vp9_70x54_16f.mp4", "mpeg4_48x112_9f.avi"):
        for fps in (None, 2.0, 5.0):
            proc = processor(*TINY)
            fn = partial(proc.sample_frames, fps=fps) if fps is not None else \
                (lambda metadata, **kw: np.arange(metadata.total_num_frames))
            video, meta = load_video(f"{OUT}/clips/{clip}", backend="pyav", sample_indices_fn=fn)
            rec = {"clip": clip, "fps": fps, "total_num_frames": meta.total_num_frames,
                   "video_fps": meta.fps, "width": meta.width, "height": meta.height,
                   "indices": [int(i) for i in meta.frames_indices],
                   "decoded_xxh64": [h64(f) for f in video]}
            rec.update(process(proc, video))
            print("clip", clip, fps, rec["indices"], rec["grid_thw"])
            cases.append(rec)
    return cases


def sampling_cases():
    proc = processor(*TINY)
    cases = []
    for total in (1, 2, 3, 7, 21, 30, 97, 300, 1001, 9000):
        for video_fps in (8.0, 24.0, 29.97, 30.0):
            for fps in (0.5, 1.0, 2.0, 3.3):
                for lo, hi in ((4, 768), (1, 16), (8, 8)):
                    meta = VideoMetadata(total_num_frames=total, fps=video_fps)
                    rec = {"total": total, "video_fps": video_fps, "fps": fps,
                           "min_frames": lo, "max_frames": hi}
                    try:
                        idx = proc.sample_frames(meta, fps=fps, min_frames=lo, max_frames=hi)
                        rec["indices"] = [int(i) for i in idx]
                    except (ValueError, ZeroDivisionError) as e:
                        rec["error"] = type(e).__name__
                    cases.append(rec)
    return cases


def write(name, cases):
    with open(f"{OUT}/{name}", "w") as f:
        f.write('{"generator": "tools/gen_video_goldens.py", "cases": [\n')
        f.write(",\n".join(json.dumps(c, separators=(",", ":")) for c in cases))
        f.write("\n]}\n")


def main():
    write("frames.json", frame_cases())
    write("clips.json", clip_cases())
    write("sampling.json", sampling_cases())


if __name__ == "__main__":
    main()
