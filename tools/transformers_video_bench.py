#!/usr/bin/env python3
"""transformers' time for the work bench:video_bench times in C++ per clip:
read the clip with PyAV (transformers.video_utils.load_video, backend
"pyav", every frame: no fps sampling, as mmserve without fps) and run
Qwen2VLVideoProcessor (resize, rescale, normalize, patchify) with the given
pixel limits.

  python tools/transformers_video_bench.py REPS MIN_PIXELS MAX_PIXELS CLIP...
Prints one JSON object: {"transformers": version, "av": version,
<clip file name>: median milliseconds}. Run by bench:video_bench
--peer=transformers in the same run, one thread (torch.set_num_threads(1)).
Needs the tools venv (tools/README.md) and Debian's python3-av.
"""
import json
import os
import sys
import time

sys.path.append("/usr/lib/python3/dist-packages")  # python3-av (Debian's FFmpeg)
import av  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import Qwen2VLVideoProcessor  # noqa: E402
from transformers.video_utils import load_video  # noqa: E402


def once(proc, path):
    video, _ = load_video(path, backend="pyav",
                          sample_indices_fn=lambda metadata, **kw: np.arange(
                              metadata.total_num_frames))
    return proc(videos=[video], do_sample_frames=False, return_tensors="pt")


def main():
    reps, lo, hi = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    torch.set_num_threads(1)
    proc = Qwen2VLVideoProcessor(min_pixels=lo, max_pixels=hi)
    out = {"transformers": transformers.__version__, "av": av.__version__}
    for path in sys.argv[4:]:
        once(proc, path)  # warm-up
        times = []
        for _ in range(reps):
            t = time.perf_counter()
            once(proc, path)
            times.append((time.perf_counter() - t) * 1e3)
        out[os.path.basename(path)] = sorted(times)[len(times) // 2]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
