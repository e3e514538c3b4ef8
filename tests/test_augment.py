"""Batched augmentations: random_shift is a per-image crop of the zero-padded image at the drawn offset."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from debias.data.augment import random_shift


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
