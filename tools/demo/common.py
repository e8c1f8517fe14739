"""Shared by the demo model's scripts: seeds, tokenizer, config, batching.

Seeds (all different, see README.md):
  TOKENIZER_SEED      Q/A text the BPE is trained on
  weight init         torch.manual_seed(INIT_SEED)
  training batches    step k draws its samples from random.Random(TRAIN_SEED_BASE + k),
                      k = 0 .. steps-1 (< 1,000,000), i.e. seeds 1,000,000 .. 1,999,999
  validation          random.Random(VAL_SEED) (teacher-forced accuracy while training)
  held-out eval       random.Random(EVAL_SEED) (eval_hf.py, make_eval_set.py)
"""

import json
import os
import random
import sys

import numpy as np
import torch

import shapes

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import qwen2vl_layout  # noqa: E402  (tools/qwen2vl_layout.py)
from qwen2vl_layout import CHAT_TEMPLATE, QWEN2_SPLIT_REGEX, SPECIAL_TOKENS  # noqa: E402,F401

TOKENIZER_SEED = 11
INIT_SEED = 12
TRAIN_SEED_BASE = 1_000_000
VAL_SEED = 13
EVAL_SEED = 20261122
assert EVAL_SEED not in range(TRAIN_SEED_BASE, 2 * TRAIN_SEED_BASE)
assert len({TOKENIZER_SEED, INIT_SEED, VAL_SEED, EVAL_SEED}) == 4

