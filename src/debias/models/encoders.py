"""Models behind a registry, each split into an ``encoder`` (features z) and a linear ``head``.

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
(:data:`NORMALIZATIONS`), whose ``auto`` is 0.5 / 0.5 as in the papers' MNIST code, or the weights' own
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
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import FunctionCtx, once_differentiable

from debias.core.errors import CorruptFileError, DataSourceError, StaleInputError
from debias.params import ACTIVATION_ENCODERS, HEAD_INPUTS, ModelParams

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


def _resnet(cls: type[ResNet]) -> Callable[..., Encoder]:
    def build(shape: InputShape, load_weights: bool = True, pretrained: bool = False, stem: str = "auto") -> Encoder:
        encoder = cls(shape[-1], pretrained, load_weights, stem)
        # stem auto is left out, so checkpoints (and resume keys) of auto runs stay as before the option existed
        encoder.options = {"pretrained": bool(pretrained), **({"stem": stem} if stem != "auto" else {})}
        return encoder

    return build


def _resnet_options(model: ModelParams) -> dict[str, Any]:
    return {"pretrained": model.pretrained, **({"stem": model.stem} if model.stem != "auto" else {})}


@dataclass(frozen=True)
class EncoderSpec:
    """A registered encoder: ``build(input_shape, load_weights=True, **options)``, the modalities it takes,
    and ``options(params.model)``: its architecture settings from params (checkpointed with the weights)."""

    build: Callable[..., Encoder]
    modalities: tuple[str, ...]
    options: Callable[[ModelParams], dict[str, Any]] = lambda model: {}


ENCODERS: dict[str, EncoderSpec] = {
    "lenet5": EncoderSpec(lambda shape, load_weights=True, feature_activation=DEFAULT_ACTIVATION:
                          LeNet5(shape[-1], feature_activation), ("image",)),
    "simpleconv": EncoderSpec(lambda shape, load_weights=True, feature_activation=DEFAULT_ACTIVATION:
                              SimpleConvNet(shape[-1], feature_activation), ("image",)),
    "resnet18": EncoderSpec(_resnet(ResNet18), ("image",), _resnet_options),
    "resnet50": EncoderSpec(_resnet(ResNet50), ("image",), _resnet_options),
    "mlp": EncoderSpec(lambda shape, load_weights=True, **options: MLP(shape, **options), ("image", "tabular"),
                       lambda model: model.mlp.model_dump(mode="json")),
}
FEATURE_ENCODER = "mlp"  # used for feature vectors when model.name names an image-only encoder


def resolve_encoder(name: str, input_shape: int | Sequence[int]) -> str:
    """``name`` if it takes this input, else (feature vectors with an image encoder) ``mlp``, with a warning."""
    if name not in ENCODERS:
        raise ValueError(f"model.name = '{name}' is unknown; allowed: {sorted(ENCODERS)}")
    modality = input_modality(input_shape)
    if modality in ENCODERS[name].modalities:
        return name
    warnings.warn(f"model.name = {name} takes images; the data holds feature vectors {tuple(as_input_shape(input_shape))}, "
                  f"so the {FEATURE_ENCODER} encoder (model.{FEATURE_ENCODER}) is used instead", stacklevel=3)
    return FEATURE_ENCODER


def resolve_activation(model: str | ModelParams, method_default: str = DEFAULT_ACTIVATION) -> str:
    """``model.feature_activation``, with ``auto`` resolved to the training method's own choice ``method_default``."""
    chosen = model.feature_activation if isinstance(model, ModelParams) else "auto"
    return method_default if chosen == "auto" else chosen


def encoder_options(model: str | ModelParams, name: str, method_default: str = DEFAULT_ACTIVATION) -> dict[str, Any]:
    """The options of encoder ``name`` from ``params.model`` (a ModelParams), else the params' defaults; encoders with a
    configurable feature layer (``ACTIVATION_ENCODERS``) get ``feature_activation`` resolved for the method; a
    ``normalization`` other than auto is one more option of every encoder."""
    params = model if isinstance(model, ModelParams) else ModelParams()
    options = ENCODERS[name].options(params)
    if name in ACTIVATION_ENCODERS:
        options = {**options, "feature_activation": resolve_activation(model, method_default)}
    if params.normalization != "auto":
        options = {**options, "normalization": params.normalization}
    return options


def _build(name: str, n_classes: int, shape: InputShape, options: dict[str, Any], load_weights: bool = True) -> Network:
    """The network of registry entry ``name``; ``options["normalization"]`` (when present) replaces the encoder's own
    input statistics and stays in its options (checkpoints record it)."""
    options = dict(options)
    normalization = options.pop("normalization", None)
    encoder = ENCODERS[name].build(shape, load_weights=load_weights, **options)
    if normalization is not None:
        if normalization not in NORMALIZATIONS:
            raise ValueError(f"model.normalization = '{normalization}'; allowed: auto, {', '.join(NORMALIZATIONS)}")
        encoder.input_mean, encoder.input_std = NORMALIZATIONS[normalization]
        encoder.options = {**encoder.options, "normalization": normalization}
    network = Network(encoder, n_classes)
    network.encoder_name = name  # the registry name actually built (checkpoints record it)
    return network


