"""Image corruptions of Hendrycks & Dietterich (2019) as batched tensor ops, for Corrupted CIFAR-10.

Each corruption maps float images ``[N, 3, H, W]`` in 0..1 to corrupted ones (same shape, clamped by
the caller), drawing every random number from the ``torch.Generator`` it is given, on the images'
device: the same seed gives the same images, on the CPU or on CUDA. Constants are the CIFAR-10-C
tables (``make_cifar_c.py``; LfF's ``corrupted_cifar10_protocol.py`` copies them), indexed by
severity 1..5; sizes in pixels (elastic, frost) scale with ``H / 32``.

Why not a package: ``imagecorruptions`` (bethgelab, last release 2020) and its maintained fork
``imagecorruptions-imaug`` carry the ImageNet-C constants, not CIFAR-10-C's (Gaussian noise 0.08 ...
0.38 instead of 0.04 ... 0.10), work on one numpy image at a time through OpenCV, scikit-image and
numba, and draw from numpy's global random state; here CIFAR-10's 60k images are corrupted in about
half a minute on two cores, seeded, on any device. Departures, all sub-pixel: ``pixelate`` keeps its
small image in float (PIL rounds it to uint8 between its two BOX resizes); elastic's field smoothing
pads by reflection about the edge pixel (scipy's 'reflect' repeats it); results are rounded to uint8,
not truncated.

``frost`` blends in Hendrycks' frost photographs (frost1.png ... frost5.jpg, as the CIFAR-10-C
definition draws from the first five): data, not code, so they are not in this repository; they
are read from ``bias.corruption.frost_dir`` or from the copies the ``imagecorruptions`` package
installs (``pip install imagecorruptions``; only its files are read, its code is not imported).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

Corruption = Callable[[torch.Tensor, int, torch.Generator], torch.Tensor]
CORRUPTIONS: dict[str, Corruption] = {}
CIFAR_SIDE = 32  # the side the CIFAR-10-C pixel constants were written for


class CorruptionError(ValueError):
    """A corruption cannot run: unknown name, or its resources (frost photographs) are missing."""


def register_corruption(name: str) -> Callable[[Corruption], Corruption]:
    def decorate(fn: Corruption) -> Corruption:
        CORRUPTIONS[name] = fn
        return fn

    return decorate


def _uniform(shape: tuple[int, ...], low: float, high: float, like: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    return torch.rand(shape, generator=generator, device=like.device, dtype=like.dtype) * (high - low) + low


def _normal(shape: tuple[int, ...], like: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    return torch.randn(shape, generator=generator, device=like.device, dtype=like.dtype)


# --------------------------------------------------------------------------- colour space (skimage's HSV)


def rgb_to_hsv(x: torch.Tensor) -> torch.Tensor:
    """``[N,3,H,W]`` RGB in 0..1 to HSV in 0..1 (hue as a fraction of a turn), as skimage.color.rgb2hsv."""
    r, g, b = x.unbind(1)
    value, _ = x.max(1)
    delta = value - x.min(1).values
    safe = torch.where(delta > 0, delta, torch.ones_like(delta))
    saturation = torch.where(value > 0, delta / torch.where(value > 0, value, torch.ones_like(value)), torch.zeros_like(value))
    hue = torch.where(r == value, (g - b) / safe, torch.where(g == value, 2.0 + (b - r) / safe, 4.0 + (r - g) / safe))
    hue = torch.where(delta > 0, (hue / 6.0) % 1.0, torch.zeros_like(hue))
    return torch.stack([hue, saturation, value], 1)


def hsv_to_rgb(x: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`rgb_to_hsv`."""
    h, s, v = x.unbind(1)
    sector = torch.floor(h * 6.0)
    f = h * 6.0 - sector
    p, q, t = v * (1 - s), v * (1 - f * s), v * (1 - (1 - f) * s)
    sector = sector.long() % 6
    table = torch.stack([torch.stack(c, 1) for c in ((v, t, p), (q, v, p), (p, v, t), (p, q, v), (t, p, v), (v, p, q))], 0)
    return table.gather(0, sector[None, :, None].expand(1, -1, 3, -1, -1)).squeeze(0)


