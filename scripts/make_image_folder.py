#!/usr/bin/env python3
"""Writes an image folder of generated JPEGs in torchvision's ImageFolder layout, for measuring
`ingot train --dataset DIR` against a fixed batch (issue 48).

    python3 scripts/make_image_folder.py DIR [--classes 1000] [--per-class 26] [--seed 0] [--jobs N]

DIR/class0000/img00000.jpg, ...: each image about ImageNet's typical size (width 400 +- 50,
height 350 +- 50), quality 90, of color gradients and blobs under a blocky texture and fine
grain, so that a file weighs about what an ImageNet photo does (about 110 KB on average; the
script prints the mean) and decodes about as slowly. Needs numpy and Pillow (`pip install numpy pillow`). The same seed
writes the same files.
"""

import argparse
import multiprocessing
import os
import sys

try:
    import numpy as np
    from PIL import Image
except ImportError as e:  # pragma: no cover
    sys.exit(f"make_image_folder.py needs numpy and Pillow: {e} (pip install numpy pillow)")


def image(rng: np.random.Generator) -> Image.Image:
    w = int(rng.integers(350, 451))
    h = int(rng.integers(300, 401))
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    out = np.zeros((h, w, 3), np.float32)
    for c in range(3):
        a, b, p = rng.uniform(-0.05, 0.05, 3)
        out[..., c] = 128 + 60 * np.sin(a * x + b * y + p * 10)
    for _ in range(int(rng.integers(3, 9))):
        cx, cy = rng.uniform(0, w), rng.uniform(0, h)
        r = rng.uniform(15, 90)
        color = rng.uniform(-120, 120, 3)
        mask = np.exp(-((x - cx) ** 2 + (y - cy) ** 2) / (2 * r * r))
        out += mask[..., None] * color
    # Texture in 3-pixel blocks and fine grain: what makes a photo's JPEG 100+ KB.
    block = rng.normal(0, 45, (h // 3 + 1, w // 3 + 1, 3)).astype(np.float32)
    out += np.kron(block, np.ones((3, 3, 1), np.float32))[:h, :w]
    out += rng.normal(0, 12, out.shape)
    return Image.fromarray(np.clip(out, 0, 255).astype(np.uint8), "RGB")


def write_class(job):
    """Writes class `c`'s images from a generator seeded by (seed, c): the same files whatever
    the number of processes."""
    root, c, per_class, seed = job
    rng = np.random.default_rng([seed, c])
    d = os.path.join(root, f"class{c:04d}")
    os.makedirs(d, exist_ok=True)
    size = 0
    for i in range(per_class):
        path = os.path.join(d, f"img{i:05d}.jpg")
        image(rng).save(path, quality=90)
        size += os.path.getsize(path)
    return size


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir")
    ap.add_argument("--classes", type=int, default=1000)
    ap.add_argument("--per-class", type=int, default=26, help="images per class (default 26: 26,000 images)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=os.cpu_count(), help="processes (default: every core)")
    a = ap.parse_args()
    jobs = [(a.dir, c, a.per_class, a.seed) for c in range(a.classes)]
    with multiprocessing.Pool(max(1, a.jobs)) as pool:
        size = sum(pool.imap_unordered(write_class, jobs))
    total = a.classes * a.per_class
    print(f"{a.dir}: {total} images in {a.classes} classes, {size / max(total, 1) / 1024:.0f} KiB each on average")


if __name__ == "__main__":
    main()
