#!/usr/bin/env python3
"""Writes the held-out evaluation set of the demo model for the C++
`//model:demo_eval` (and tools/demo/eval_hf.py) to read:

  tools/demo/eval_set/NNNN.png   112x112 RGB scenes (lossless PNG)
  tools/demo/eval_set/eval.json  questions and expected answers

drawn from random.Random(EVAL_SEED) (common.py), a seed no training step
uses. eval.json: {"seed", "image_size", "question_types", "system_prompt",
"images": [{"file", "scene"}], "items": [{"id", "image", "qtype", "question",
"answer", "prompt"}]}, where "prompt" is the chat-template rendering of the
served request (default system prompt, user turn = image then question,
generation prompt) with the image placeholder not yet expanded. Exact match
is on the decoded answer text with surrounding whitespace stripped.

  python tools/demo/make_eval_set.py [--n 250] [--out tools/demo/eval_set]
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import shapes  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=250, help="images (6 questions each)")
    ap.add_argument("--out", default=os.path.join(HERE, "eval_set"))
    ap.add_argument("--tokenizer", default=os.path.join(HERE, "..", "..", "models", "shapes-demo"),
                    help="directory with tokenizer_config.json (for the prompt text)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    for f in os.listdir(args.out):
        if f.endswith(".png"):
            os.remove(os.path.join(args.out, f))
    tok = common.load_tokenizer(args.tokenizer)
    scenes, images, items = shapes.eval_items(args.n, common.EVAL_SEED)
    out_images = []
    for i, (scene, im) in enumerate(zip(scenes, images)):
        name = f"{i:04d}.png"
        im.save(os.path.join(args.out, name), optimize=True)
        sc = dict(scene)
        sc["objects"] = [{k: (list(v) if isinstance(v, tuple) else v) for k, v in o.items()}
                         for o in scene["objects"]]
        sc["bg_rgb"] = list(scene["bg_rgb"])
        out_images.append({"file": name, "scene": sc})
    out_items = [{"id": n, "image": f"{i:04d}.png", "qtype": t, "question": q, "answer": a,
                  "prompt": common.prompt_text(tok, q)}
                 for n, (i, t, q, a) in enumerate(items)]
    common.write_json(os.path.join(args.out, "eval.json"), {
        "about": ("Held-out eval set of models/shapes-demo (tools/demo/make_eval_set.py). "
                  "Each image is asked one question of every type; expected answers are "
                  "exact strings (compare after stripping whitespace)."),
        "seed": common.EVAL_SEED,
        "image_size": shapes.IMAGE_SIZE,
        "question_types": shapes.QUESTION_TYPES,
        "system_prompt": shapes.SYSTEM_PROMPT,
        "images": out_images,
        "items": out_items,
    }, indent=1)
    size = sum(os.path.getsize(os.path.join(args.out, f)) for f in os.listdir(args.out))
    print(f"wrote {len(out_images)} images, {len(out_items)} questions to {args.out} "
          f"({size / 1e6:.2f} MB)")


if __name__ == "__main__":
    main()
