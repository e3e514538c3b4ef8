"""A small biased image folder to try the ``imagefolder`` source on: white squares (class 0) and discs (class 1)
on green (attribute 0) or blue (attribute 1) backgrounds, with Waterbirds' ``metadata.csv`` layout
(``img_filename``, ``y``, ``place``, ``split`` coded 0 / 1 / 2), so ``data.imagefolder``'s defaults read it.

Training images take the background of their class with probability ``rho`` (the bias: colour is easier to
learn than shape); validation and test hold the four (class, background) groups equally often. Shapes vary in
size and position and every pixel gets seeded noise, so shape is learnable but not free.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

BACKGROUNDS = ((40, 150, 40), (40, 70, 200))  # attribute 0: green, 1: blue
SPLIT_CODES = {"train": 0, "val": 1, "test": 2}
MIN_SIZE = 8  # pixels (ours): the smallest shape (radius 0.18 x size) is then 2.9 pixels across


def group_counts(n: int, rho: float, balanced: bool) -> dict[tuple[int, int], int]:
    """Images per (class, attribute) group of a split of ``n``: balanced, or aligned with probability ``rho``."""
    if balanced:
        return {(y, a): n // 4 for y in (0, 1) for a in (0, 1)}
    aligned = round(n / 2 * rho)
    return {(y, a): aligned if y == a else n // 2 - aligned for y in (0, 1) for a in (0, 1)}


def draw(label: int, place: int, size: int, rng: np.random.Generator) -> np.ndarray:
    """One ``size x size`` RGB uint8 image: a white square (0) or disc (1) of random size and position, noise added."""
    image = np.empty((size, size, 3), dtype=np.float32)
    image[:] = BACKGROUNDS[place]
    radius = rng.uniform(0.18, 0.3) * size
    cy, cx = rng.uniform(radius + 1, size - radius - 1, size=2)
    yy, xx = np.mgrid[:size, :size] + 0.5
    inside = (np.abs(yy - cy) <= radius) & (np.abs(xx - cx) <= radius) if label == 0 else \
        (yy - cy) ** 2 + (xx - cx) ** 2 <= radius ** 2
    image[inside] = 255
    image += rng.normal(0, 25, size=image.shape)
    return np.clip(image, 0, 255).astype(np.uint8)


def check_empty_folder(root: Path, force: bool) -> None:
    """``root`` must be missing or empty (a ValueError naming what it holds), unless ``force``: then the files this
    writes (``metadata.csv``, ``images/<split>_<n>.png``) replace their namesakes and nothing else is touched."""
    if force or not root.exists():
        return
    if not root.is_dir():
        raise ValueError(f"{root} is a file; allowed: a new or empty folder")
    held = sorted(p.name for p in root.iterdir())
    if held:
        shown = ", ".join(held[:5]) + (f" and {len(held) - 5} more" if len(held) > 5 else "")
        raise ValueError(f"{root} is not empty ({shown}): its metadata.csv and images/ would be overwritten; choose a "
                         "new folder, or pass --force to write into it anyway")


def write_shapes_folder(root: str | Path, n_train: int = 400, n_eval: int = 100, rho: float = 0.95, size: int = 32,
                        seed: int = 0, force: bool = False, attribute: bool = True) -> Path:
    """Write the PNGs under ``root/images/`` and ``root/metadata.csv`` into a new or empty ``root`` (any folder with
    ``force``); return the table's path. ``attribute`` False leaves the ``place`` column out of the table (data
    without bias labels: read with ``data.imagefolder.attribute_column: null``); the images are the same."""
    import pandas as pd
    from PIL import Image

    if not 0.5 <= rho <= 1:
        raise ValueError(f"rho = {rho}; allowed: 0.5 (no bias) to 1 (every training image aligned)")
    if n_train < 8 or n_eval < 4:
        raise ValueError(f"n_train = {n_train}, n_eval = {n_eval}; allowed: n_train >= 8 and n_eval >= 4")
    if size < MIN_SIZE:
        raise ValueError(f"size = {size}; allowed: {MIN_SIZE} pixels or more")
    root = Path(root)
    check_empty_folder(root, force)
    (root / "images").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    rows = []
    for split, n in (("train", n_train), ("val", n_eval), ("test", n_eval)):
        for (label, place), count in group_counts(n, rho, balanced=split != "train").items():
            for _ in range(count):
                name = f"images/{split}_{len(rows):05d}.png"
                Image.fromarray(draw(label, place, size, rng)).save(root / name)
                rows.append({"img_filename": name, "y": label, "place": place, "split": SPLIT_CODES[split]})
    table = root / "metadata.csv"
    frame = pd.DataFrame(rows)
    (frame if attribute else frame.drop(columns="place")).to_csv(table, index=False)
    return table
