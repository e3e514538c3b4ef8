"""The encoders behind the registry (:mod:`debias.models.registry`); a network is an encoder and a linear head.

``lenet5``      CNC's LeNet-5: conv6-k5, pool, conv16-k5, pool, fc120, fc84 -> 84-d features.
``simpleconv``  Bahng et al.'s SimpleConvNet: 4 x [conv k7 pad 3, BN, ReLU] (16, 32, 64, 128
                channels, no downsampling), global average pool -> 128-d. Heavy on CPU.
``resnet18``    torchvision's ResNet-18 -> 512-d (FairKL paper: Corrupted CIFAR-10, from scratch).
``resnet50``    torchvision's ResNet-50 -> 2048-d (CNC: Waterbirds and CelebA, ImageNet weights, 224 px).
                ``model.stem``: ``imagenet`` keeps torchvision's 7x7 stride-2 convolution and 3x3
                max-pool, ``cifar`` replaces them with one 3x3 stride-1 convolution and no max-pool (the
                usual CIFAR variant); ``auto``: imagenet with pretrained weights or images over 64 px, else
                cifar. (FairKL's released code keeps the ImageNet stem on Corrupted CIFAR-10 and bFFHQ; its
                presets set ``imagenet``.) ``model.pretrained`` keeps the ImageNet stem and loads torchvision's
                IMAGENET1K_V1 weights (what ``pretrained=True`` gave the papers), from the torch hub
                cache (``$TORCH_HOME/hub/checkpoints``) or downloaded into it.
``mlp``         [Linear, ReLU, BatchNorm1d] x len(model.mlp.hidden) (WCL Sec. 6.2: "MLP with ReLU
                activation followed by batch normalization"; widths 3 x 100 as LfF's MLP) on the
                flattened input -> last hidden width; feature vectors, and images too (LfF's
                Colored-MNIST MLP).
A network takes the stored tensors unchanged and normalises them itself: uint8 images ``[N,3,H,W]``
to ``(x/255 - mean) / std`` with the encoder's ``input_mean`` / ``input_std``: ``model.normalization``
(:data:`debias.models.network.NORMALIZATIONS`), whose ``auto`` is 0.5 / 0.5 as in the papers' MNIST code, or the weights' own
ImageNet statistics for pretrained encoders; float32 feature vectors
``[N,F]`` (standardised by their source) pass as they are. ``input_shape`` is the shape of one sample:
``(3, H, W)`` or ``(F,)`` (an int ``s`` means square images, ``(3, s, s)``). The image encoders take
images only: asked for feature vectors, :func:`build_model` uses ``mlp`` instead and warns once
(``model.name`` is then an image-only param, ignored as ``augment_shift`` is); the checkpoint
records the encoder built and its options.

LeNet-5's 2x2 max-pools are :class:`MaxPool2x2`: on CPU, PyTorch's max_pool2d kernel took ~8 ms of
a ~50 ms forward+backward at batch 256 (one thread); the same outputs and gradients from strided
``torch.maximum`` take ~2.6 ms (see the class). Other devices use ``F.max_pool2d``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import FunctionCtx, once_differentiable

from debias.core.errors import DataSourceError
from debias.models.network import Encoder, InputShape
from debias.params import ModelParams


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
        # the position within the window, lower * width + right, in int16 where it fits (narrow passes, measured
        # ~30% less time for the index), widened to int64 by the one add of the windows' offsets
        local = right.to(torch.int16 if width < 2**14 else torch.int64)
        index = torch.add(local, lower, alpha=width).add(_window_offsets(out.shape[-2], out.shape[-1], width, x.device))
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


FEATURE_ACTIVATIONS: dict[str, type[nn.Module]] = {"relu": nn.ReLU, "tanh": nn.Tanh}
DEFAULT_ACTIVATION = "relu"  # the encoders as their papers built them


def feature_activation(name: str) -> nn.Module:
    """The module of ``model.feature_activation`` (relu or tanh)."""
    if name not in FEATURE_ACTIVATIONS:
        raise ValueError(f"feature_activation = '{name}'; allowed: {', '.join(FEATURE_ACTIVATIONS)}")
    return FEATURE_ACTIVATIONS[name]()


class LeNet5(Encoder):
    """The last layer's activation is ``feature_activation`` (relu as in CNC's LeNet-5; tanh for contrastive losses
    used without a projection head)."""

    def __init__(self, image_size: int, feature_activation_name: str = DEFAULT_ACTIVATION) -> None:
        super().__init__()
        side = ((image_size - 4) // 2 - 4) // 2
        if side < 1:
            raise ValueError(f"model.name = lenet5 needs data.image_size >= 16, got {image_size}")
        # max-pool before ReLU: the values and gradients of conv -> ReLU -> pool (ReLU is monotone and zeroes the
        # gradient of a window whose maximum is <= 0 either way; tested), with ReLU on a quarter of the elements
        self.features = nn.Sequential(
            nn.Conv2d(3, 6, 5), MaxPool2x2(), nn.ReLU(),
            nn.Conv2d(6, 16, 5), MaxPool2x2(), nn.ReLU(),
            nn.Flatten(),
            nn.Linear(16 * side * side, 120), nn.ReLU(),
            nn.Linear(120, 84), feature_activation(feature_activation_name),
        )
        self.dim = 84
        self.options = {"feature_activation": feature_activation_name}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.features(x)


class SimpleConvNet(Encoder):
    """The last block's activation (before the average pool) is ``feature_activation``: relu as Bahng et al.; tanh as
    the FairKL authors' contrastive SimpleConvNet without a projection head."""

    def __init__(self, image_size: int, feature_activation_name: str = DEFAULT_ACTIVATION) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        channels = [3, 16, 32, 64, 128]
        for index, (c_in, c_out) in enumerate(zip(channels[:-1], channels[1:])):
            last = index == len(channels) - 2
            layers += [nn.Conv2d(c_in, c_out, 7, padding=3), nn.BatchNorm2d(c_out),
                       feature_activation(feature_activation_name) if last else nn.ReLU()]
        self.features = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.dim = 128
        self.options = {"feature_activation": feature_activation_name}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.features(x)


