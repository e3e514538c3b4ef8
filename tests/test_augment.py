"""Batched augmentations: random_shift is a per-image crop of the zero-padded image at the drawn offset;
SimCLR views are reproducible, per-sample, exact where switched off, and their colour ops follow torchvision."""

from __future__ import annotations

import colorsys
import math

import pytest
import torch
import torch.nn.functional as F

from debias.data.augment import (
    color_jitter,
    crop_boxes,
    random_grayscale,
    random_shift,
    resized_crop_flip,
    shift_hue,
    simclr_view,
)

OFF = dict(crop_scale=None, flip_p=0.0, jitter_p=0.0, grayscale_p=0.0)


def test_random_shift_is_a_crop_of_the_padded_image_at_the_drawn_offsets() -> None:
    for dtype, shape, shift in [(torch.uint8, (16, 3, 28, 28), 2), (torch.float32, (5, 1, 9, 7), 3)]:
        x = (torch.rand(shape) * 255).to(dtype)
        shifted = random_shift(x, shift, torch.Generator().manual_seed(4))
        draws = torch.Generator().manual_seed(4)
        dy = torch.randint(0, 2 * shift + 1, (shape[0],), generator=draws)
        dx = torch.randint(0, 2 * shift + 1, (shape[0],), generator=draws)
        padded = F.pad(x, (shift,) * 4)
        h, w = shape[-2:]
        expected = torch.stack([padded[i, :, a : a + h, b : b + w] for i, (a, b) in enumerate(zip(dy, dx))])
        assert shifted.dtype == dtype and shifted.is_contiguous() and torch.equal(shifted, expected)


def images(n: int = 6, h: int = 28, w: int = 28, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 256, (n, 3, h, w), generator=torch.Generator().manual_seed(seed), dtype=torch.uint8)


