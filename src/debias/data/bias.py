"""Bias protocols behind a registry: colour grey digits so that colour predicts the class, or use the data's own attribute.

``foreground``  CMNIST* (CNC App. D.1 and its code): classes are digit pairs; stroke pixels
                with grey >= threshold take a colour in all channels, fainter strokes keep
                their grey, the background stays black. Train: the class colour with
                probability p_corr (Bernoulli per image), else one of the other colours
                uniformly; validation and test: uniform over all colours.
``background``  Biased-MNIST (Bahng et al.; FairKL paper): stroke pixels (value > 0) become
                white, background pixels take the colour. Per class the first floor(n*rho)
                shuffled images get the class colour and the rest is cut into equal chunks
                (size ceil(rest / (K-1))) over the other colours; val/test use eval_rho.
``given``       the source supplies the attribute ``a`` (bring-your-own biased data); the
                attribute aligned with a class is its most frequent one in training.
``corruption``  Corrupted CIFAR-10 (LfF, Nam et al. 2020; DFA, Lee et al. 2021; FairKL paper Table 4):
                class i is correlated with corruption ``types[i]``. LfF's count rule: per class a
                share rho (train) or eval_rho (val/test; 0.1 = uniform over ten types) of its
                shuffled images takes the class's corruption and the rest is divided equally over the
                other types (rounded cumulative milestones); corruptions from
                :mod:`debias.data.corruptions` at ``severity``, seeded per split and type.
``none``        the data has no bias labels (an image folder without an attribute column, an npz without
                ``a``): ``a`` None, groups only inferred; every number that needs the attribute says so.
``auto``        (the default) resolved per dataset by :func:`resolve_protocol`: ``given`` when the
                raw data carries its own attribute ``a`` (adult, compas, an npz with ``a``), ``none`` when a
                source of real attributes (``given``) has none (no attribute column), else the
                protocol the source registered (``register_source(protocol=...)``: ``foreground`` for the
                digit sources, ``corruption`` for cifar10). The raw splits file records its source and
                that protocol, so inject_bias resolves ``auto`` from its own inputs (its params are ``seed``
                and ``bias`` only) and imports no source module.
Feature vectors ``[N,F]`` (adult, compas) pass through ``given`` unchanged (nothing to colour); each
protocol names the modalities it can bias: foreground, background and corruption take images only.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from debias.core.errors import BiasProtocolError
from debias.core.errors import BiasProtocolError, NEEDS_BIAS_LABELS
from debias.data import corruptions
from debias.data.raw import RawSplits
from debias.data.store import BiasedSplit
from debias.params import BackgroundParams, BiasParams, ForegroundParams

SPLIT_SEED_OFFSET = {"train": 0, "val": 1, "test": 2}
# The summary's numbers that need the attribute; without bias labels each reads NEEDS_BIAS_LABELS.
ATTRIBUTE_SUMMARY_KEYS = ("n_attrs", "realised_correlation", "n_aligned", "n_conflicting", "empty_groups", "group_counts")


ProtocolFn = Callable[[RawSplits, BiasParams, int], dict[str, BiasedSplit]]
PROTOCOLS: dict[str, ProtocolFn] = {}
PROTOCOL_MODALITIES: dict[str, tuple[str, ...]] = {}  # the data each protocol can bias: 'image', 'tabular'
AUTO = "auto"


def register_protocol(name: str, modalities: tuple[str, ...] = ("image",)) -> Callable[[ProtocolFn], ProtocolFn]:
    """Register ``fn`` as ``bias.protocol = name``; ``modalities`` are the kinds of ``x`` it can bias."""
    def decorate(fn: ProtocolFn) -> ProtocolFn:
        PROTOCOLS[name] = fn
        PROTOCOL_MODALITIES[name] = modalities
        return fn

    return decorate


def resolve_protocol(requested: str, splits: RawSplits, source: str | None, source_protocol: str | None = None) -> str:
    """``requested`` itself, or for ``auto``: ``given`` when every split carries ``a``, else ``source_protocol``, the
    protocol ``source`` registered as the raw splits file records it (:func:`debias.data.store.load_raw_data`)."""
    if requested != AUTO:
        return requested
    if all(split.a is not None for split in splits.values()):
        return "given"
    if source_protocol == "given":  # a source of real attributes that has none here (no attribute column)
        return "none"
    if source_protocol is not None:
        return source_protocol
    recorded = "no source" if source is None else f"the source {source!r} but not its protocol"
    raise BiasProtocolError(
        f"bias.protocol = auto cannot tell which protocol the data calls for: the raw splits carry no attribute a "
        f"and record {recorded}; rerun the download stage (dvc repro -f download) or name the protocol "
        f"(allowed: {sorted(PROTOCOLS)})")


def to_grey(x: np.ndarray) -> np.ndarray:
    """uint8 ``[N,H,W]`` unchanged; ``[N,H,W,3]`` to luminance (ITU-R 601 weights)."""
    if x.ndim == 3:
        return x
    weights = np.array([0.299, 0.587, 0.114], dtype=np.float32)
    return np.round(x.astype(np.float32) @ weights).clip(0, 255).astype(np.uint8)


def paint(grey: torch.Tensor, colour_index: torch.Tensor, palette: torch.Tensor, where: torch.Tensor,
          elsewhere: torch.Tensor) -> torch.Tensor:
    """RGB uint8 ``[N,3,H,W]``: ``palette[colour_index]`` where ``where`` is true, ``elsewhere`` otherwise."""
    colours = palette[colour_index][:, :, None, None]  # [N,3,1,1]
    return torch.where(where[:, None], colours, elsewhere).to(torch.uint8)


def other_colour(own: np.ndarray, n_colours: int, rng: np.random.Generator) -> np.ndarray:
    """A colour drawn uniformly from the ``n_colours - 1`` colours other than ``own``."""
    shift = rng.integers(1, n_colours, size=own.shape)
    return (own + shift) % n_colours


# --------------------------------------------------------------------------- foreground


def foreground_colour_indices(y: np.ndarray, split: str, params: ForegroundParams, rng: np.random.Generator) -> np.ndarray:
    """Train: class colour w.p. p_corr else another uniformly; val/test: uniform over all colours."""
    n_classes = len(params.class_digits)
    if split == "train":
        aligned = rng.random(len(y)) < params.p_corr
        return np.where(aligned, y, other_colour(y, n_classes, rng))
    return rng.integers(0, n_classes, size=len(y))


def colour_foreground(grey: np.ndarray, colour: np.ndarray, params: ForegroundParams) -> torch.Tensor:
    """Strokes with grey >= threshold take the colour in all channels; the rest keeps its grey."""
    g = torch.from_numpy(np.ascontiguousarray(grey))
    palette = torch.tensor(params.colours[: len(params.class_digits)], dtype=torch.uint8)
    stroke = g >= params.stroke_threshold
    return paint(g, torch.from_numpy(colour), palette, stroke, g[:, None].expand(-1, 3, -1, -1))


@register_protocol("foreground", modalities=("image",))
def foreground(splits: RawSplits, bias: BiasParams, seed: int) -> dict[str, BiasedSplit]:
    params = bias.foreground
    # label -> class by sorted lookup, not a dense table sized by the largest label (a stray label such
    # as 2**32 - 1 in a bring-your-own npz would allocate tens of GiB); inject_bias refused labels not named.
    digits = np.array([d for group in params.class_digits for d in group], dtype=np.int64)
    classes = np.array([c for c, group in enumerate(params.class_digits) for _ in group], dtype=np.int64)
    order = np.argsort(digits)
    digits, classes = digits[order], classes[order]

    def digit_to_class(labels: np.ndarray) -> np.ndarray:
        at = np.searchsorted(digits, labels).clip(max=len(digits) - 1)
        return np.where(digits[at] == labels, classes[at], -1)

    out: dict[str, BiasedSplit] = {}
    for name, raw in splits.items():
        raw = raw.take(np.flatnonzero(digit_to_class(raw.y) >= 0))
        y = digit_to_class(raw.y)
        rng = np.random.default_rng([seed, SPLIT_SEED_OFFSET[name], 17])
        colour = foreground_colour_indices(y, name, params, rng)
        x = colour_foreground(to_grey(raw.x), colour, params)
        out[name] = BiasedSplit(x, torch.from_numpy(y), torch.from_numpy(colour), torch.from_numpy(colour == y),
                                len(params.class_digits), len(params.class_digits))
    return out


# --------------------------------------------------------------------------- background


def background_colour_indices(y: np.ndarray, rho: float, n_colours: int, rng: np.random.Generator) -> np.ndarray:
    """Per class: first floor(n*rho) shuffled images get the class colour, the rest equal chunks of the others."""
    colour = np.empty_like(y)
    for label in np.unique(y):  # a loop over classes, not samples
        members = rng.permutation(np.flatnonzero(y == label))
        n_correlated = int(len(members) * rho)
        colour[members[:n_correlated]] = label
        rest = members[n_correlated:]
        chunk = int(np.ceil(len(rest) / (n_colours - 1))) if len(rest) else 1
        others = np.array([c for c in range(n_colours) if c != label])
        colour[rest] = others[np.arange(len(rest)) // chunk]
    return colour


def colour_background(grey: np.ndarray, colour: np.ndarray, params: BackgroundParams) -> torch.Tensor:
    """Strokes (value > 0) white, background (value 0) the colour."""
    g = torch.from_numpy(np.ascontiguousarray(grey))
    palette = torch.tensor(params.colours, dtype=torch.uint8)
    white = torch.full((len(g), 3) + tuple(g.shape[1:]), 255, dtype=torch.uint8)
    return paint(g, torch.from_numpy(colour), palette, g == 0, white)


@register_protocol("background", modalities=("image",))
def background(splits: RawSplits, bias: BiasParams, seed: int) -> dict[str, BiasedSplit]:
    params = bias.background
    n_colours = len(params.colours)
    n_classes = int(max(split.y.max() for split in splits.values())) + 1
    if n_classes > n_colours:
        raise BiasProtocolError(
            f"bias.protocol = background has {n_colours} colours (bias.background.colours) for {n_classes} classes; "
            "allowed: at most one class per colour — add colours or use fewer classes"
        )
    out: dict[str, BiasedSplit] = {}
    for name, raw in splits.items():
        rng = np.random.default_rng([seed, SPLIT_SEED_OFFSET[name], 29])
        rho = params.rho if name == "train" else params.eval_rho
        colour = background_colour_indices(raw.y, rho, n_colours, rng)
        x = colour_background(to_grey(raw.x), colour, params)
        out[name] = BiasedSplit(x, torch.from_numpy(raw.y), torch.from_numpy(colour), torch.from_numpy(colour == raw.y),
                                n_classes, n_colours)
    return out


# --------------------------------------------------------------------------- given


def channels_first(x: np.ndarray) -> torch.Tensor:
    """Raw images as RGB ``[N,3,H,W]`` (grey repeated); feature vectors ``[N,F]`` unchanged."""
    t = torch.from_numpy(np.ascontiguousarray(x))
    if t.ndim == 2:
        return t
    return t[:, None].expand(-1, 3, -1, -1).contiguous() if t.ndim == 3 else t.permute(0, 3, 1, 2).contiguous()


@register_protocol("given", modalities=("image", "tabular"))
def given(splits: RawSplits, bias: BiasParams, seed: int) -> dict[str, BiasedSplit]:
    """Use the source's own attribute ``a``; aligned = the class's most frequent training attribute."""
    if any(split.a is None for split in splits.values()):
        raise BiasProtocolError(
            "bias.protocol = given needs a bias attribute from the source: an npz with an array 'a' "
            "(data.source = npz), or data.source = adult / compas; otherwise use bias.protocol = foreground or background, "
            "or bias.protocol = none for data without bias labels (groups inferred only)"
        )
    n_classes = int(max(split.y.max() for split in splits.values())) + 1
    n_attrs = int(max(split.a.max() for split in splits.values())) + 1  # type: ignore[union-attr]
    n_images = sum(len(split) for split in splits.values())
    for name, count in (("y", n_classes), ("a", n_attrs)):
        if count > n_images:  # checked before the (classes x attributes) tables are allocated
            raise BiasProtocolError(
                f"bias.protocol = given: {name} holds the value {count - 1} for {n_images} images; allowed: indices "
                f"0, 1, ..., K-1 with every value used (relabel {name} to consecutive integers)")
    train = splits["train"]
    if len(np.unique(train.a)) < 2:  # the download stage refuses it too; raw splits of an older one may hold it
        raise BiasProtocolError(
            f"bias.protocol = given: the bias attribute a holds only the value {int(train.a[0])} in the "  # type: ignore[index]
            f"{len(train)} training images; allowed: at least 2 values (one that never varies makes every image "
            "'bias-aligned': a maximal bias that is none); give the attribute that varies, or use a protocol that "
            "makes one (foreground, background)")
    counts = np.zeros((n_classes, n_attrs), dtype=np.int64)
    np.add.at(counts, (train.y, train.a), 1)
    majority = counts.argmax(axis=1)
    out: dict[str, BiasedSplit] = {}
    for name, raw in splits.items():
        a = raw.a
        assert a is not None
        out[name] = BiasedSplit(channels_first(raw.x), torch.from_numpy(raw.y), torch.from_numpy(a),
                                torch.from_numpy(a == majority[raw.y]), n_classes, n_attrs, raw.feature_names)
    return out


@register_protocol("none", modalities=("image",))  # adult / compas define their attribute: they always carry it
def no_attribute(splits: RawSplits, bias: BiasParams, seed: int) -> dict[str, BiasedSplit]:
    """Data without bias labels: ``a`` and ``aligned`` None, ``n_attrs`` 0; groups can only be inferred."""
    if any(split.a is not None for split in splits.values()):
        raise BiasProtocolError("bias.protocol = none, but the raw splits carry a bias attribute a; allowed: none for "
                                "data without one (e.g. data.imagefolder.attribute_column: null), else given or auto")
    n_classes = int(max(split.y.max() for split in splits.values())) + 1
    n_images = sum(len(split) for split in splits.values())
    if n_classes > n_images:
        raise BiasProtocolError(f"bias.protocol = none: y holds the value {n_classes - 1} for {n_images} images; allowed: "
                                "indices 0, 1, ..., K-1 with every value used (relabel y to consecutive integers)")
    return {name: BiasedSplit(channels_first(raw.x), torch.from_numpy(raw.y), None, None, n_classes, 0, raw.feature_names)
            for name, raw in splits.items()}


# --------------------------------------------------------------------------- colourability


def colourable(grey: np.ndarray, protocol: str, bias: BiasParams) -> np.ndarray:
    """Per image, whether the protocol's colour shows on it: foreground needs a pixel with grey >=
    ``stroke_threshold``; background needs a background pixel (grey 0) and a stroke pixel (grey > 0)."""
    flat = grey.reshape(len(grey), -1)
    if protocol == "foreground":
        return (flat >= bias.foreground.stroke_threshold).any(axis=1)
    return (flat == 0).any(axis=1) & (flat > 0).any(axis=1)


def check_colourable(splits: RawSplits, bias: BiasParams, protocol: str) -> dict[str, int]:
    """Images per split on which the colour of ``protocol`` (resolved) would not show; refuse a split where they
    exceed ``bias.max_uncolourable`` (the experiment would be meaningless), naming the param and the data's range."""
    counts: dict[str, int] = {}
    if protocol not in ("foreground", "background"):
        return counts
    for name, raw in splits.items():
        grey = to_grey(raw.x)
        missing = ~colourable(grey, protocol, bias)
        counts[name] = int(missing.sum())
        if len(grey) and counts[name] / len(grey) > bias.max_uncolourable:
            if protocol == "foreground":
                cause = (f"no pixel with grey >= bias.foreground.stroke_threshold = {bias.foreground.stroke_threshold} "
                         f"(the brightest pixel of the split is {int(grey.max())})")
                fix = "lower bias.foreground.stroke_threshold, or give images in 0..255"
            else:
                cause = f"no background pixel (grey 0) or no stroke (grey > 0); the split's grey range is {int(grey.min())}..{int(grey.max())}"
                fix = "use images with a black background, or bias.protocol = foreground"
            raise BiasProtocolError(
                f"bias.protocol = {protocol}: {counts[name]} of {len(grey)} {name} images have {cause}, so their "
                f"colour would not show (allowed: a fraction up to bias.max_uncolourable = {bias.max_uncolourable:g}); {fix}")
    return counts