def build_model(model: str | ModelParams, n_classes: int, input_shape: int | Sequence[int],
                method_default: str = DEFAULT_ACTIVATION) -> Network:
    """A network from the registry for samples of ``input_shape`` (``(3,H,W)``, ``(F,)`` or a side): freshly
    initialised, or with ImageNet weights (``model.pretrained``). ``model`` is a registry name (the encoder's
    default options) or ``params.model`` (options from params); ``method_default`` is the feature activation of the
    training method, used where ``model.feature_activation`` is ``auto``."""
    shape = as_input_shape(input_shape)
    name = resolve_encoder(model if isinstance(model, str) else model.name, shape)
    return _build(name, n_classes, shape, encoder_options(model, name, method_default))


def build_encoder(model: str | ModelParams, input_shape: int | Sequence[int]) -> Encoder:
    return build_model(model, 1, input_shape).encoder


def save_network(path: str, model: Network, name: str, n_classes: int, input_shape: int | Sequence[int],
                 **meta: object) -> None:
    """Checkpoint: the encoder built (``name`` as resolved for the input), its options, shapes and weights (atomic)."""
    from debias.core.io import save_torch

    shape = as_input_shape(input_shape)
    built = getattr(model, "encoder_name", None) or resolve_encoder(name, shape)
    head = {} if model.head_input == "raw" else {"head_input": model.head_input}  # raw: the checkpoint as before
    save_torch(path, {"model_name": built, "n_classes": n_classes, "input_shape": list(shape),
                      "options": dict(model.encoder.options), **head, "state_dict": model.state_dict(),
                      "meta": dict(meta)},
               kind="checkpoint")


def load_network(path: str) -> tuple[Network, dict]:
    """Rebuild a network from :func:`save_network` (a pretrained one from its own weights, without downloading);
    a foreign or truncated file is a CorruptFileError. Older checkpoints hold ``image_size`` (square images)."""
    from debias.core.io import load_torch

    payload = load_torch(path, "checkpoint", ("model_name", "n_classes", "state_dict"))
    if "input_shape" not in payload and "image_size" not in payload:
        raise CorruptFileError(f"{path} lacks ['input_shape']; it was written by another version: rerun its stage")
    name = str(payload["model_name"])
    if name not in ENCODERS:
        raise CorruptFileError(f"{path}: model {name!r} is not in the registry ({sorted(ENCODERS)}); rerun its stage")
    options = dict(payload.get("options") or {})
    if "pretrained" in payload:  # written before options held it
        options["pretrained"] = bool(payload["pretrained"])
    try:
        shape = as_input_shape(payload["input_shape"] if "input_shape" in payload else int(payload["image_size"]))
        model = _build(name, int(payload["n_classes"]), shape, options, load_weights=False)
        model.load_state_dict(payload["state_dict"])
        model.head_input = str(payload.get("head_input", "raw"))  # written before it existed: raw
        if model.head_input not in HEAD_INPUTS:
            raise ValueError(f"head_input {model.head_input!r} is not one of {HEAD_INPUTS}")
    except (RuntimeError, ValueError, TypeError) as exc:
        raise CorruptFileError(f"{path}: weights do not fit {payload['model_name']} ({str(exc)[:200]})") from None
    model.eval()
    return model, payload


def load_initial_weights(path: str, model: ModelParams, n_classes: int, input_shape: int | Sequence[int],
                         method_default: str = DEFAULT_ACTIVATION) -> dict[str, torch.Tensor]:
    """The weights of the checkpoint at ``path`` to start another training from; it must hold the encoder
    ``params.model`` builds, for the same classes and input shape, else :class:`StaleInputError` says what to rerun."""
    network, payload = load_network(path)
    shape = as_input_shape(input_shape)
    name = resolve_encoder(model.name, shape)
    found = (payload["model_name"], int(payload["n_classes"]), tuple(network_input_shape(payload)),
             dict(payload.get("options") or {}))
    wanted = (name, n_classes, shape, encoder_options(model, name, method_default))
    if found != wanted:
        raise StaleInputError(
            f"{path} holds a {found[0]} {found[3] or ''} for {found[1]} classes and inputs {found[2]}, but this run "
            f"trains a {wanted[0]} {wanted[3] or ''} for {wanted[1]} classes and inputs {wanted[2]} (params.model, the "
            "data): rerun train_erm (dvc repro train_erm), or use stage2.cnc.init: scratch")
    return network.state_dict()


def network_input_shape(payload: dict[str, Any]) -> InputShape:
    """The input shape a checkpoint payload was trained for."""
    return as_input_shape(payload["input_shape"] if "input_shape" in payload else int(payload["image_size"]))