def coloured_digit(colour: tuple[int, int, int], size: int = 28) -> torch.Tensor:
    """A Biased-MNIST-like image: a white bar (the stroke) on a background of the class colour."""
    x = torch.tensor(colour, dtype=torch.uint8)[:, None, None].repeat(1, size, size)
    x[:, size // 4 : 3 * size // 4, size // 2 - 1 : size // 2 + 1] = 255
    return x


@pytest.mark.parametrize("shape", [(6, 3, 28, 28), (4, 3, 20, 32)])
def test_simclr_view_shapes_dtypes_ranges(shape) -> None:
    x = images(*[shape[0], *shape[2:]])
    for kwargs in ({}, dict(flip_p=0.5, hue=0.5, brightness=0.8, contrast=0.8, saturation=0.8, jitter_p=1.0)):
        v = simclr_view(x, torch.Generator().manual_seed(1), **kwargs)
        assert v.shape == x.shape and v.dtype == torch.float32
        assert v.min() >= 0 and v.max() <= 255
    assert simclr_view(x.float(), torch.Generator().manual_seed(1)).shape == x.shape
    with pytest.raises(ValueError):
        simclr_view(x[:, :1], torch.Generator())


def test_simclr_view_is_reproducible_from_the_generator_state() -> None:
    x = images()
    g1, g2 = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    first = simclr_view(x, g1)
    assert torch.equal(first, simclr_view(x, g2))
    assert torch.equal(simclr_view(x, g1), simclr_view(x, g2))  # and the states stay in step
    assert not torch.equal(first, simclr_view(x, g1))  # the next view is another one


def test_simclr_view_with_every_op_off_is_the_input() -> None:
    x = images()
    assert torch.equal(simclr_view(x, torch.Generator().manual_seed(0), **OFF), x.float())
    zero_strengths = dict(OFF, jitter_p=1.0, brightness=0.0, contrast=0.0, saturation=0.0, hue=0.0)
    assert torch.equal(simclr_view(x, torch.Generator().manual_seed(0), **zero_strengths), x.float())


def test_crop_of_the_whole_image_is_the_identity() -> None:
    # With align_corners=False a box of the whole image puts every sample point on a pixel
    # centre; only float32 rounding of the grid coordinates remains, a few ulp of W/2 ~ 1e-6
    # pixel, so values move by at most 255 * 1e-6 * (a few) < 1e-2.  A real misplacement of
    # the grid (1/100 pixel on a 0 -> 255 edge) would move values by ~2.5.
    for h, w in ((28, 28), (17, 17)):
        x = images(5, h, w)
        out = resized_crop_flip(x, torch.Generator().manual_seed(0), scale=(1.0, 1.0), ratio=(1.0, 1.0))
        assert (out - x.float()).abs().max() < 1e-2
        flipped = resized_crop_flip(x, torch.Generator().manual_seed(0), scale=None, flip_p=1.0)
        assert (flipped - x.float().flip(-1)).abs().max() < 1e-2


def test_crop_boxes_follow_the_scale_and_ratio_ranges() -> None:
    n, h, w = 512, 28, 28
    half_w, half_h, cx, cy = crop_boxes(n, h, w, torch.Generator().manual_seed(0), (0.2, 1.0), (3 / 4, 4 / 3))
    area, aspect = half_w * half_h, half_w / half_h  # fractions of the image
    assert ((area >= 0.2 - 1e-6) & (area <= 1 + 1e-6)).all()
    assert ((aspect >= 3 / 4 - 1e-6) & (aspect <= 4 / 3 + 1e-6)).all()
    assert ((cx.abs() <= 1 - half_w + 1e-6) & (cy.abs() <= 1 - half_h + 1e-6)).all()  # inside the image
    assert len(set(area.tolist())) == n  # per-sample parameters
    # a box the image cannot hold falls back to the largest centred one of the nearest
    # allowed aspect: aspect >= 2 on a square image -> full width, half the height
    fw, fh, cx, cy = crop_boxes(4, h, w, torch.Generator().manual_seed(0), (1.0, 1.0), (2.0, 3.0))
    assert fw.tolist() == [1.0] * 4 and fh.tolist() == [0.5] * 4 and cx.tolist() == [0.0] * 4


def test_per_sample_parameters_differ_across_the_batch() -> None:
    x = images(1).expand(12, -1, -1, -1)  # one image, twelve times
    for kwargs in ({}, dict(OFF, jitter_p=1.0), dict(OFF, crop_scale=(0.2, 1.0))):
        v = simclr_view(x, torch.Generator().manual_seed(3), **kwargs).flatten(1)
        assert torch.cdist(v, v).add(torch.eye(12) * 1e9).min() > 1, kwargs  # every pair differs


def test_grayscale_equalises_the_channels_of_the_selected_images() -> None:
    x = images(8)
    gray = random_grayscale(x, torch.Generator().manual_seed(0), p=1.0)
    luma = 0.299 * x[:, 0].float() + 0.587 * x[:, 1].float() + 0.114 * x[:, 2].float()
    assert torch.equal(gray[:, 0], gray[:, 1]) and torch.equal(gray[:, 1], gray[:, 2])
    assert torch.allclose(gray[:, 0], luma, atol=1e-4)
    half = random_grayscale(x, torch.Generator().manual_seed(0), p=0.5)
    chosen = torch.rand(8, generator=torch.Generator().manual_seed(0)) < 0.5  # the same draw
    assert 0 < int(chosen.sum()) < 8
    assert torch.equal(half[chosen], gray[chosen]) and torch.equal(half[~chosen], x[~chosen].float())
    v = simclr_view(x, torch.Generator().manual_seed(2), grayscale_p=1.0)
    assert torch.equal(v[:, 0], v[:, 1]) and torch.equal(v[:, 1], v[:, 2])


def test_colour_jitter_matches_torchvision_with_the_drawn_factors() -> None:
    import torchvision.transforms.functional as TF  # here, not at the top: it imports torch._dynamo and sympy

    n, p, k, hue = 8, 0.75, 0.6, 0.4
    x = images(n, 9, 9)
    out = color_jitter(x, torch.Generator().manual_seed(5), brightness=k, contrast=k, saturation=k, hue=hue, p=p)
    g = torch.Generator().manual_seed(5)  # replay the documented draws: selection, b, c, s, h
    chosen = torch.rand(n, generator=g) < p
    b, c, s = ((1 - k) + 2 * k * torch.rand(n, generator=g) for _ in range(3))
    h = -hue + 2 * hue * torch.rand(n, generator=g)
    assert 0 < int(chosen.sum()) < n
    for i in range(n):
        img = x[i].float() / 255
        if chosen[i]:
            img = TF.adjust_hue(TF.adjust_saturation(TF.adjust_contrast(TF.adjust_brightness(
                img, float(b[i])), float(c[i])), float(s[i])), float(h[i]))
        # torchvision's luma weighs red 0.2989 (ours 0.299), so the contrast mean and the
        # saturation target differ by <= 1e-4 * 255 = 0.026, scaled by |1 - factor| <= 0.6
        # per op: < 0.05 in all; a wrong factor or op would be off by units
        assert torch.allclose(out[i], img * 255, atol=0.05), i


def test_shift_hue_is_torchvision_adjust_hue() -> None:
    import torchvision.transforms.functional as TF

    x = torch.rand(4, 3, 7, 7, generator=torch.Generator().manual_seed(0))
    for turn in (-0.5, -0.2, 0.0, 0.3, 0.5):
        expected = TF.adjust_hue(x, turn)
        assert torch.allclose(shift_hue(x * 255, torch.full((4,), turn)) / 255, expected, atol=1e-5)


def test_full_strength_hue_jitter_removes_the_class_colour() -> None:
    # Biased-MNIST backgrounds take the class colour, so a view that keeps it lets colour
    # alone tell images apart.  At hue = 0.5 the background's hue is uniform on the circle
    # in every class: colour no longer identifies the class; at the default 0.1 the red and
    # the green class keep disjoint hue ranges (only grayscale / saturation remove it there).
    views = 256
    hue_only = dict(OFF, jitter_p=1.0, brightness=0.0, contrast=0.0, saturation=0.0)

    def background_hues(colour, hue):
        x = coloured_digit(colour, size=8)[None].expand(views, -1, -1, -1)  # small: one pixel is read
        v = simclr_view(x, torch.Generator().manual_seed(11), **hue_only, hue=hue)[:, :, 0, 0] / 255
        return torch.tensor([colorsys.rgb_to_hsv(*rgb)[0] for rgb in v.tolist()])

    for colour in ((255, 0, 0), (0, 255, 0)):
        hues = background_hues(colour, 0.5)
        sextants = torch.bincount((hues * 6).long().clamp_max(5), minlength=6)
        assert (sextants > views / 12).all(), sextants  # every sixth of the hue circle is visited
        resultant = torch.stack([torch.cos(2 * math.pi * hues), torch.sin(2 * math.pi * hues)]).mean(1).norm()
        assert resultant < 0.2  # no dominant hue left
    red, green = background_hues((255, 0, 0), 0.1), background_hues((0, 255, 0), 0.1)
    red_dist = torch.minimum(red, 1 - red)  # circular distance from hue 0
    assert red_dist.max() <= 0.1 + 1e-4 and ((green - 1 / 3).abs() <= 0.1 + 1e-4).all()