# --------------------------------------------------------------------------- corruption

CORRUPT_CHUNK = 2048  # images corrupted at once: bounds the float copies (2048 x 3 x 224 x 224 x 4 B = 1.2 GB)


def corruption_indices(y: np.ndarray, rho: float, n_types: int, rng: np.random.Generator) -> np.ndarray:
    """LfF's rule: per class, round(n * cumulative shares) of its shuffled images per type, the class's own type
    taking ``rho`` and every other type ``(1 - rho) / (n_types - 1)``."""
    types = np.empty_like(y)
    for label in np.unique(y):  # a loop over classes, not samples
        members = rng.permutation(np.flatnonzero(y == label))
        shares = np.full(n_types, (1 - rho) / (n_types - 1))
        shares[label] = rho
        milestones = np.round(len(members) * np.cumsum(shares)).astype(np.int64)
        milestones[-1] = len(members)
        types[members] = np.searchsorted(milestones, np.arange(len(members)), side="right")
    return types


@register_protocol("corruption")
def corruption(splits: RawSplits, bias: BiasParams, seed: int) -> dict[str, BiasedSplit]:
    params = bias.corruption
    n_types = len(params.types)
    n_classes = int(max(split.y.max() for split in splits.values())) + 1
    if n_classes > n_types:
        raise BiasProtocolError(
            f"bias.protocol = corruption has {n_types} corruption types (bias.corruption.types) for {n_classes} classes; "
            "allowed: at least one type per class — add types or use fewer classes")
    side = int(next(iter(splits.values())).x.shape[1])
    try:
        fns = [corruptions.resolve(name, params.frost_dir, side, torch.device("cpu")) for name in params.types]
    except corruptions.CorruptionError as exc:
        raise BiasProtocolError(f"bias.protocol = corruption: {exc}") from None
    out: dict[str, BiasedSplit] = {}
    for name, raw in splits.items():
        rng = np.random.default_rng([seed, SPLIT_SEED_OFFSET[name], 31])
        types = corruption_indices(raw.y, params.rho if name == "train" else params.eval_rho, n_types, rng)
        x = channels_first(raw.x)
        for k, fn in enumerate(fns):
            rows = torch.from_numpy(np.flatnonzero(types == k))
            if len(rows):
                generator = torch.Generator().manual_seed(int(np.random.SeedSequence([seed, SPLIT_SEED_OFFSET[name], 31, k])
                                                              .generate_state(1)[0]))
                x[rows] = corruptions.corrupt(x[rows], fn, params.severity, generator, CORRUPT_CHUNK)
        out[name] = BiasedSplit(x, torch.from_numpy(raw.y), torch.from_numpy(types), torch.from_numpy(types == raw.y),
                                n_classes, n_types)
    return out


