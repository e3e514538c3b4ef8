"""Checkpoints of networks: the encoder built, its options, the shapes and the weights; rebuilt without pickle."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from debias.core.errors import CorruptFileError, StaleInputError
from debias.models.network import InputShape, Network, as_input_shape
from debias.models.registry import DEFAULT_ACTIVATION, ENCODERS, build_network, encoder_options, resolve_encoder
from debias.params import HEAD_INPUTS, ModelParams


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
        model = build_network(name, int(payload["n_classes"]), shape, options, load_weights=False)
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
