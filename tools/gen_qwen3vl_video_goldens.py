#!/usr/bin/env python3
"""Qwen3-VL videos as transformers 4.57.6 computes them, on qwen3vl-tiny or
(--model=qwen3vlmoe-tiny) Qwen3-VL-MoE.

Writes model/testdata/models/<model>/video_preprocessor_config.json
(Qwen3VLVideoProcessor at patch 16 / merge 2, 2 fps, a budget of 16384
pixels over all sampled frames, so that the clip below is downscaled) and
model/testdata/goldens/<model>/video_golden.{json,safetensors}. The MoE
checkpoint is served without a video processor (the services refuse its
videos, naming the reason), so for it the config goes beside its goldens,
model/testdata/goldens/qwen3vlmoe-tiny/video_preprocessor_config.json:

- a clip of 21 frames of 96 x 64 at 10 fps whose pixels are a formula
  (frame t, row y, column x, channel c: (3 (c + 1) x + 2 (3 - c) y + 11 t +
  60 ((x + 2 t) / 5 mod 2)) mod 256, that the C++ test computes too; the
  container decoders are pinned by tools/gen_video_goldens.py) sampled by
  Qwen3VLVideoProcessor: the sampled frame indices, the per-temporal-patch
  timestamps (Qwen3VLProcessor._calculate_timestamps), video_grid_thw and
  pixel_values_videos;
- a video chat and an image-then-video chat through Qwen3VLProcessor: the
  rendered template, the prompt with "<t seconds>" before each temporal
  patch, ids, get_rope_index positions and delta, 16 greedy tokens.

  /work/venv-ml/bin/python tools/gen_qwen3vl_video_goldens.py [--model=qwen3vlmoe-tiny]
  # versions: tools/requirements.txt
"""
import argparse
import os
import sys

import torch
import transformers
from PIL import Image
from transformers import (BatchFeature, Qwen2TokenizerFast, Qwen2VLImageProcessor, Qwen3VLForConditionalGeneration,
                          Qwen3VLMoeForConditionalGeneration, Qwen3VLProcessor, Qwen3VLVideoProcessor)
from transformers.video_utils import VideoMetadata

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_qwen3vl_goldens import N_NEW, NAME, PREPROCESSOR_CONFIG  # noqa: E402
from golden_util import generate_greedy, write_json, write_safetensors  # noqa: E402

MOE = "qwen3vlmoe-tiny"

CLIP = {"frames": 21, "width": 96, "height": 64, "fps": 10.0}
IMAGE = "square56"
VIDEO_CONFIG = {
    "video_processor_type": "Qwen3VLVideoProcessor", "do_resize": True, "do_rescale": True,
    "rescale_factor": 1 / 255, "do_normalize": True, "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5], "do_convert_rgb": True, "do_sample_frames": True,
    "size": {"shortest_edge": 4096, "longest_edge": 16384}, "fps": 2, "min_frames": 4,
    "max_frames": 768, "patch_size": 16, "temporal_patch_size": 2, "merge_size": 2,
}
CHATS = [
    ("video", [{"role": "user", "content": [{"type": "video"},
                                            {"type": "text", "text": "What moves?"}]}]),
    ("image_video", [{"role": "user", "content": [
        {"type": "text", "text": "Compare"}, {"type": "image"}, {"type": "video"},
        {"type": "text", "text": "What changed?"}]}]),
]


