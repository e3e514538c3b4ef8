"""The encoder registry: ``model.name`` -> how to build it, which inputs it takes, its options from params.

:func:`build_model` builds a :class:`~debias.models.network.Network` for samples of a given shape; an image-only
encoder asked for feature vectors is replaced by ``mlp`` with a warning (``model.name`` is then an image-only param).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from debias.models.encoders import (DEFAULT_ACTIVATION, MLP, LeNet5, ResNet18, ResNet50, SimpleConvNet,
                                    resnet_builder, resnet_options)
from debias.models.network import NORMALIZATIONS, Encoder, InputShape, Network, as_input_shape, input_modality
from debias.params import ACTIVATION_ENCODERS, ModelParams


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
    "resnet18": EncoderSpec(resnet_builder(ResNet18), ("image",), resnet_options),
    "resnet50": EncoderSpec(resnet_builder(ResNet50), ("image",), resnet_options),
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


def build_network(name: str, n_classes: int, shape: InputShape, options: dict[str, Any],
                  load_weights: bool = True) -> Network:
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
    return build_network(name, n_classes, shape, encoder_options(model, name, method_default))


def build_encoder(model: str | ModelParams, input_shape: int | Sequence[int]) -> Encoder:
    return build_model(model, 1, input_shape).encoder