PIXELS = shapes.IMAGE_SIZE * shapes.IMAGE_SIZE  # 84*84: one fixed size, 6x6 patches
PREPROCESSOR_CONFIG = qwen2vl_layout.preprocessor_config(min_pixels=PIXELS, max_pixels=PIXELS)
IMAGE_TOKENS = (shapes.IMAGE_SIZE // 14 // 2) ** 2  # 9

GENERIC_TEXT = """\
The quick brown fox jumps over the lazy dog. A picture is worth a thousand words.
Hello! How are you today? I am fine, thank you. What is your name? My name is Demo.
Please describe the image. The image shows a few simple shapes on a plain background.
There is a red circle next to a blue square, and a small green triangle below them.
Colors: red, green, blue, yellow, purple, orange, pink, white, black, gray, brown.
Numbers: 0 1 2 3 4 5 6 7 8 9 10 12 100 2024. Count them: one, two, three, four, five.
Sizes can be small, medium or large; positions can be left, right, top, bottom or center.
This is a tiny model trained on synthetic pictures. It is not a general assistant.
Questions and answers: "Where is it?" - "On the left." 'Is it big?' - "No, it's small."
Punctuation (parentheses), [brackets], {braces}; colons: semicolons; dashes - and_underscores.
Newlines
and	tabs, multiple   spaces, and unicode: café, naïve, 東京, ÜBER, emoji 🙂.
Once upon a time there was a little village at the edge of a great forest. Every morning
the people of the village walked to the river to fetch water, and every evening they
gathered around the fire to share stories about the day. The children played games in the
fields while their parents worked in the gardens, growing beans, potatoes, carrots and apples.
In the winter the snow covered the roofs and the roads, and nobody travelled very far.
Computers process information by following instructions written in programming languages.
A program reads input, performs calculations, stores results in memory and writes output.
Modern machines have many processor cores, large caches and fast network connections, so
software engineers spend a lot of time measuring performance and removing bottlenecks.
The weather forecast for tomorrow: cloudy in the morning, sunny in the afternoon, with a
light wind from the west and temperatures between twelve and eighteen degrees.
She opened the window, looked at the garden and smiled, because the flowers had finally
started to bloom after a long and cold spring. Birds were singing in the old tree.
Mathematics studies numbers, quantities, structures, space and change. Geometry describes
points, lines, angles, surfaces and solids such as cubes, spheres, cylinders and pyramids.
Travel tips: bring a map, check the train schedule, keep your passport safe, drink enough
water and always ask the local people for the best restaurants in town.
The library opens at nine o'clock and closes at six; books can be borrowed for two weeks.
We're sure you'll like it, they've said, but I'm not sure it's what he'd want.
"""


def tokenizer_corpus():
    rng = random.Random(TOKENIZER_SEED)
    lines = [GENERIC_TEXT] * 20
    lines.extend(["system\n" + shapes.SYSTEM_PROMPT + "\nuser\n" + "\nassistant\n"] * 50)
    for _ in range(20000):
        scene = shapes.random_scene(rng)
        q, a = shapes.question(scene, rng.choice(shapes.QUESTION_TYPES), rng)
        lines.append(q + "\n" + a)
    return lines


def build_tokenizer(out_dir, bpe_vocab_size=1024):
    """Trains the byte-level BPE; writes tokenizer.json + tokenizer_config.json."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models
    from tokenizers import normalizers, pre_tokenizers, processors, trainers
    tok = Tokenizer(models.BPE(unk_token=None, continuing_subword_prefix="",
                               end_of_word_suffix="", fuse_unk=False,
                               byte_fallback=False, ignore_merges=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    tok.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False,
                                              use_regex=False)
    trainer = trainers.BpeTrainer(
        vocab_size=bpe_vocab_size, min_frequency=2, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])
    tok.train_from_iterator(tokenizer_corpus(), trainer=trainer)
    base = tok.get_vocab_size()
    tok.add_special_tokens([
        AddedToken(t, single_word=False, lstrip=False, rstrip=False, normalized=False, special=True)
        for t in SPECIAL_TOKENS])
    tj = json.loads(tok.to_str())
    assert len(tj["model"]["vocab"]) == base and base >= 256
    tj["model"]["continuing_subword_prefix"] = ""
    tj["model"]["end_of_word_suffix"] = ""
    tj["model"]["merges"] = [m if isinstance(m, str) else " ".join(m)
                             for m in tj["model"]["merges"]]
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "tokenizer.json")
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        json.dump(tj, f, ensure_ascii=False, indent=None, separators=(",", ":"))
        f.write("\n")
    Tokenizer.from_file(path)  # must parse
    write_json(os.path.join(out_dir, "tokenizer_config.json"), {
        "add_prefix_space": False,
        "added_tokens_decoder": {
            str(base + i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                            "single_word": False, "special": True}
            for i, t in enumerate(SPECIAL_TOKENS)},
        "additional_special_tokens": SPECIAL_TOKENS[1:],
        "bos_token": None,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 32768,
        "pad_token": "<|endoftext|>",
        "padding_side": "left",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    })
    return base


def write_json(path, obj, indent=2):
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        json.dump(obj, f, ensure_ascii=False, indent=indent, sort_keys=True)
        f.write("\n")


def load_tokenizer(model_dir):
    from transformers import Qwen2TokenizerFast
    return Qwen2TokenizerFast.from_pretrained(model_dir)


def image_processor():
    from transformers import Qwen2VLImageProcessor
    kw = {k: v for k, v in PREPROCESSOR_CONFIG.items()
          if k not in ("image_processor_type", "processor_class")}
    return Qwen2VLImageProcessor(**kw)


def special_ids(tok):
    return {t: tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}


def prompt_text(tok, q):
    """The chat template rendering of a served request (default system prompt,
    user turn = image then question, generation prompt), image pad unexpanded."""
    return tok.apply_chat_template(shapes.chat_messages(q), tokenize=False,
                                   add_generation_prompt=True)


class Encoder:
    """Turns (image, question, answer) into model inputs like Qwen2VLProcessor does."""

    def __init__(self, tok):
        self.tok = tok
        self.ip = image_processor()
        self.ids = special_ids(tok)
        self.prompt_cache = {}

    def prompt_ids(self, q):
        if q not in self.prompt_cache:
            text = prompt_text(self.tok, q).replace(
                "<|image_pad|>", "<|image_pad|>" * IMAGE_TOKENS)
            self.prompt_cache[q] = self.tok(text, add_special_tokens=False)["input_ids"]
        return self.prompt_cache[q]

    def answer_ids(self, a):
        return self.tok(a + "<|im_end|>", add_special_tokens=False)["input_ids"]

    def pixels(self, images):
        out = self.ip(images=images, return_tensors="pt")
        return out["pixel_values"], out["image_grid_thw"]

    def batch(self, samples):
        """samples: list of (image, qtype, q, a) -> dict for the model's forward
        with labels only on the answer tokens and the closing <|im_end|>."""
        return self.batch_shared([s[0] for s in samples],
                                 [(i,) + tuple(s[1:]) for i, s in enumerate(samples)],
                                 shared=False)

    def batch_shared(self, images, items, shared=True):
        """images: PIL images; items: (image index, qtype, q, a). With shared,
        pixel_values hold each image once and image_of_seq maps sequences to
        images (for fastpath.forward_shared); else one image per sequence."""
        seqs, labels = [], []
        for _, _, q, a in items:
            p, t = self.prompt_ids(q), self.answer_ids(a)
            seqs.append(p + t)
            labels.append([-100] * len(p) + t)
        n = max(len(s) for s in seqs)
        pad = self.ids["<|endoftext|>"]
        input_ids = torch.full((len(seqs), n), pad, dtype=torch.long)
        attn = torch.zeros((len(seqs), n), dtype=torch.long)
        lab = torch.full((len(seqs), n), -100, dtype=torch.long)
        for i, (s, l) in enumerate(zip(seqs, labels)):
            input_ids[i, :len(s)] = torch.tensor(s)
            attn[i, :len(s)] = 1
            lab[i, :len(l)] = torch.tensor(l)
        if shared:
            pv, thw = self.pixels(images)
            assert (thw == thw[:1]).all()
            return {"input_ids": input_ids, "attention_mask": attn, "labels": lab,
                    "pixel_values": pv, "image_grid_thw": thw[:1].expand(len(items), 3),
                    "image_of_seq": torch.tensor([it[0] for it in items])}
        pv, thw = self.pixels([images[it[0]] for it in items])
        return {"input_ids": input_ids, "attention_mask": attn, "labels": lab,
                "pixel_values": pv, "image_grid_thw": thw}


def flat_config(spec, vocab_size, ids):
    """config.json the way the real Qwen2-VL checkpoints write it (flat)."""
    return qwen2vl_layout.flat_config(
        spec, vocab_size, ids, num_hidden_layers=spec["num_hidden_layers"],
        max_position_embeddings=4096, rms_norm_eps=1e-6, rope_theta=10000.0,
        sliding_window=4096, tie_word_embeddings=True, torch_dtype="float32")


def generation_config(ids):
    import transformers
    return {
        "bos_token_id": ids["<|endoftext|>"],
        "do_sample": False,
        "eos_token_id": [ids["<|im_end|>"], ids["<|endoftext|>"]],
        "pad_token_id": ids["<|endoftext|>"],
        "transformers_version": transformers.__version__,
    }


def set_threads(n=2):
    torch.set_num_threads(n)
    torch.set_num_interop_threads(1)
    np.random.seed(0)