def clip_frames():
    t, y, x, c = torch.meshgrid(torch.arange(CLIP["frames"]), torch.arange(CLIP["height"]),
                                torch.arange(CLIP["width"]), torch.arange(3), indexing="ij")
    v = 3 * (c + 1) * x + 2 * (3 - c) * y + 11 * t + 60 * (((x + 2 * t) // 5) % 2)
    return (v % 256).to(torch.uint8).numpy()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=NAME, choices=[NAME, MOE])
    name = ap.parse_args().model
    torch.manual_seed(0)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    transformers.logging.set_verbosity_error()
    testdata = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "model", "testdata")
    gdir = os.path.join(testdata, "goldens", name)
    model_dir = os.path.join(testdata, "models", name)
    write_json(os.path.join(gdir if name == MOE else model_dir, "video_preprocessor_config.json"),
               VIDEO_CONFIG)
    tok = Qwen2TokenizerFast.from_pretrained(os.path.join(testdata, "tokenizer"))
    vproc = Qwen3VLVideoProcessor(**{k: v for k, v in VIDEO_CONFIG.items()
                                     if k != "video_processor_type"})
    proc = Qwen3VLProcessor(image_processor=Qwen2VLImageProcessor.from_dict(PREPROCESSOR_CONFIG),
                            tokenizer=tok, video_processor=vproc,
                            chat_template=tok.chat_template)
    frames = clip_frames()
    image = Image.open(os.path.join(testdata, "goldens", "images", IMAGE + ".png"))
    image.load()
    cls = Qwen3VLMoeForConditionalGeneration if name == MOE else Qwen3VLForConditionalGeneration
    model = cls.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    tensors, chats = {}, []
    for chat, messages in CHATS:
        rendered = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        images = [image] if chat == "image_video" else None
        meta = VideoMetadata(total_num_frames=CLIP["frames"], fps=CLIP["fps"],
                             width=CLIP["width"], height=CLIP["height"])
        # Qwen3VLProcessor needs the sampled metadata for the timestamps, which
        # cannot become a tensor: tensors after it is dropped.
        out = proc(text=[rendered], images=images, videos=[frames], video_metadata=[meta])
        out.pop("video_metadata", None)
        inputs = dict(BatchFeature(dict(out), tensor_type="pt"))
        # The processor sampled these (sample_frames on the same metadata).
        indices = [int(i) for i in vproc.sample_frames(meta)]
        assert int(inputs["video_grid_thw"][0][0]) == (len(indices) + 1) // 2
        stamps = proc._calculate_timestamps(list(indices), meta.fps, vproc.merge_size)
        with torch.no_grad():
            pos, delta = model.model.get_rope_index(inputs["input_ids"],
                                                    inputs.get("image_grid_thw"),
                                                    inputs["video_grid_thw"],
                                                    inputs["attention_mask"])
        tensors["pixel_values_videos"] = inputs["pixel_values_videos"].float()
        new, chosen, margins = generate_greedy(model, tok, inputs, N_NEW)
        print(f"  {name} {chat}: {len(set(new))} distinct, min margin {min(margins):.4f}")
        ids = inputs["input_ids"][0].tolist()
        chats.append({"name": chat, "rendered": rendered, "images": [IMAGE] if images else [],
                      "expanded": tok.decode(ids, skip_special_tokens=False),
                      "input_ids": ids, "greedy_ids": new, "greedy_top2_margin": margins,
                      "image_grid_thw": inputs["image_grid_thw"].tolist() if images else [],
                      "video_grid_thw": inputs["video_grid_thw"].tolist(),
                      "position_ids": pos[:, 0].tolist(), "rope_delta": int(delta.flatten()[0])})
    write_safetensors(os.path.join(gdir, "video_golden.safetensors"), tensors,
                      {"model": name, "clip": CLIP})
    write_json(os.path.join(gdir, "video_golden.json"), {
        "about": ("Qwen3VLVideoProcessor and Qwen3VLProcessor (transformers %s) on %s read by "
                  "load_video (pyav) with the processor's sample_frames, fp32 eager model; "
                  "greedy %d tokens with eos masked." % (transformers.__version__, CLIP, N_NEW)),
        "clip": CLIP, "video_fps": CLIP["fps"], "total_num_frames": CLIP["frames"],
        "indices": indices, "timestamps": stamps,
        "video_grid_thw": chats[0]["video_grid_thw"][0], "chats": chats,
    })


if __name__ == "__main__":
    main()
