#!/usr/bin/env python3
"""Procedural scenes of coloured shapes with questions and answers about them.

Everything is a pure function of a `random.Random` stream, so a seed fixes the
images, questions and answers exactly (same Python and Pillow versions).

A scene is an 84x84 RGB image (the demo model's fixed input size: 6x6 patches
of 14 px, 9 image tokens after the 2x2 merge) on a background colour (plain,
with light pixel noise, or with a soft vertical gradient) holding 1-4 shapes.
Each shape sits inside its own cell of a 3x3 grid of 28x28 px cells, which are
exactly the 9 merged image tokens, so every shape has one position name and
one token; the shapes of a scene have pairwise different colours, so "the red
shape" always names exactly one shape. Shapes may repeat.

Question types (answers are one or two lower-case words):
  count       How many shapes are there?            -> one .. four
  shape       What shape is the red object?          -> circle, square, ...
  color       What color is the star? / ... at the top left?  -> red, ...
  position    Where is the blue circle?              -> top left, center, ...
  size        Is the green square small or large?    -> small | large
  background  What color is the background?          -> white | black | gray
"""

import math
import random

import numpy as np
from PIL import Image, ImageDraw

IMAGE_SIZE = 84  # pixels, square; = preprocessor min_pixels = max_pixels side

SHAPES = ["circle", "square", "triangle", "star", "cross"]
SHAPE_PLURAL = {"circle": "circles", "square": "squares", "triangle": "triangles",
                "star": "stars", "cross": "crosses"}
COLORS = {  # name -> base RGB; every draw adds a small per-channel jitter
    "red": (215, 35, 35),
    "green": (40, 165, 60),
    "blue": (40, 80, 215),
    "yellow": (235, 210, 40),
    "purple": (135, 55, 175),
    "orange": (245, 135, 25),
    "pink": (245, 130, 195),
}
BACKGROUNDS = {
    "white": (242, 242, 242),
    "black": (22, 22, 22),
    "gray": (128, 128, 128),
}
SIZES = {"small": (13, 16), "large": (22, 26)}  # bounding box side in pixels, inclusive
POSITIONS = [  # 3x3 grid cell (row, col) -> name
    ["top left", "top", "top right"],
    ["left", "center", "right"],
    ["bottom left", "bottom", "bottom right"],
]
COUNT_WORDS = ["zero", "one", "two", "three", "four"]
QUESTION_TYPES = ["count", "shape", "color", "position", "size", "background"]

SYSTEM_PROMPT = "You are a helpful assistant."


def _jitter(rgb, rng, amount):
    return tuple(max(0, min(255, c + rng.randint(-amount, amount))) for c in rgb)


def _jitter_gray(rgb, rng):
    """Brightness shift of up to 12 plus a tint of at most 3 per channel."""
    shift = rng.randint(-12, 12)
    return tuple(max(0, min(255, c + shift + rng.randint(-3, 3))) for c in rgb)


def random_scene(rng):
    """Returns a scene description (a dict of plain values)."""
    bg = rng.choice(sorted(BACKGROUNDS))
    n = rng.randint(1, 4)
    cells = rng.sample(range(9), n)
    colors = rng.sample(sorted(COLORS), n)
    cell = IMAGE_SIZE / 3.0
    objects = []
    for c, color in zip(cells, colors):
        row, col = divmod(c, 3)
        size = rng.choice(["small", "large"])
        side = rng.randint(*SIZES[size])
        slack = max(0.0, (cell - side) / 2.0 - 1.0)
        cx = (col + 0.5) * cell + rng.uniform(-slack, slack)
        cy = (row + 0.5) * cell + rng.uniform(-slack, slack)
        objects.append({
            "shape": rng.choice(SHAPES), "color": color, "size": size, "side": side,
            "cx": round(cx, 2), "cy": round(cy, 2), "position": POSITIONS[row][col],
            "rgb": _jitter(COLORS[color], rng, 14), "angle": rng.uniform(-12.0, 12.0),
        })
    texture = rng.choices(["plain", "noise", "gradient"], weights=[2, 1, 1])[0]
    return {
        "background": bg, "bg_rgb": _jitter_gray(BACKGROUNDS[bg], rng), "texture": texture,
        "texture_seed": rng.randrange(1 << 30), "objects": objects,
    }


def _polygon(cx, cy, radius_fn, points, angle_deg):
    out = []
    for i in range(points):
        a = math.radians(angle_deg) - math.pi / 2 + 2 * math.pi * i / points
        r = radius_fn(i)
        out.append((cx + r * math.cos(a), cy + r * math.sin(a)))
    return out


def _rotate(pts, cx, cy, angle_deg):
    a = math.radians(angle_deg)
    ca, sa = math.cos(a), math.sin(a)
    return [(cx + (x - cx) * ca - (y - cy) * sa, cy + (x - cx) * sa + (y - cy) * ca)
            for x, y in pts]


