"""Batched augmentations (no per-sample Python loops): uint8 image tensors and float feature vectors.

Images ``[N,3,H,W]``: :func:`random_shift`, :func:`add_noise`, :func:`view` (WCL's views on digits).
Feature vectors ``[N,F]``: :func:`tabular_view`, SCARF's random feature corruption. Pixel
augmentations are image-only: :func:`random_shift` passes feature vectors through unchanged (and
says so once), :func:`view` refuses them rather than clamp standardised features to 0..255.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence

import torch
import torch.nn.functional as F


def random_shift(x: torch.Tensor, max_shift: int, generator: torch.Generator) -> torch.Tensor:
    """Translate each image by (dy, dx) ~ U{-max_shift..max_shift}^2, zero-filled; shape and dtype kept.

    Feature vectors ``[N,F]`` have no pixels to shift: they are returned unchanged (a warning says
    that the shift, e.g. ``erm.augment_shift``, is ignored), so image-only defaults do not fail on tabular data.

    The draws (:func:`shift_draws`, on the generator's device) then :func:`shifted`: one ``gather`` from the
    zero-padded images along their flattened pixels (4x faster on CPU than advanced indexing with broadcast row and
    column indices, with the same result).
    """
    draws = shift_draws(x.shape, max_shift, generator)
    return x if draws is None else shifted(x, *(d.to(x.device, non_blocking=True) for d in draws), max_shift)


def shift_draws(shape: Sequence[int], max_shift: int,
                generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The offsets :func:`random_shift` draws for a batch of ``shape``: ``(dy, dx)``, each ``[N]`` int64 in
    ``0 .. 2 max_shift`` from ``generator`` (dy first); None where nothing is shifted (``max_shift`` 0, or feature
    vectors ``[N,F]``: with the warning that the shift is ignored). A captured training step draws them outside its
    graph (:mod:`debias.training.captured`) and applies them with :func:`shifted` inside."""
    if max_shift == 0:
        return None
    if len(shape) == 2:
        warnings.warn(f"a random shift of {max_shift} pixels (augment_shift / max_shift) is image-only: "
                      "ignored for feature vectors", stacklevel=3)
        return None
    n = shape[0]
    dy = torch.randint(0, 2 * max_shift + 1, (n,), generator=generator)
    dx = torch.randint(0, 2 * max_shift + 1, (n,), generator=generator)
    return dy, dx


def shifted(x: torch.Tensor, dy: torch.Tensor, dx: torch.Tensor, max_shift: int) -> torch.Tensor:
    """Images ``x`` ``[N,C,H,W]`` translated by ``(dy, dx) - max_shift`` each (``dy``, ``dx``: ``[N]`` int64 on
    ``x``'s device, :func:`shift_draws`), zero-filled; no host sync, fixed shapes."""
    n, c, h, w = x.shape
    padded = F.pad(x, (max_shift, max_shift, max_shift, max_shift))
    width = w + 2 * max_shift
    pixels = (torch.arange(h, device=x.device)[:, None] * width + torch.arange(w, device=x.device)[None, :]).flatten()
    index = (dy * width + dx)[:, None] + pixels[None, :]  # [n, h*w] flat positions in the padded image
    return padded.flatten(2).gather(2, index[:, None, :].expand(n, c, h * w)).view(n, c, h, w)


def add_noise(x: torch.Tensor, std: float, generator: torch.Generator) -> torch.Tensor:
    """Float images in 0..255 plus N(0, std^2) pixel noise, clamped to 0..255."""
    if std == 0:
        return x.float()
    noise = torch.randn(x.shape, generator=generator).to(x.device, non_blocking=True) * std
    return (x.float() + noise).clamp_(0, 255)


def view(x: torch.Tensor, max_shift: int, noise_std: float, generator: torch.Generator) -> torch.Tensor:
    """One augmented view of images: random translation, then Gaussian pixel noise (float, 0..255)."""
    if x.ndim != 4:
        raise ValueError(f"view() augments images [N,3,H,W], got shape {tuple(x.shape)}; "
                         "feature vectors take tabular_view() (SCARF feature corruption)")
    return add_noise(random_shift(x, max_shift, generator), noise_std, generator)


# --------------------------------------------------------------------------- SimCLR views

#: ITU-R 601-2 luma weights (R, G, B), as in PIL; they sum to 1, so white stays white (torchvision's
#: tensor ``rgb_to_grayscale`` uses 0.2989 for red).
LUMA = (0.299, 0.587, 0.114)


def _uniform(n: int, low: float, high: float, generator: torch.Generator) -> torch.Tensor:
    """``[n]`` draws from U[low, high) (float32, CPU, from ``generator``)."""
    return low + (high - low) * torch.rand(n, generator=generator)


def _luma(x: torch.Tensor) -> torch.Tensor:
    """``[3]`` luma weights on ``x``'s device and dtype."""
    return torch.tensor(LUMA, dtype=x.dtype).to(x.device, non_blocking=True)  # (a blocking copy would sync a GPU)


def _gray(x: torch.Tensor) -> torch.Tensor:
    """Luma ``[N, 1, H, W]`` of float RGB images ``[N, 3, H, W]``."""
    return torch.einsum("nchw,c->nhw", x, _luma(x))[:, None]


def crop_boxes(
    n: int,
    height: int,
    width: int,
    generator: torch.Generator,
    scale: tuple[float, float] = (0.2, 1.0),
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
    attempts: int = 10,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-sample random-resized-crop boxes as fractions: half-width, half-height, centre x, centre y in [-1, 1].

    Torchvision's ``RandomResizedCrop`` rule, vectorised: area ``s H W`` with ``s ~ U(scale)``,
    aspect ``w / h = r`` with ``log r ~ U(log ratio)``; of ``attempts`` candidates per sample the
    first that fits inside the image is kept, else the largest centred crop whose aspect is
    ``W / H`` clamped to ``ratio``.  Sizes and position are continuous (no rounding to pixels);
    the centre is uniform over the positions that keep the box inside the image.
    """
    area = _uniform(n * attempts, *scale, generator).view(n, attempts)
    log_r = _uniform(n * attempts, math.log(ratio[0]), math.log(ratio[1]), generator).view(n, attempts)
    aspect = torch.exp(log_r)
    fw = torch.sqrt(area * aspect * height / width)  # crop width / W
    fh = torch.sqrt(area / aspect * width / height)  # crop height / H
    fits = (fw <= 1) & (fh <= 1)
    first = torch.where(fits.any(1), fits.float().argmax(1), -1)
    pick = first.clamp_min(0)[:, None]
    in_ratio = width / height
    if in_ratio < ratio[0]:
        fallback_w, fallback_h = 1.0, in_ratio / ratio[0]
    elif in_ratio > ratio[1]:
        fallback_w, fallback_h = ratio[1] / in_ratio, 1.0
    else:
        fallback_w, fallback_h = 1.0, 1.0
    found = first >= 0
    half_w = torch.where(found, fw.gather(1, pick).squeeze(1), fallback_w)
    half_h = torch.where(found, fh.gather(1, pick).squeeze(1), fallback_h)
    u = torch.rand(2, n, generator=generator)
    cx = (2 * u[0] - 1) * (1 - half_w)
    cy = (2 * u[1] - 1) * (1 - half_h)
    return half_w, half_h, cx, cy


def shift_hue(x: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """Rotate each image's hue by ``shift[i]`` turns through HSV (saturation and value kept), on tensors.

    RGB -> HSV: ``V = max``, ``Δ = max - min``, hue in sextants ``6H = 2c + (x_{c+1} - x_{c+2}) / Δ``
    with ``c`` the first largest channel (indices cyclic); HSV -> RGB after adding ``6 shift``:
    ``channel_n = V - Δ clamp(min(k, 4 - k), 0, 1)``, ``k = (n + 6H) mod 6``, ``n = 5, 3, 1`` for
    R, G, B.  Grey pixels (``Δ = 0``) are returned as they are.  Same result as torchvision's
    ``adjust_hue``.
    """
    v = x.amax(1, keepdim=True)  # amax / amin: ~100x faster on CPU than max / min with indices
    delta = v - x.amin(1, keepdim=True)
    cyclic = x.roll(-1, dims=1) - x.roll(-2, dims=1)  # channel c: x_{c+1} - x_{c+2}
    scaled = torch.where(x[:, :1] == v, cyclic[:, :1],
                         torch.where(x[:, 1:2] == v, cyclic[:, 1:2] + 2 * delta, cyclic[:, 2:] + 4 * delta))
    sextant = scaled / delta.clamp_min(torch.finfo(x.dtype).tiny)  # grey: 0 / tiny = 0
    sextant = sextant + 6 * shift.to(device=x.device, dtype=x.dtype, non_blocking=True)[:, None, None, None]
    n = torch.tensor([5.0, 3.0, 1.0], dtype=x.dtype).to(x.device, non_blocking=True)[None, :, None, None]
    k = torch.remainder(n + sextant, 6)
    return v - delta * torch.minimum(k, 4 - k).clamp_(0, 1)


def color_jitter(
    x: torch.Tensor,
    generator: torch.Generator,
    *,
    brightness: float = 0.4,
    contrast: float = 0.4,
    saturation: float = 0.4,
    hue: float = 0.1,
    p: float = 0.8,
) -> torch.Tensor:
    """Per-sample colour distortion of float RGB images in 0..255, applied to each image with probability ``p``.

    Torchvision ``ColorJitter`` semantics, in the fixed order brightness, contrast,
    saturation, hue (torchvision permutes the order per call; one order keeps the batch
    vectorised), clamped to 0..255 after each step: ``x b``, ``m + c (x - m)`` with ``m``
    the image's mean luma, ``L + s (x - L)`` with ``L`` the pixel's luma, hue rotated by
    ``h`` turns through HSV.  Factors ``b, c, s ~ U[max(0, 1 - k), 1 + k]``, ``h ~ U[-hue, hue]``
    (``hue <= 0.5``).  A strength of 0 skips its op; unselected images are returned as is.
    Draws (always the same count for a given batch size): selection, then b, c, s, h.
    """
    if not 0 <= hue <= 0.5:
        raise ValueError(f"hue must be in [0, 0.5], got {hue}")
    if min(brightness, contrast, saturation) < 0 or not 0 <= p <= 1:
        raise ValueError("brightness, contrast, saturation must be >= 0 and p in [0, 1]")
    n = x.shape[0]
    x = x.float()
    if p == 0 or brightness == contrast == saturation == hue == 0:
        return x
    selected = (torch.rand(n, generator=generator) < p).to(x.device, non_blocking=True)
    factors = [_uniform(n, max(0.0, 1 - k), 1 + k, generator).to(x.device, non_blocking=True)[:, None, None, None]
               for k in (brightness, contrast, saturation)]
    shift = _uniform(n, -hue, hue, generator)
    out = x
    if brightness > 0:
        out = (out * factors[0]).clamp_(0, 255)
    if contrast > 0:
        mean = (out.mean((2, 3)) @ _luma(out))[:, None, None, None]  # mean luma of each image
        out = torch.lerp(mean.expand_as(out), out, factors[1]).clamp_(0, 255)
    if saturation > 0:
        out = torch.lerp(_gray(out).expand_as(out), out, factors[2]).clamp_(0, 255)
    if hue > 0:
        out = shift_hue(out, shift).clamp_(0, 255)
    return torch.where(selected[:, None, None, None], out, x)


def random_grayscale(x: torch.Tensor, generator: torch.Generator, p: float = 0.2) -> torch.Tensor:
    """Replace each image, with probability ``p``, by its luma in all three channels (float)."""
    x = x.float()
    if p == 0:
        return x
    selected = (torch.rand(x.shape[0], generator=generator) < p).to(x.device, non_blocking=True)
    return torch.where(selected[:, None, None, None], _gray(x).expand_as(x), x)


def resized_crop_flip(
    x: torch.Tensor,
    generator: torch.Generator,
    *,
    scale: tuple[float, float] | None = (0.2, 1.0),
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
    flip_p: float = 0.0,
    attempts: int = 10,
) -> torch.Tensor:
    """Random resized crop back to ``H x W`` plus horizontal flip with probability ``flip_p``, float 0..255.

    Boxes from ``crop_boxes`` (``scale=None``: no crop, the box is the whole image); one
    ``affine_grid`` + bilinear ``grid_sample`` for the whole batch (``align_corners=False``,
    border padding); the flip negates the box's x axis.  Draws: the boxes, then the flips.
    """
    n, _, h, w = x.shape
    x = x.float()
    if scale is None and flip_p == 0:
        return x
    if scale is None:
        half_w = half_h = torch.ones(n)
        cx = cy = torch.zeros(n)
    else:
        half_w, half_h, cx, cy = crop_boxes(n, h, w, generator, scale, ratio, attempts)
    flip = torch.rand(n, generator=generator) < flip_p
    theta = torch.zeros(n, 2, 3)
    theta[:, 0, 0] = torch.where(flip, -half_w, half_w)
    theta[:, 0, 2] = cx
    theta[:, 1, 1] = half_h
    theta[:, 1, 2] = cy
    grid = F.affine_grid(theta.to(x.device, non_blocking=True), [n, x.shape[1], h, w], align_corners=False)
    return F.grid_sample(x, grid, mode="bilinear", padding_mode="border", align_corners=False)


def simclr_view(
    x: torch.Tensor,
    generator: torch.Generator,
    *,
    crop_scale: tuple[float, float] | None = (0.2, 1.0),
    crop_ratio: tuple[float, float] = (3 / 4, 4 / 3),
    crop_attempts: int = 10,
    flip_p: float = 0.0,
    brightness: float = 0.4,
    contrast: float = 0.4,
    saturation: float = 0.4,
    hue: float = 0.1,
    jitter_p: float = 0.8,
    grayscale_p: float = 0.2,
) -> torch.Tensor:
    """One SimCLR view: resized crop (+ flip), colour jitter (prob. ``jitter_p``), grayscale (prob. ``grayscale_p``).

    ``x`` uint8 (or float) ``[N, 3, H, W]`` in 0..255; returns float32 ``[N, 3, H, W]`` in
    0..255 (the models normalise themselves).  Every parameter is drawn per sample from
    ``generator`` (a CPU ``torch.Generator``) in a fixed order, so the same generator state
    gives the same view.  Defaults are SimCLR's / DCL's CIFAR pipeline (colour strength
    0.5: jitter 0.4, 0.4, 0.4, 0.1 at p 0.8; grayscale p 0.2) with crop scale (0.2, 1).
    Horizontal flip is off by default: a mirrored digit is not a digit of its class (2, 3,
    4, 5, 7, 9 ...), so flip-invariance would be learned about images that never occur.
    ``crop_scale=None`` turns the crop off (``crop_attempts``: torchvision's candidate boxes
    per sample); with it off, ``flip_p = 0``, ``jitter_p = 0`` (or every strength 0) and
    ``grayscale_p = 0`` the view is exactly ``x.float()``.
    """
    if x.dim() != 4 or x.shape[1] != 3:
        raise ValueError(f"x must be [N, 3, H, W], got shape {tuple(x.shape)}")
    out = resized_crop_flip(x, generator, scale=crop_scale, ratio=crop_ratio, flip_p=flip_p, attempts=crop_attempts)
    out = color_jitter(out, generator, brightness=brightness, contrast=contrast, saturation=saturation, hue=hue,
                       p=jitter_p)
    return random_grayscale(out, generator, grayscale_p)


# --------------------------------------------------------------------------- feature vectors


def feature_groups(feature_names: Sequence[str]) -> torch.Tensor:
    """Original-column index per feature column: one-hot columns ``column=value`` of one column share it.

    int64 ``[F]``, numbered in order of first appearance (``age``, ``sex=Female``, ``sex=Male`` -> 0, 1, 1)."""
    index: dict[str, int] = {}
    return torch.tensor([index.setdefault(name.split("=", 1)[0], len(index)) for name in feature_names],
                        dtype=torch.long)


def tabular_view(x: torch.Tensor, generator: torch.Generator, *, corruption_rate: float = 0.6,
                 pool: torch.Tensor | None = None, groups: torch.Tensor | None = None) -> torch.Tensor:
    """One augmented view of feature vectors ``[N,F]`` by SCARF's random feature corruption (float, same shape).

    SCARF (Bahri, Jiang, Tay, Metzler: "SCARF: Self-Supervised Contrastive Learning using Random
    Feature Corruption", ICLR 2022): for every row, a random subset of ``round(corruption_rate * G)``
    of its G features is replaced by draws from each feature's empirical marginal distribution, i.e.
    by that feature's value in a uniformly drawn row of ``pool`` (SCARF: the training set; default:
    the batch ``x`` itself). 0.6 is SCARF's default corruption rate. ``groups`` (int64 ``[F]``, see
    :func:`feature_groups`) makes the one-hot columns of one original column a single feature,
    replaced together from one donor row, so a corrupted row stays a valid one-hot encoding
    (default: every column its own feature, as in SCARF). All randomness comes from ``generator``
    (on the CPU), so a seeded generator gives the same views on any device.
    """
    if not 0.0 <= corruption_rate <= 1.0:
        raise ValueError(f"corruption_rate = {corruption_rate}; allowed: 0 <= corruption_rate <= 1")
    if x.ndim != 2:
        raise ValueError(f"tabular_view() takes feature vectors [N,F], got shape {tuple(x.shape)}")
    pool = x if pool is None else pool
    n, n_features = x.shape
    if pool.ndim != 2 or pool.shape[1] != n_features or len(pool) == 0:
        raise ValueError(f"pool has shape {tuple(pool.shape)}; allowed: [M,{n_features}] with M >= 1")
    groups = torch.arange(n_features) if groups is None else groups.long().cpu()
    n_groups = int(groups.max()) + 1 if n_features else 0
    if groups.shape != (n_features,) or not torch.equal(torch.unique(groups), torch.arange(n_groups)):
        raise ValueError(f"groups {groups.tolist()[:10]} (shape {tuple(groups.shape)}); allowed: one index per feature "
                         f"column ([{n_features}]), using every index 0, 1, ..., G-1")
    n_corrupt = int(round(corruption_rate * n_groups))
    x = x.float()
    if n == 0 or n_corrupt == 0:
        return x.clone()
    # the n_corrupt groups with the smallest uniform scores: a uniformly random subset of that size per row
    scores = torch.rand(n, n_groups, generator=generator)
    chosen = torch.zeros(n, n_groups, dtype=torch.bool).scatter_(1, scores.topk(n_corrupt, dim=1, largest=False).indices, True)
    donors = torch.randint(0, len(pool), (n, n_groups), generator=generator)
    corrupt, donor = chosen[:, groups].to(x.device, non_blocking=True), donors[:, groups].to(pool.device, non_blocking=True)  # per feature column
    replacement = pool.float()[donor, torch.arange(n_features, device=pool.device)[None, :]].to(x.device)
    return torch.where(corrupt, replacement, x)