# --------------------------------------------------------------------------- filters


def _pad_mode(side: int, radius: int) -> str:
    """Reflection about the edge pixel where the image is wider than the kernel radius, else edge replication."""
    return "reflect" if radius < side else "replicate"


def gaussian_kernel(sigma: float, truncate: float, like: torch.Tensor) -> torch.Tensor:
    """1-D normalised Gaussian of radius ``int(truncate * sigma + 0.5)`` (scipy.ndimage's rule)."""
    radius = int(truncate * sigma + 0.5)
    offsets = torch.arange(-radius, radius + 1, device=like.device, dtype=like.dtype)
    kernel = torch.exp(-0.5 * (offsets / sigma) ** 2)
    return kernel / kernel.sum()


def separable_blur(x: torch.Tensor, kernel: torch.Tensor, edge: str = "reflect") -> torch.Tensor:
    """Filter every channel of ``[N,C,H,W]`` with the 1-D ``kernel`` along H, then along W; borders padded by
    ``edge`` (reflect: about the edge pixel, where the image is wide enough; replicate: the edge pixel)."""
    radius = len(kernel) // 2
    channels = x.shape[1]
    mode = _pad_mode(min(x.shape[-2:]), radius) if edge == "reflect" else edge
    out = F.conv2d(F.pad(x, (0, 0, radius, radius), mode=mode), kernel.view(1, 1, -1, 1).expand(channels, 1, -1, 1),
                   groups=channels)
    return F.conv2d(F.pad(out, (radius, radius, 0, 0), mode=mode), kernel.view(1, 1, 1, -1).expand(channels, 1, 1, -1),
                    groups=channels)


def filter2d(x: torch.Tensor, kernel: torch.Tensor) -> torch.Tensor:
    """Correlate every channel of ``[N,C,H,W]`` with the square 2-D ``kernel`` (OpenCV filter2D, reflect-101 borders)."""
    radius = kernel.shape[-1] // 2
    channels = x.shape[1]
    padded = F.pad(x, (radius,) * 4, mode=_pad_mode(min(x.shape[-2:]), radius))
    return F.conv2d(padded, kernel.expand(channels, 1, -1, -1), groups=channels)