def _draw_shape(d, o):
    cx, cy, s, fill, ang = o["cx"], o["cy"], o["side"], o["rgb"], o["angle"]
    h = s / 2.0
    if o["shape"] == "circle":
        d.ellipse([cx - h, cy - h, cx + h, cy + h], fill=fill)
    elif o["shape"] == "square":
        q = h * 0.9
        d.polygon(_rotate([(cx - q, cy - q), (cx + q, cy - q), (cx + q, cy + q), (cx - q, cy + q)],
                          cx, cy, ang), fill=fill)
    elif o["shape"] == "triangle":
        d.polygon(_polygon(cx, cy + h * 0.15, lambda i: h * 1.05, 3, ang), fill=fill)
    elif o["shape"] == "star":
        d.polygon(_polygon(cx, cy + h * 0.05, lambda i: h * 1.05 if i % 2 == 0 else h * 0.45,
                           10, ang), fill=fill)
    elif o["shape"] == "cross":
        t = h * 0.36
        arm = [(-t, -h), (t, -h), (t, -t), (h, -t), (h, t), (t, t), (t, h), (-t, h),
               (-t, t), (-h, t), (-h, -t), (-t, -t)]
        d.polygon(_rotate([(cx + x, cy + y) for x, y in arm], cx, cy, ang), fill=fill)
    else:
        raise ValueError(o["shape"])


def render(scene):
    """Scene dict -> PIL RGB image of IMAGE_SIZE x IMAGE_SIZE."""
    w = h = IMAGE_SIZE
    im = Image.new("RGB", (w, h), tuple(scene["bg_rgb"]))
    trng = random.Random(scene["texture_seed"])
    if scene["texture"] == "noise":  # light grey-level pixel noise, sigma 6
        noise = np.random.RandomState(scene["texture_seed"]).normal(0.0, 6.0, (h, w, 1))
        arr = np.asarray(scene["bg_rgb"], dtype=np.float64)[None, None, :] + np.round(noise)
        im = Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8), "RGB")
    elif scene["texture"] == "gradient":
        d = ImageDraw.Draw(im)
        amp = trng.uniform(10.0, 25.0) * (1 if trng.random() < 0.5 else -1)
        base = scene["bg_rgb"]
        for y in range(h):
            v = int(round(amp * (y / (h - 1) - 0.5)))
            d.line([(0, y), (w - 1, y)], fill=tuple(max(0, min(255, c + v)) for c in base))
    d = ImageDraw.Draw(im)
    for o in scene["objects"]:
        _draw_shape(d, o)
    return im


def question(scene, qtype, rng):
    """(question text, answer text) of one type about a scene."""
    objs = scene["objects"]
    if qtype == "count":
        q = rng.choice(["How many shapes are there?", "How many shapes are in the picture?"])
        return q, COUNT_WORDS[len(objs)]
    if qtype == "background":
        q = rng.choice(["What color is the background?", "What is the background color?"])
        return q, scene["background"]
    o = rng.choice(objs)
    if qtype == "shape":
        q = rng.choice(["What shape is the {c} object?", "Which shape is {c}?"])
        return q.format(c=o["color"]), o["shape"]
    if qtype == "color":
        if sum(1 for p in objs if p["shape"] == o["shape"]) == 1:
            q = rng.choice(["What color is the {s}?", "Which color does the {s} have?"])
            return q.format(s=o["shape"]), o["color"]
        q = rng.choice(["What color is the shape at the {p}?", "Which color is at the {p}?"])
        return q.format(p=o["position"]), o["color"]
    if qtype == "position":
        q = rng.choice(["Where is the {c} {s}?", "Where is the {c} {s} in the picture?"])
        return q.format(c=o["color"], s=o["shape"]), o["position"]
    if qtype == "size":
        q = rng.choice(["Is the {c} {s} small or large?", "What size is the {c} {s}?"])
        return q.format(c=o["color"], s=o["shape"]), o["size"]
    raise ValueError(qtype)


def sample(rng):
    """One training sample: (PIL image, question type, question, answer)."""
    scene = random_scene(rng)
    qtype = rng.choice(QUESTION_TYPES)
    q, a = question(scene, qtype, rng)
    return render(scene), qtype, q, a


def eval_items(n_images, seed):
    """The held-out set: n_images scenes from random.Random(seed), each asked
    one question of every type. Returns (scenes, images, items) with items
    (image index, qtype, question, answer)."""
    rng = random.Random(seed)
    scenes, images, items = [], [], []
    for i in range(n_images):
        scene = random_scene(rng)
        scenes.append(scene)
        images.append(render(scene))
        for qtype in QUESTION_TYPES:
            q, a = question(scene, qtype, rng)
            items.append((i, qtype, q, a))
    return scenes, images, items


def chat_messages(q):
    """The request a client sends: one user turn, the image then the question."""
    return [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": q}]}]


def all_answers():
    return sorted(set(COUNT_WORDS[1:]) | set(SHAPES) | set(COLORS) | set(BACKGROUNDS) |
                  {p for row in POSITIONS for p in row} | set(SIZES))


if __name__ == "__main__":
    import sys
    rng = random.Random(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
    for i in range(8):
        im, t, q, a = sample(rng)
        im.save(f"/tmp/shapes_{i}.png")
        print(i, t, q, "->", a)
