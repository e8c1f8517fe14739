#!/usr/bin/env python3
"""Held-out accuracy of the demo model with Hugging Face transformers.

Runs every question of the held-out set (tools/demo/eval_set/, written by
make_eval_set.py from EVAL_SEED, a seed no training step uses) through the
served path: the chat template of tokenizer_config.json (default system prompt, user turn
= image then question, generation prompt), the slow Qwen2VLImageProcessor,
and greedy `generate` (batch 1, fp32, stops at <|im_end|>). Exact match of
the decoded answer (special tokens skipped, whitespace stripped) against the
expected answer, per question type. Prints a table, then one JSON line.

With --write-outputs, also writes the generated token ids and texts
(hf_outputs.json beside eval.json) for the C++ eval to compare against.

  python tools/demo/eval_hf.py [--model models/shapes-demo] [--eval-dir tools/demo/eval_set]
  python tools/demo/eval_hf.py --generate 250    # no files: draw the set in memory
"""

import argparse
import json
import os
import sys
import time

import torch
from PIL import Image

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import shapes  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))


def load_set(args):
    if args.generate:
        _, images, items = shapes.eval_items(args.generate, common.EVAL_SEED)
        return images, [{"id": n, "image": i, "qtype": t, "question": q, "answer": a}
                        for n, (i, t, q, a) in enumerate(items)], f"generated seed {common.EVAL_SEED}"
    meta = json.load(open(os.path.join(args.eval_dir, "eval.json"), encoding="utf-8"))
    names = [im["file"] for im in meta["images"]]
    images = [Image.open(os.path.join(args.eval_dir, n)).convert("RGB") for n in names]
    index = {n: i for i, n in enumerate(names)}
    items = [dict(it, image=index[it["image"]]) for it in meta["items"]]
    return images, items, os.path.relpath(args.eval_dir, REPO)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.path.join(REPO, "models", "shapes-demo"))
    ap.add_argument("--eval-dir", default=os.path.join(HERE, "eval_set"))
    ap.add_argument("--generate", type=int, default=0,
                    help="draw this many images from EVAL_SEED in memory instead")
    ap.add_argument("--limit", type=int, default=0, help="first N questions only")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--write-outputs", action="store_true",
                    help="write hf_outputs.json into --eval-dir")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from transformers import (AutoProcessor, Qwen2VLForConditionalGeneration,
                              Qwen2VLImageProcessor)

    proc = AutoProcessor.from_pretrained(args.model)
    # The slow (PIL) image processor: the reference the C++ preprocessing matches.
    proc.image_processor = Qwen2VLImageProcessor.from_pretrained(args.model)
    model = Qwen2VLForConditionalGeneration.from_pretrained(args.model, dtype=torch.float32)
    model.eval()
    tok = proc.tokenizer
    ids = common.special_ids(tok)
    eos = [ids["<|im_end|>"], ids["<|endoftext|>"]]
    images, items, source = load_set(args)
    if args.limit:
        items = items[:args.limit]

    per, outputs, errors = {}, [], []
    t0 = time.time()
    for it in items:
        messages = shapes.chat_messages(it["question"])
        # tokenizer_config.json's template (the one the C++ side reads)
        text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        inputs = proc(text=[text], images=[images[it["image"]]], return_tensors="pt")
        with torch.no_grad():
            out = model.generate(**inputs, max_new_tokens=8, do_sample=False, num_beams=1,
                                 temperature=None, top_p=None, top_k=None,
                                 repetition_penalty=1.0, eos_token_id=eos,
                                 pad_token_id=ids["<|endoftext|>"])
        new = out[0, inputs["input_ids"].shape[1]:].tolist()
        got = tok.decode(new, skip_special_tokens=True).strip()
        ok = got == it["answer"]
        per.setdefault(it["qtype"], []).append(ok)
        outputs.append({"id": it["id"], "token_ids": new, "text": got, "correct": ok})
        if not ok:
            errors.append((it["qtype"], it["question"], it["answer"], got))
    dt = time.time() - t0

    n_images = len({it["image"] for it in items})
    print(f"model {os.path.relpath(args.model, REPO)}  eval set {source}  "
          f"{n_images} images  {len(items)} questions  {dt:.0f}s")
    print(f"{'question type':<14}{'n':>6}{'correct':>9}{'accuracy':>10}")
    acc = {}
    for t in shapes.QUESTION_TYPES:
        if t not in per:
            continue
        v = per[t]
        acc[t] = sum(v) / len(v)
        print(f"{t:<14}{len(v):>6}{sum(v):>9}{acc[t]:>10.4f}")
    total = sum(sum(v) for v in per.values()) / len(items)
    print(f"{'all':<14}{len(items):>6}{sum(sum(v) for v in per.values()):>9}{total:>10.4f}")
    for e in errors[:15]:
        print("  wrong: [%s] %s expected %r got %r" % e)
    if args.write_outputs:
        common.write_json(os.path.join(args.eval_dir, "hf_outputs.json"), {
            "about": ("transformers greedy generate (fp32, batch 1, max_new_tokens 8, eos "
                      "<|im_end|>/<|endoftext|>) on eval.json; token_ids are the generated "
                      "ids including the final eos; text is decoded without special tokens"),
            "model": os.path.relpath(args.model, REPO),
            "transformers": __import__("transformers").__version__,
            "outputs": outputs,
        }, indent=None)
    print(json.dumps({"model": os.path.relpath(args.model, REPO), "eval_seed": common.EVAL_SEED,
                      "images": n_images, "questions": len(items), "accuracy": round(total, 4),
                      "per_type": {k: round(v, 4) for k, v in acc.items()},
                      "dtype": str(model.dtype).replace("torch.", "")}))


if __name__ == "__main__":
    main()
