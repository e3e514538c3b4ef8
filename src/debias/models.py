"""Models behind a registry, each split into an ``encoder`` (features z) and a linear ``head``.

``lenet5``      CNC's LeNet-5: conv6-k5, pool, conv16-k5, pool, fc120, fc84 -> 84-d features.
``simpleconv``  Bahng et al.'s SimpleConvNet: 4 x [conv k7 pad 3, BN, ReLU] (16, 32, 64, 128
                channels, no downsampling), global average pool -> 128-d. Heavy on CPU.
``resnet18``    torchvision's ResNet-18 (random init) -> 512-d; images of 64 px or less get a
                3x3 stride-1 stem without max-pool (the usual CIFAR variant).
A network takes uint8 images ``[N,3,H,W]`` and normalises them itself ((x/255 - 0.5) / 0.5,
as in the papers' code), so every stage feeds it the stored tensors unchanged.

LeNet-5's 2x2 max-pools are :class:`MaxPool2x2`: on CPU, PyTorch's max_pool2d kernel took ~8 ms of
a ~50 ms forward+backward at batch 256 (one thread); the same outputs and gradients from strided
``torch.maximum`` take ~2.6 ms (see the class). Other devices use ``F.max_pool2d``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import FunctionCtx, once_differentiable


class Encoder(nn.Module):
    """Maps images to features; ``dim`` is the feature size."""

    dim: int


class Network(nn.Module):
    """``encoder`` then linear ``head``; input uint8 (or float in 0..255) ``[N,3,H,W]``."""

    def __init__(self, encoder: Encoder, n_classes: int) -> None:
        super().__init__()
        self.encoder = encoder
        self.head = nn.Linear(encoder.dim, n_classes)

    @staticmethod
    def normalise(x: torch.Tensor) -> torch.Tensor:
        return x.float().div(127.5).sub(1.0)

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        """Encoder outputs z (unnormalised), ``[N, dim]``."""
        return self.encoder(self.normalise(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(x))

    def embed_and_classify(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        z = self.embed(x)
        return z, self.head(z)


_POOL_OFFSETS: dict[tuple[int, int, int, torch.device], torch.Tensor] = {}


def _window_offsets(rows: int, cols: int, width: int, device: torch.device) -> torch.Tensor:
    """Flat index (within one H x W plane) of the top-left element of each 2x2 window: int64 [rows, cols]."""
    key = (rows, cols, width, device)
    if key not in _POOL_OFFSETS:
        _POOL_OFFSETS[key] = (torch.arange(rows, device=device)[:, None] * (2 * width)
                              + torch.arange(cols, device=device)[None, :] * 2)
    return _POOL_OFFSETS[key]


def _window_corners(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The four elements of every 2x2 window, row-major (top-left, top-right, bottom-left, bottom-right)
    as strided views; a last odd row or column is dropped, as max_pool2d's floor mode does."""
    h, w = x.shape[-2] // 2 * 2, x.shape[-1] // 2 * 2
    return x[..., 0:h:2, 0:w:2], x[..., 0:h:2, 1:w:2], x[..., 1:h:2, 0:w:2], x[..., 1:h:2, 1:w:2]


class _MaxPool2x2Function(torch.autograd.Function):
    """``F.max_pool2d(x, 2)`` for ``[N, C, H, W]``: the same values, and the gradient routed to the same
    element (the first maximum of the window in row-major order; ties are common: flat image regions)
    through PyTorch's own max_pool2d backward with indices computed from three comparisons.
    For a window holding NaN the output is NaN as well, but its gradient may go to another element."""

    @staticmethod
    def forward(ctx: FunctionCtx, x: torch.Tensor) -> torch.Tensor:
        a, b, c, d = _window_corners(x)
        top, bottom = torch.maximum(a, b), torch.maximum(c, d)
        out = torch.maximum(top, bottom)
        top_right, bottom_right, lower = b > a, d > c, bottom > top  # strict: ties keep the earlier element
        right = (lower & bottom_right) | (~lower & top_right)
        width = x.shape[-1]
        index = torch.add(_window_offsets(out.shape[-2], out.shape[-1], width, x.device), lower.long(),
                          alpha=width).add_(right)
        ctx.save_for_backward(x, index)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx: FunctionCtx, grad: torch.Tensor) -> torch.Tensor:
        x, index = ctx.saved_tensors
        return torch.ops.aten.max_pool2d_with_indices_backward(grad.contiguous(), x, [2, 2], [2, 2], [0, 0],
                                                               [1, 1], False, index)