# --------------------------------------------------------------------------- entry point


def unassigned_labels(labels: np.ndarray, class_digits: list[list[int]], counted: bool = True) -> str | None:
    """The refusal of the foreground protocol when ``labels`` (every image's; ``counted`` false: each label once,
    the images not known) hold labels that no group of ``class_digits`` names (their images would be dropped
    without a word); None when every label has a class."""
    wanted = {d for group in class_digits for d in group}
    present, counts = np.unique(labels, return_counts=True)
    left = [(int(v), int(c)) for v, c in zip(present, counts) if int(v) not in wanted]
    if not left:
        return None
    more = f" and {len(left) - 10} more" if len(left) > 10 else ""
    if counted:
        shown = ", ".join(f"{v} ({c} images)" for v, c in left[:10]) + more
        lost = f"{sum(c for _, c in left)} of {len(labels)} images would be dropped"
    else:
        shown, lost = ", ".join(str(v) for v, _ in left[:10]) + more, "their images would be dropped"
    return (f"bias.foreground.class_digits = {class_digits} puts no class on labels {shown}: {lost} (labels "
            f"present: {present.tolist()[:20]}); allowed: every label of the data in one group (add them to a "
            "group, or a group of their own with a colour in bias.foreground.colours), or data without those labels")


def inject_bias(splits: RawSplits, bias: BiasParams, seed: int, source: str | None = None,
                source_protocol: str | None = None) -> dict[str, BiasedSplit]:
    """Apply ``bias.protocol`` (``auto`` resolved with ``source`` and ``source_protocol``, see
    :func:`resolve_protocol`); every split must keep at least one sample."""
    protocol = resolve_protocol(bias.protocol, splits, source, source_protocol)
    if protocol not in PROTOCOLS:
        raise BiasProtocolError(f"bias.protocol = '{protocol}' is unknown; allowed: {sorted(PROTOCOLS)} or {AUTO}")
    modality = splits["train"].modality
    if modality not in PROTOCOL_MODALITIES[protocol]:
        users = sorted(name for name, kinds in PROTOCOL_MODALITIES.items() if modality in kinds)
        raise BiasProtocolError(
            f"bias.protocol = {protocol} biases {' or '.join(PROTOCOL_MODALITIES[protocol])} data, but the splits hold "
            f"{modality} data{f' (data.source = {source})' if source else ''}; allowed: {', '.join(users)} or {AUTO}")
    if protocol == "foreground":
        every = np.concatenate([s.y for s in splits.values()])
        labels = set(np.unique(every).tolist())
        wanted = {d for group in bias.foreground.class_digits for d in group}
        missing = sorted(wanted - labels)
        if missing:
            raise BiasProtocolError(
                f"bias.foreground.class_digits names labels {missing} that the data does not have "
                f"(labels present: {sorted(labels)})"
            )
        unassigned = unassigned_labels(every, bias.foreground.class_digits)
        if unassigned:  # their images would vanish without a word, classes with them
            raise BiasProtocolError(unassigned)
    check_colourable(splits, bias, protocol)
    biased = PROTOCOLS[protocol](splits, bias, seed)
    if biased["train"].n_classes < 2:
        raise BiasProtocolError(f"the data has {biased['train'].n_classes} class after bias.protocol = {protocol}; "
                                "allowed: at least 2 classes (a task of one class scores a 'perfect' 1.000 that "
                                "measures nothing)")
    for name, split in biased.items():
        if len(split) == 0:
            raise BiasProtocolError(f"split '{name}' is empty after bias.protocol = {protocol}")
        missing_classes = sorted(set(range(split.n_classes)) - set(split.y.unique().tolist()))
        if missing_classes:  # a class absent from val or test would silently drop out of every accuracy
            raise BiasProtocolError(
                f"split '{name}' holds no sample of classes {missing_classes[:10]} after bias.protocol = {protocol}; "
                "raise data.val_fraction / data.test_fraction or data.max_per_split, or provide more data of them")
    return biased


