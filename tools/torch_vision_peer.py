#!/usr/bin/env python3
"""Times transformers' Qwen2-VL vision tower on given patch grids: the peer
baseline of bench/vision_bench.cc (--peer=torch).

The tower is built at Qwen2-VL-2B vision dimensions (embed 1280, 16 heads,
MLP ratio 4, out 1536; depth from --depth) with random weights in the given
dtype, PyTorch's own attention (sdpa), torch.set_num_threads(--threads).
Each grid's pixel values are random (the tower's time does not depend on
them). Per grid, one untimed forward first (oneDNN sets up its kernels per
shape, and the first call at a shape pays for it), then --iters forwards,
timed with time.perf_counter.

Prints one JSON line last:
  {"ok": true, "torch": "2.9.1", "transformers": "4.57.6", "dtype": "bfloat16",
   "threads": 2, "seconds": [mean seconds per grid, in order]}
or, when PyTorch or transformers is missing (exit status 2):
  {"ok": false, "reason": "..."}

  /root/.cache/mmserve-tools-venv/bin/python tools/torch_vision_peer.py \
      --grids=1x32x32,1x74x74 --depth=32 --threads=2 --dtype=bfloat16
"""

import argparse
import json
import sys
import time


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--grids", required=True, help="t x h x w patch grids, comma-separated")
    p.add_argument("--depth", type=int, default=32)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    p.add_argument("--iters", type=int, default=1)
    return p.parse_args()


def main():
    args = parse_args()
    try:
        import torch
        import transformers
        from transformers.models.qwen2_vl.configuration_qwen2_vl import Qwen2VLVisionConfig
        from transformers.models.qwen2_vl.modeling_qwen2_vl import (
            Qwen2VisionTransformerPretrainedModel,
        )
    except ImportError as e:  # the bench prints this and skips the peer
        print(json.dumps({"ok": False, "reason": f"cannot import PyTorch/transformers: {e}"}))
        return 2
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    dtype = getattr(torch, args.dtype)
    cfg = Qwen2VLVisionConfig(
        depth=args.depth, embed_dim=1280, hidden_size=1536, hidden_act="quick_gelu",
        mlp_ratio=4, num_heads=16, in_channels=3, patch_size=14, spatial_merge_size=2,
        temporal_patch_size=2)
    cfg._attn_implementation = "sdpa"
    tower = Qwen2VisionTransformerPretrainedModel._from_config(cfg, dtype=dtype).eval()
    patch = 3 * 2 * 14 * 14

    def forward(t, h, w):
        grid = torch.tensor([[t, h, w]])
        x = torch.randn(t * h * w, patch, dtype=dtype)
        start = time.perf_counter()
        with torch.inference_mode():
            tower(x, grid_thw=grid)
        return time.perf_counter() - start

    seconds = []
    for g in args.grids.split(","):
        t, h, w = (int(v) for v in g.split("x"))
        forward(t, h, w)  # warm-up at this shape
        seconds.append(sum(forward(t, h, w) for _ in range(args.iters)) / args.iters)
    print(json.dumps({"ok": True, "torch": torch.__version__,
                      "transformers": transformers.__version__, "dtype": args.dtype,
                      "threads": torch.get_num_threads(), "seconds": seconds}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