class MaxPool2x2(nn.Module):
    """2x2 max-pool with stride 2, exactly ``nn.MaxPool2d(2)`` (values and gradients), faster on CPU."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type != "cpu" or x.dim() != 4 or not x.is_contiguous():
            return F.max_pool2d(x, 2)
        if not (torch.is_grad_enabled() and x.requires_grad):
            a, b, c, d = _window_corners(x)
            return torch.maximum(torch.maximum(a, b), torch.maximum(c, d))
        return _MaxPool2x2Function.apply(x)


class LeNet5(Encoder):
    def __init__(self, image_size: int) -> None:
        super().__init__()
        side = ((image_size - 4) // 2 - 4) // 2
        if side < 1:
            raise ValueError(f"model.name = lenet5 needs data.image_size >= 16, got {image_size}")
        self.features = nn.Sequential(
            nn.Conv2d(3, 6, 5), nn.ReLU(), MaxPool2x2(),
            nn.Conv2d(6, 16, 5), nn.ReLU(), MaxPool2x2(),
            nn.Flatten(),
            nn.Linear(16 * side * side, 120), nn.ReLU(),
            nn.Linear(120, 84), nn.ReLU(),
        )
        self.dim = 84

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.features(x)


class SimpleConvNet(Encoder):
    def __init__(self, image_size: int) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        channels = [3, 16, 32, 64, 128]
        for c_in, c_out in zip(channels[:-1], channels[1:]):
            layers += [nn.Conv2d(c_in, c_out, 7, padding=3), nn.BatchNorm2d(c_out), nn.ReLU()]
        self.features = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.dim = 128

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.features(x)


class ResNet18(Encoder):
    def __init__(self, image_size: int) -> None:
        super().__init__()
        from torchvision.models import resnet18

        net = resnet18(weights=None)
        if image_size <= 64:
            net.conv1 = nn.Conv2d(3, 64, 3, stride=1, padding=1, bias=False)
            net.maxpool = nn.Identity()
        net.fc = nn.Identity()
        self.net = net
        self.dim = 512

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


ENCODERS: dict[str, Callable[[int], Encoder]] = {
    "lenet5": LeNet5,
    "simpleconv": SimpleConvNet,
    "resnet18": ResNet18,
}


def build_model(name: str, n_classes: int, image_size: int) -> Network:
    """A freshly initialised network from the registry."""
    if name not in ENCODERS:
        raise ValueError(f"model.name = '{name}' is unknown; allowed: {sorted(ENCODERS)}")
    return Network(ENCODERS[name](image_size), n_classes)


def build_encoder(name: str, image_size: int) -> Encoder:
    if name not in ENCODERS:
        raise ValueError(f"model.name = '{name}' is unknown; allowed: {sorted(ENCODERS)}")
    return ENCODERS[name](image_size)


def save_network(path: str, model: Network, name: str, n_classes: int, image_size: int, **meta: object) -> None:
    """Checkpoint: registry name, shape facts and weights (atomic)."""
    from debias.io import save_torch

    save_torch(path, {"model_name": name, "n_classes": n_classes, "image_size": image_size,
                      "state_dict": model.state_dict(), "meta": dict(meta)}, kind="checkpoint")


def load_network(path: str) -> tuple[Network, dict]:
    """Rebuild a network from :func:`save_network`; a foreign or truncated file is a CorruptFileError."""
    from debias.io import CorruptFileError, load_torch

    payload = load_torch(path, "checkpoint", ("model_name", "n_classes", "image_size", "state_dict"))
    model = build_model(payload["model_name"], int(payload["n_classes"]), int(payload["image_size"]))
    try:
        model.load_state_dict(payload["state_dict"])
    except RuntimeError as exc:
        raise CorruptFileError(f"{path}: weights do not fit {payload['model_name']} ({str(exc)[:200]})") from None
    model.eval()
    return model, payload


def load_initial_weights(path: str, model_name: str, n_classes: int, image_size: int) -> dict[str, torch.Tensor]:
    """The weights of the checkpoint at ``path`` to start another training from; it must hold ``model_name``
    for the same classes and image size, else :class:`debias.errors.StaleInputError` says what to rerun."""
    from debias.errors import StaleInputError

    network, payload = load_network(path)
    found = (payload["model_name"], int(payload["n_classes"]), int(payload["image_size"]))
    wanted = (model_name, n_classes, image_size)
    if found != wanted:
        raise StaleInputError(
            f"{path} holds a {found[0]} for {found[1]} classes at {found[2]} px, but this run trains a {wanted[0]} for "
            f"{wanted[1]} classes at {wanted[2]} px (model.name, the data): rerun train_erm (dvc repro train_erm), "
            "or use stage2.cnc.init: scratch")
    return network.state_dict()