def summarise(splits: dict[str, BiasedSplit], bias: BiasParams, protocol: str | None = None,
              uncolourable: dict[str, int] | None = None) -> dict:
    """Counts per group per split, the realised correlation (fraction of aligned samples) and, per split, the
    images the colour does not show on (:func:`check_colourable`).

    ``protocol`` is the protocol used (``bias.protocol`` resolved; default ``bias.protocol``); the summary
    names it and the requested one, the modality and the shape of one sample."""
    protocol = protocol or bias.protocol
    train = splits["train"]
    summary: dict = {"protocol": protocol, "requested_protocol": bias.protocol, "modality": train.modality,
                     "sample_shape": list(train.x.shape[1:]), "splits": {}}
    for name, split in splits.items():
        if not split.has_attribute:
            summary["splits"][name] = {"n_uncolourable": (uncolourable or {}).get(name, 0), "n": len(split),
                                       "n_classes": split.n_classes, "bias_labels": False,
                                       "class_counts": split.class_counts().tolist(),
                                       **{key: NEEDS_BIAS_LABELS for key in ATTRIBUTE_SUMMARY_KEYS}}
            continue
        counts = split.group_counts()
        summary["splits"][name] = {
            "n_uncolourable": (uncolourable or {}).get(name, 0),
            "n": len(split),
            "n_classes": split.n_classes,
            "n_attrs": split.n_attrs,
            "realised_correlation": float(split.aligned.float().mean()),  # type: ignore[union-attr]
            "n_aligned": int(split.aligned.sum()),  # type: ignore[union-attr]
            "n_conflicting": int((~split.aligned).sum()),  # type: ignore[operator]
            "empty_groups": int((counts == 0).sum()),
            "group_counts": counts.tolist(),
        }
    if protocol == "foreground":
        summary["target_correlation"] = {"train": bias.foreground.p_corr, "val": 1 / len(bias.foreground.class_digits),
                                         "test": 1 / len(bias.foreground.class_digits)}
    elif protocol == "background":
        summary["target_correlation"] = {"train": bias.background.rho, "val": bias.background.eval_rho,
                                         "test": bias.background.eval_rho}
    elif bias.protocol == "corruption":
        summary["target_correlation"] = {"train": bias.corruption.rho, "val": bias.corruption.eval_rho,
                                         "test": bias.corruption.eval_rho}
        summary["corruptions"] = {"types": list(bias.corruption.types), "severity": bias.corruption.severity}
    return summary