class MLP(Encoder):
    """Flatten, then [Linear, ReLU, BatchNorm1d] per width of ``hidden`` (no BN when ``batch_norm`` is false)."""

    def __init__(self, input_shape: InputShape, hidden: Sequence[int] = (100, 100, 100), batch_norm: bool = True) -> None:
        super().__init__()
        if not hidden:
            raise ValueError("model.mlp.hidden needs at least one layer width")
        layers: list[nn.Module] = [nn.Flatten()]
        width_in = math.prod(input_shape)
        for width in hidden:
            layers += [nn.Linear(width_in, width), nn.ReLU()]
            if batch_norm:
                layers.append(nn.BatchNorm1d(width))
            width_in = width
        self.features = nn.Sequential(*layers)
        self.dim = int(hidden[-1])
        self.options = {"hidden": [int(w) for w in hidden], "batch_norm": bool(batch_norm)}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.features(x)


class PretrainedWeightsError(DataSourceError):
    """ImageNet weights could not be loaded; the message names the file and where to put it."""


# model.name -> (torchvision builder, weights enum, feature size, the weights the papers used)
RESNETS: dict[str, tuple[str, str, int, str]] = {
    "resnet18": ("resnet18", "ResNet18_Weights", 512, "IMAGENET1K_V1"),
    "resnet50": ("resnet50", "ResNet50_Weights", 2048, "IMAGENET1K_V1"),
}
CIFAR_STEM_MAX_SIDE = 64  # stem auto, from scratch: images up to this side get the 3x3 stride-1 stem without max-pool
RESNET_STEMS = ("cifar", "imagenet")


def resolve_stem(stem: str, image_size: int, pretrained: bool) -> str:
    """``model.stem`` as built: ``auto`` is imagenet with pretrained weights or images over 64 px, else cifar;
    the cifar stem cannot hold the ImageNet weights' 7x7 convolution."""
    if stem not in ("auto", *RESNET_STEMS):
        raise ValueError(f"model.stem = '{stem}'; allowed: auto, {', '.join(RESNET_STEMS)}")
    if stem == "auto":
        return "imagenet" if pretrained or image_size > CIFAR_STEM_MAX_SIDE else "cifar"
    if stem == "cifar" and pretrained:
        raise ValueError("model.stem = cifar cannot load the ImageNet weights (model.pretrained); allowed: imagenet, auto")
    return stem