def disk_kernel(radius: float, alias_blur: float, like: torch.Tensor) -> torch.Tensor:
    """Hendrycks' anti-aliased disk: the pixels within ``radius`` (a 17 x 17 grid up to radius 8), normalised,
    then blurred by a Gaussian of sigma ``alias_blur`` (3 x 3 up to radius 8, else 5 x 5)."""
    half, ksize = (8, 3) if radius <= 8 else (int(radius), 5)
    offsets = np.arange(-half, half + 1)
    xx, yy = np.meshgrid(offsets, offsets)
    disk = ((xx**2 + yy**2) <= radius**2).astype(np.float64)
    disk /= disk.sum()
    g = np.exp(-0.5 * ((np.arange(ksize) - ksize // 2) / alias_blur) ** 2)
    g /= g.sum()
    kernel = torch.from_numpy(disk).to(like)[None, None]
    g_t = torch.from_numpy(g).to(like)
    return separable_blur(kernel, g_t)[0, 0]


def box_matrix(source: int, target: int, like: torch.Tensor) -> torch.Tensor:
    """``[target, source]`` weights of PIL's BOX resampling: target pixel i averages the source pixels j with
    ``-0.5 < (j + 0.5 - centre_i) / max(scale, 1) <= 0.5``, ``centre_i = (i + 0.5) * scale``, ``scale = source / target``
    (so a downscale averages the pixels whose centres it covers, an upscale repeats the nearest)."""
    scale = source / target
    width = max(scale, 1.0)
    centre = (torch.arange(target, device=like.device, dtype=torch.float64)[:, None] + 0.5) * scale
    position = (torch.arange(source, device=like.device, dtype=torch.float64)[None, :] + 0.5 - centre) / width
    weights = ((position > -0.5) & (position <= 0.5)).to(torch.float64)
    return (weights / weights.sum(1, keepdim=True)).to(like.dtype)


def box_resize(x: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """Box-filter resize of ``[N,C,H,W]`` to ``height`` x ``width``."""
    rows, cols = box_matrix(x.shape[-2], height, x), box_matrix(x.shape[-1], width, x)
    return rows @ x @ cols.T


def _pixel_grid(n: int, height: int, width: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    ys, xs = torch.meshgrid(torch.arange(height, device=like.device, dtype=like.dtype),
                            torch.arange(width, device=like.device, dtype=like.dtype), indexing="ij")
    return xs.expand(n, -1, -1), ys.expand(n, -1, -1)


def sample_at(x: torch.Tensor, cols: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Bilinear samples of ``[N,C,H,W]`` at pixel coordinates ``cols``, ``rows`` ``[N,H,W]``, reflecting outside."""
    height, width = x.shape[-2:]
    grid = torch.stack([2 * cols / max(width - 1, 1) - 1, 2 * rows / max(height - 1, 1) - 1], -1)
    return F.grid_sample(x, grid, mode="bilinear", padding_mode="reflection", align_corners=True)


# --------------------------------------------------------------------------- corruptions


@register_corruption("original")
def original(x: torch.Tensor, severity: int, generator: torch.Generator) -> torch.Tensor:
    """No corruption (LfF's Type-1 list has it as one "corruption")."""
    return x


@register_corruption("gaussian_noise")
def gaussian_noise(x: torch.Tensor, severity: int, generator: torch.Generator) -> torch.Tensor:
    c = (0.04, 0.06, 0.08, 0.09, 0.10)[severity - 1]
    return x + c * _normal(tuple(x.shape), x, generator)


@register_corruption("shot_noise")
def shot_noise(x: torch.Tensor, severity: int, generator: torch.Generator) -> torch.Tensor:
    c = (500, 250, 100, 75, 50)[severity - 1]
    return torch.poisson(x * c, generator=generator) / c


@register_corruption("speckle_noise")
def speckle_noise(x: torch.Tensor, severity: int, generator: torch.Generator) -> torch.Tensor:
    c = (0.06, 0.1, 0.12, 0.16, 0.2)[severity - 1]
    return x + x * c * _normal(tuple(x.shape), x, generator)


@register_corruption("impulse_noise")
def impulse_noise(x: torch.Tensor, severity: int, generator: torch.Generator) -> torch.Tensor:
    """Salt and pepper (skimage's s&p, salt_vs_pepper 0.5): each value is replaced with probability ``amount``."""
    amount = (0.01, 0.02, 0.03, 0.05, 0.07)[severity - 1]
    flipped = _uniform(tuple(x.shape), 0, 1, x, generator) <= amount
    salt = _uniform(tuple(x.shape), 0, 1, x, generator) <= 0.5
    return torch.where(flipped, salt.to(x.dtype), x)


@register_corruption("gaussian_blur")
def gaussian_blur(x: torch.Tensor, severity: int, generator: torch.Generator) -> torch.Tensor:
    sigma = (0.4, 0.6, 0.7, 0.8, 1.0)[severity - 1]
    return separable_blur(x, gaussian_kernel(sigma, 4.0, x), edge="replicate")  # skimage's gaussian: mode 'nearest'


@register_corruption("defocus_blur")
def defocus_blur(x: torch.Tensor, severity: int, generator: torch.Generator) -> torch.Tensor:
    radius, alias_blur = ((0.3, 0.4), (0.4, 0.5), (0.5, 0.6), (1, 0.2), (1.5, 0.1))[severity - 1]
    return filter2d(x, disk_kernel(radius, alias_blur, x))


@register_corruption("contrast")
def contrast(x: torch.Tensor, severity: int, generator: torch.Generator) -> torch.Tensor:
    c = (0.75, 0.5, 0.4, 0.3, 0.15)[severity - 1]
    means = x.mean(dim=(-2, -1), keepdim=True)
    return (x - means) * c + means


@register_corruption("brightness")
def brightness(x: torch.Tensor, severity: int, generator: torch.Generator) -> torch.Tensor:
    c = (0.05, 0.1, 0.15, 0.2, 0.3)[severity - 1]
    hsv = rgb_to_hsv(x.clamp(0, 1))
    hsv[:, 2] = (hsv[:, 2] + c).clamp(0, 1)
    return hsv_to_rgb(hsv)


@register_corruption("saturate")
def saturate(x: torch.Tensor, severity: int, generator: torch.Generator) -> torch.Tensor:
    scale, shift = ((0.3, 0), (0.1, 0), (1.5, 0), (2, 0.1), (2.5, 0.2))[severity - 1]
    hsv = rgb_to_hsv(x.clamp(0, 1))
    hsv[:, 1] = (hsv[:, 1] * scale + shift).clamp(0, 1)
    return hsv_to_rgb(hsv)


@register_corruption("pixelate")
def pixelate(x: torch.Tensor, severity: int, generator: torch.Generator) -> torch.Tensor:
    c = (0.95, 0.9, 0.85, 0.75, 0.65)[severity - 1]
    height, width = x.shape[-2:]
    small = box_resize(x, max(int(height * c), 1), max(int(width * c), 1))
    return box_resize(small, height, width)


@register_corruption("elastic_transform")
def elastic_transform(x: torch.Tensor, severity: int, generator: torch.Generator) -> torch.Tensor:
    """A random affine warp of three points, then a smooth random displacement field (CIFAR-10-C's elastic)."""
    alpha, sigma, shake = (np.array(((0, 0, 0.08), (0.05, 0.2, 0.07), (0.08, 0.06, 0.06), (0.1, 0.04, 0.05),
                                      (0.1, 0.03, 0.03))[severity - 1]) * x.shape[-2]).tolist()
    n, _, height, width = x.shape
    centre = torch.tensor([width // 2, height // 2], device=x.device, dtype=x.dtype)
    square = min(height, width) // 3
    source = torch.stack([centre + square, centre + torch.tensor([square, -square], device=x.device, dtype=x.dtype),
                          centre - square])  # [3, 2] (x, y) as Hendrycks' pts1
    moved = source + _uniform((n, 3, 2), -shake, shake, x, generator)
    # dst = A src + b maps pts1 to pts2 (cv2.getAffineTransform); warpAffine samples src at A^-1 (dst - b)
    ones = torch.ones(3, 1, device=x.device, dtype=x.dtype)
    affine = torch.linalg.solve(torch.cat([source, ones], 1).expand(n, 3, 3), moved).transpose(1, 2)  # [n, 2, 3]
    inverse = torch.linalg.inv(affine[:, :, :2])
    cols, rows = _pixel_grid(n, height, width, x)
    offset = torch.stack([cols, rows], -1) - affine[:, None, None, :, 2]
    back = torch.einsum("nij,nhwj->nhwi", inverse, offset)
    warped = sample_at(x, back[..., 0], back[..., 1])
    field = _uniform((n, 2, height, width), -1, 1, x, generator)
    if sigma > 0:
        field = separable_blur(field, gaussian_kernel(sigma, 3.0, x))
    dx, dy = (field * alpha).unbind(1)
    return sample_at(warped, cols + dx, rows + dy)


FROST_FILES = ("frost1.png", "frost2.png", "frost3.png", "frost4.jpg", "frost5.jpg")
FROST_SCALE = 0.2  # CIFAR-10-C shrinks the photographs by 0.2 before cropping 32 x 32


def frost_folder(frost_dir: str | None) -> Path:
    """``frost_dir``, else the imagecorruptions package's ``frost/`` folder (found, not imported)."""
    if frost_dir is not None:
        return Path(frost_dir)
    spec = importlib.util.find_spec("imagecorruptions")
    if spec is None or not spec.submodule_search_locations:
        raise CorruptionError(
            "the frost corruption needs Hendrycks' frost photographs (frost1.png, frost2.png, frost3.png, frost4.jpg, "
            "frost5.jpg): set bias.corruption.frost_dir to a folder holding them, or pip install imagecorruptions "
            "(its copies are used), or drop frost from bias.corruption.types")
    return Path(next(iter(spec.submodule_search_locations))) / "frost"


def load_frost_textures(folder: Path, side: int, device: torch.device) -> list[torch.Tensor]:
    """The five photographs as float ``[3, h, w]`` in 0..1, shrunk by ``FROST_SCALE * side / 32`` (bilinear, as cv2.resize)."""
    missing = [name for name in FROST_FILES if not (folder / name).is_file()]
    if missing:
        raise CorruptionError(f"frost photographs {missing} are not in {folder} (bias.corruption.frost_dir); "
                              f"needed: {', '.join(FROST_FILES)}")
    scale = FROST_SCALE * side / CIFAR_SIDE
    textures = []
    for name in FROST_FILES:
        with Image.open(folder / name) as image:
            pixels = torch.from_numpy(np.asarray(image.convert("RGB"), dtype=np.float32) / 255.0).permute(2, 0, 1)
        size = (max(int(round(pixels.shape[1] * scale)), side), max(int(round(pixels.shape[2] * scale)), side))
        textures.append(F.interpolate(pixels[None], size=size, mode="bilinear", align_corners=False)[0].to(device))
    return textures


def frost(x: torch.Tensor, severity: int, generator: torch.Generator, textures: list[torch.Tensor]) -> torch.Tensor:
    """``c0 * x + c1 * crop``: a random crop of a random one of the five frost photographs."""
    weight, frost_weight = ((1, 0.2), (1, 0.3), (0.9, 0.4), (0.85, 0.4), (0.75, 0.45))[severity - 1]
    n, _, height, width = x.shape
    which = torch.randint(len(textures), (n,), generator=generator, device=x.device)
    crops = torch.empty_like(x)
    for k, texture in enumerate(textures):
        rows_of = torch.nonzero(which == k).flatten()
        if len(rows_of) == 0:
            continue
        top = (torch.rand(len(rows_of), generator=generator, device=x.device) * (texture.shape[1] - height + 1)).long()
        left = (torch.rand(len(rows_of), generator=generator, device=x.device) * (texture.shape[2] - width + 1)).long()
        rows = top[:, None] + torch.arange(height, device=x.device)
        cols = left[:, None] + torch.arange(width, device=x.device)
        crops[rows_of] = texture[:, rows[:, :, None], cols[:, None, :]].permute(1, 0, 2, 3).to(x.dtype)
    return weight * x + frost_weight * crops


def resolve(name: str, frost_dir: str | None, side: int, device: torch.device) -> Corruption:
    """The corruption registered as ``name``; ``frost`` with its photographs loaded for images of ``side`` pixels."""
    if name == "frost":
        return partial(frost, textures=load_frost_textures(frost_folder(frost_dir), side, device))
    if name not in CORRUPTIONS:
        raise CorruptionError(f"corruption '{name}' is unknown; allowed: {sorted([*CORRUPTIONS, 'frost'])}")
    return CORRUPTIONS[name]


def corrupt(images: torch.Tensor, fn: Corruption, severity: int, generator: torch.Generator,
            chunk: int) -> torch.Tensor:
    """uint8 ``[N,3,H,W]`` through ``fn`` at ``severity``, ``chunk`` images at a time (memory), rounded back to uint8."""
    out = torch.empty_like(images)
    for start in range(0, len(images), chunk):
        part = images[start : start + chunk].float().div_(255.0)
        out[start : start + chunk] = fn(part, severity, generator).clamp_(0, 1).mul_(255.0).round_().to(torch.uint8)
    return out
