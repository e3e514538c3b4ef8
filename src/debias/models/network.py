"""A network: an :class:`Encoder` (features z) then a linear head, normalising its inputs itself.

``input_shape`` is the shape of one sample: ``(3, H, W)`` images or ``(F,)`` feature vectors (an int ``s`` means
square images, ``(3, s, s)``). Images (uint8 ``[N,3,H,W]``) become ``(x/255 - mean) / std`` with the encoder's
``input_mean`` / ``input_std`` (:data:`NORMALIZATIONS`); float32 feature vectors ``[N,F]`` pass as they are.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


InputShape = tuple[int, ...]  # one sample: (3, H, W) images or (F,) feature vectors
INPUT_MODALITIES = {3: "image", 1: "tabular"}  # by the number of dimensions of one sample
PAPERS_MEAN_STD = (0.5, 0.5, 0.5)  # the papers' code: inputs normalised with mean 0.5, std 0.5
# model.normalization -> (mean, std) per channel on the 0..1 scale. cifar10: FairKL's released main_infonce.py for
# cifar10, corrupted-cifar10 and bffhq; imagenet: torchvision's ImageNet weights' (their transforms()).
NORMALIZATIONS: dict[str, tuple[tuple[float, float, float], tuple[float, float, float]]] = {
    "half": (PAPERS_MEAN_STD, PAPERS_MEAN_STD),
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010)),
    "imagenet": ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
}


def as_input_shape(shape: int | Sequence[int]) -> InputShape:
    """``(3, s, s)`` for an int ``s`` (square images), else the tuple; only images and feature vectors are allowed."""
    shape = (3, int(shape), int(shape)) if isinstance(shape, int) else tuple(int(d) for d in shape)
    if len(shape) not in INPUT_MODALITIES or any(d < 1 for d in shape):
        raise ValueError(f"input shape {shape} is neither images (3, H, W) nor feature vectors (F,)")
    return shape


def input_modality(shape: int | Sequence[int]) -> str:
    """'image' or 'tabular' for the shape of one sample."""
    return INPUT_MODALITIES[len(as_input_shape(shape))]


class Encoder(nn.Module):
    """Maps inputs to features; ``dim`` is the feature size, ``options`` its architecture settings (checkpointed);
    images are normalised with ``input_mean`` / ``input_std`` (per channel, 0..1 scale)."""

    dim: int
    options: dict[str, Any] = {}
    input_mean: tuple[float, float, float] = PAPERS_MEAN_STD
    input_std: tuple[float, float, float] = PAPERS_MEAN_STD


class Network(nn.Module):
    """``encoder`` then linear ``head``; input uint8 (or float in 0..255) ``[N,3,H,W]`` or float features ``[N,F]``."""

    def __init__(self, encoder: Encoder, n_classes: int) -> None:
        super().__init__()
        self.encoder = encoder
        self.head = nn.Linear(encoder.dim, n_classes)
        # (x/255 - mean) / std computed as x / (255 std) - mean / std: for 0.5 / 0.5 exactly x / 127.5 - 1.
        # Buffers follow the model to its device; not persistent, so checkpoints hold weights only.
        std, mean = torch.tensor(encoder.input_std), torch.tensor(encoder.input_mean)
        self.register_buffer("input_scale", (std * 255.0).view(1, -1, 1, 1), persistent=False)
        self.register_buffer("input_shift", (mean / std).view(1, -1, 1, 1), persistent=False)

    def normalise(self, x: torch.Tensor) -> torch.Tensor:
        """Images (uint8 or 0..255 float) to the encoder's input scale; feature vectors unchanged; both in the
        default float dtype (float32 unless a caller, e.g. a float64 test, changed it)."""
        dtype = torch.get_default_dtype()
        if x.ndim == 4:
            return x.to(dtype).div(self.input_scale.to(dtype)).sub(self.input_shift.to(dtype))
        if x.ndim == 2:
            return x.to(dtype)
        raise ValueError(f"input of shape {tuple(x.shape)}: allowed: images [N,3,H,W] or feature vectors [N,F]")

    autocast: torch.dtype | None = None  # stage2.speed.autocast: the encoder's forward under autocast to this dtype

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        """Encoder outputs z (unnormalised), ``[N, dim]``; under ``autocast`` (bf16) cast back to the default float
        dtype, so the losses and the head compute in float32."""
        if self.autocast is None:
            return self.encoder(self.normalise(x))
        with torch.autocast(x.device.type, dtype=self.autocast):
            z = self.encoder(self.normalise(x))
        return z.to(torch.get_default_dtype())

    head_input: str = "raw"  # HEAD_INPUTS: what the head reads, z itself or z / |z| (checkpoints record it)

    def head_features(self, z: torch.Tensor) -> torch.Tensor:
        """The head's input from encoder outputs ``z``: ``z`` (``raw``) or ``z / |z|`` (``unit``)."""
        return F.normalize(z, dim=1) if self.head_input == "unit" else z

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.head_features(self.embed(x)))

    def embed_and_classify(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(z, head(head_features(z)))``: the encoder outputs as they are, and the logits."""
        z = self.embed(x)
        return z, self.head(self.head_features(z))