def resnet_weights(name: str) -> Any:
    """torchvision's weights enum member that ``model.pretrained`` loads for ``name``."""
    import torchvision.models

    _, enum_name, _, tag = RESNETS[name]
    return getattr(torchvision.models, enum_name)[tag]


def weights_preprocessing(name: str) -> dict[str, Any]:
    """The pretrained weights' own transforms: mean, std (0..1 scale), resize and crop sizes."""
    transforms = resnet_weights(name).transforms()
    return {"mean": tuple(transforms.mean), "std": tuple(transforms.std),
            "resize_size": list(transforms.resize_size), "crop_size": list(transforms.crop_size)}


def load_pretrained_state(name: str) -> dict[str, torch.Tensor]:
    """The ImageNet state dict of ``name`` from the torch hub cache, downloaded there when absent."""
    import torch.hub

    weights = resnet_weights(name)
    try:
        return weights.get_state_dict(progress=False, check_hash=True)
    except Exception as exc:  # URLError, HTTPError, hash mismatch, a truncated file, ...
        folder = Path(torch.hub.get_dir()) / "checkpoints"
        filename = weights.url.rsplit("/", 1)[-1]
        raise PretrainedWeightsError(
            f"model.pretrained = true: the ImageNet weights of {name} ({type(weights).__name__}.{weights.name}) could not "
            f"be loaded ({type(exc).__name__}: {exc}). Without network, download {weights.url} elsewhere and put "
            f"{filename} into {folder}/ (the torch hub cache, under $TORCH_HOME, default ~/.cache/torch), "
            "or set model.pretrained = false") from None


class ResNet(Encoder):
    """torchvision ResNet without its classifier, with the ``stem`` :func:`resolve_stem` picks; ImageNet weights and
    statistics when ``pretrained``."""

    def __init__(self, name: str, image_size: int, pretrained: bool = False, load_weights: bool = True,
                 stem: str = "auto") -> None:
        super().__init__()
        import torchvision.models

        builder, _, dim, _ = RESNETS[name]
        net = getattr(torchvision.models, builder)(weights=None)
        self.stem = resolve_stem(stem, image_size, pretrained)
        if pretrained:
            if load_weights:
                net.load_state_dict(load_pretrained_state(name))
            preprocessing = weights_preprocessing(name)
            self.input_mean, self.input_std = preprocessing["mean"], preprocessing["std"]
        if self.stem == "cifar":
            net.conv1 = nn.Conv2d(3, net.conv1.out_channels, 3, stride=1, padding=1, bias=False)
            net.maxpool = nn.Identity()
        net.fc = nn.Identity()
        self.net = net
        self.dim = dim
        self.pretrained = pretrained

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class ResNet18(ResNet):
    def __init__(self, image_size: int, pretrained: bool = False, load_weights: bool = True, stem: str = "auto") -> None:
        super().__init__("resnet18", image_size, pretrained, load_weights, stem)


class ResNet50(ResNet):
    def __init__(self, image_size: int, pretrained: bool = False, load_weights: bool = True, stem: str = "auto") -> None:
        super().__init__("resnet50", image_size, pretrained, load_weights, stem)


def resnet_builder(cls: type[ResNet]) -> Callable[..., Encoder]:
    """The registry's builder of ``cls``: ``build(shape, load_weights, pretrained, stem)``, options checkpointed."""
    def build(shape: InputShape, load_weights: bool = True, pretrained: bool = False, stem: str = "auto") -> Encoder:
        encoder = cls(shape[-1], pretrained, load_weights, stem)
        # stem auto is left out, so checkpoints (and resume keys) of auto runs stay as before the option existed
        encoder.options = {"pretrained": bool(pretrained), **({"stem": stem} if stem != "auto" else {})}
        return encoder

    return build


def resnet_options(model: ModelParams) -> dict[str, Any]:
    """A ResNet's options from ``params.model``: pretrained, and the stem unless it is auto."""
    return {"pretrained": model.pretrained, **({"stem": model.stem} if model.stem != "auto" else {})}
