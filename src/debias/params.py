"""The one typed, validated view of ``params.yaml``.

Every stage loads its parameters through :func:`load_params`, so unknown keys
(``loss.epsilion``), wrong types and out-of-range values fail before any data is read,
with one message naming the key, the value, what is allowed and, for a typo, the
closest valid key. Defaults are the papers' settings; ``params.yaml`` states every value
the default pipeline uses, with the reason where it departs from a paper.
"""

from __future__ import annotations

import difflib
import hashlib
import json
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

Channel = Annotated[int, Field(ge=0, le=255)]
RGB = tuple[Channel, Channel, Channel]  # 0..255 each: a colour outside fails here, not in torch's uint8 cast

# Biased-MNIST colours (Bahng et al.; FairKL paper), indexed by class.
BACKGROUND_COLOURS: list[RGB] = [
    (255, 0, 0), (0, 255, 0), (0, 0, 255), (225, 225, 0), (225, 0, 225),
    (0, 255, 255), (255, 128, 0), (255, 0, 128), (128, 0, 255), (128, 128, 128),
]
# CMNIST* colours (CNC code): matplotlib hsv at 0, .2, .4, .6, .8, indexed by class.
FOREGROUND_COLOURS: list[RGB] = [
    (255, 0, 0), (208, 255, 0), (0, 255, 92), (0, 116, 255), (184, 0, 255),
]


class ParamsError(ValueError):
    """A parameter is missing, unknown, of the wrong type or out of range."""


class Section(BaseModel):
    """Base for every params section: unknown keys are errors, values are validated."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=False)


class TabularParams(Section):
    """adult / compas (WCL Sec. 6.2): plain random train/val/test splits (70/15/15 by default)."""

    val_fraction: float = Field(0.15, gt=0, lt=1, description="adult/compas: random validation fraction (WCL: 15 %)")
    test_fraction: float = Field(0.15, gt=0, lt=1, description="adult/compas: random test fraction (WCL: 15 %)")
    keep_sensitive_feature: bool = Field(
        True, description="the sensitive attribute (adult: sex, compas: race) stays one of the input features")
    compas_races: list[str] = Field(
        default_factory=lambda: ["African-American", "Caucasian"], min_length=2,
        description="compas: the races kept, in attribute order (a = position); rows of other races are dropped")

    @model_validator(mode="after")
    def _fractions_leave_a_train_split(self) -> "TabularParams":
        if self.val_fraction + self.test_fraction >= 0.9:
            raise ValueError(
                f"data.tabular.val_fraction + data.tabular.test_fraction = {self.val_fraction + self.test_fraction:g} "
                "leaves too little training data; allowed: a sum below 0.9"
            )
        if len(set(self.compas_races)) != len(self.compas_races):
            raise ValueError(f"data.tabular.compas_races {self.compas_races} names a race twice; allowed: distinct races")
        return self


class DataParams(Section):
    source: Literal["digits", "mnist", "npz", "adult", "compas"] = "digits"
    path: str | None = Field(None, description="npz source: path to a local .npz (relative to the repository root or absolute)")
    val_fraction: float = Field(0.15, gt=0, lt=1, description="digits/npz: stratified validation fraction (adult/compas: data.tabular)")
    test_fraction: float = Field(0.25, gt=0, lt=1, description="digits/npz: stratified test fraction (adult/compas: data.tabular)")
    mnist_val_size: int = Field(6000, ge=1, description="mnist: validation images carved from the official training split")
    image_size: int = Field(28, ge=8, le=512, description="side of the square images after resizing (unused by adult/compas)")
    max_per_split: int | None = Field(None, ge=1, description="optional cap on images (rows) per split (smoke runs)")
    tabular: TabularParams = Field(default_factory=TabularParams, description="adult / compas only")

    @model_validator(mode="after")
    def _fractions_leave_a_train_split(self) -> "DataParams":
        if self.val_fraction + self.test_fraction >= 0.9:
            raise ValueError(
                f"data.val_fraction + data.test_fraction = {self.val_fraction + self.test_fraction:g} "
                "leaves too little training data; allowed: a sum below 0.9"
            )
        if self.source == "npz" and not self.path:
            raise ValueError("data.path is required when data.source is 'npz' (a local .npz with x and y)")
        return self


class ForegroundParams(Section):
    """CMNIST* (CNC App. D.1): strokes coloured with the class colour with probability p_corr."""

    p_corr: float = Field(0.995, gt=0, lt=1)
    stroke_threshold: int = Field(120, ge=1, le=255, description="grey level from which a stroke pixel takes the colour")
    class_digits: list[list[Annotated[int, Field(ge=0)]]] = Field(default_factory=lambda: [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]])
    colours: list[RGB] = Field(default_factory=lambda: list(FOREGROUND_COLOURS))

    @model_validator(mode="after")
    def _one_colour_per_class(self) -> "ForegroundParams":
        digits = [d for group in self.class_digits for d in group]
        if len(digits) != len(set(digits)):
            raise ValueError(f"bias.foreground.class_digits {self.class_digits} uses a label twice; allowed: disjoint groups")
        if len(self.colours) < len(self.class_digits):
            raise ValueError(
                f"bias.foreground.colours has {len(self.colours)} colours for {len(self.class_digits)} classes; "
                "allowed: at least one colour per class"
            )
        if len(self.class_digits) < 2:
            raise ValueError("bias.foreground.class_digits needs at least 2 classes")
        return self


class BackgroundParams(Section):
    """Biased-MNIST (Bahng et al.): background painted with the class colour for a fraction rho."""

    rho: float = Field(0.99, gt=0, lt=1, description="training correlation (papers: 0.99 ... 0.999)")
    eval_rho: float = Field(0.1, gt=0, lt=1, description="validation/test correlation (0.1 = uniform over 10 colours)")
    colours: list[RGB] = Field(default_factory=lambda: list(BACKGROUND_COLOURS))


class BiasParams(Section):
    protocol: Literal["auto", "foreground", "background", "given"] = Field(
        "auto", description="auto: given where the raw data carries its own attribute a (adult, compas, an npz with a), "
                            "else the source's registered protocol (foreground for the digit sources)")
    foreground: ForegroundParams = Field(default_factory=ForegroundParams)
    background: BackgroundParams = Field(default_factory=BackgroundParams)


class MLPParams(Section):
    """The ``mlp`` encoder: [Linear, ReLU, BatchNorm1d] per hidden layer (WCL Sec. 6.2: "MLP with ReLU
    activation followed by batch normalization"); widths 3 x 100 as LfF's MLP (alinlab/LfF module/mlp.py)."""

    hidden: list[Annotated[int, Field(ge=1, le=65536)]] = Field(
        default_factory=lambda: [100, 100, 100], min_length=1, max_length=64,
        description="width of each hidden layer; its length is the depth; the last width is the feature size")
    batch_norm: bool = Field(True, description="BatchNorm1d after each ReLU (WCL); false: LfF's plain MLP")


class ModelParams(Section):
    name: Literal["lenet5", "simpleconv", "resnet18", "mlp"] = Field(
        "lenet5", description="image encoders (lenet5, simpleconv, resnet18) are replaced by mlp for feature vectors")
    mlp: MLPParams = Field(default_factory=MLPParams)


class OptimParams(Section):
    optimizer: Literal["sgd", "adam"] = "sgd"
    lr: float = Field(1e-3, gt=0, le=10)
    momentum: float = Field(0.9, ge=0, lt=1)
    weight_decay: float = Field(5e-4, ge=0, lt=1)
    batch_size: int = Field(32, ge=1, le=65536)
    epochs: int = Field(5, ge=1, le=10000)
    lr_milestones: list[int] = Field(default_factory=list, description="epochs at which the lr is multiplied by lr_gamma")
    lr_gamma: float = Field(0.1, gt=0, le=1)
    selection: Literal["last", "best_worst_group"] = "last"
    eval_batch_size: int = Field(1024, ge=1)
    augment_shift: int = Field(0, ge=0, le=16, description="random translation of training images in pixels (CNC's code: random crops); 0: off; ignored for feature vectors")


class ClusterParams(Section):
    """CNC App. D.2.3: UMAP of ERM features, then KMeans/GMM, clusters matched to classes."""

    algorithm: Literal["kmeans", "gmm"] = "kmeans"
    umap_components: int = Field(2, ge=1, le=64)
    umap_neighbors: int = Field(15, ge=2, le=1000)
    umap_min_dist: float = Field(0.1, ge=0, le=1)
    per_class: int = Field(1, ge=1, le=100, description="1: one cluster per class (CNC); k > 1: k clusters within each class (GEORGE-style)")
    n_init: int = Field(10, ge=1, le=100)


class GroupsParams(Section):
    method: Literal["pred", "cluster", "true"] = "pred"
    cluster: ClusterParams = Field(default_factory=ClusterParams)

    @field_validator("method", mode="before")
    @classmethod
    def _yaml_true_is_the_oracle(cls, value: Any) -> Any:
        """YAML (and ``dvc exp run -S groups.method=true``) reads the word true as a boolean."""
        return "true" if value is True else value


class CNCParams(Section):
    """CNC App. B.3 / D.2.4: two-sided contrastive batches from inferred labels."""

    num_positives: int = Field(32, ge=1, le=4096, description="M: anchors and positives per side")
    num_negatives: int = Field(32, ge=1, le=4096, description="N: negatives per side")
    two_sided: bool = True
    batches_per_epoch: int | None = Field(None, ge=1, description="default: anchor-pool size / M")
    accumulation: int = Field(32, ge=1, le=1024, description="contrastive batches per optimiser step")
    contrastive_weight: float = Field(0.75, ge=0, le=1, description="lambda: lambda * contrastive + (1 - lambda) * CE")
    init: Literal["scratch", "erm"] = "scratch"
    forward_chunk: int = Field(8, ge=1, le=1024, description="contrastive batches per forward pass (memory only)")
    skip_empty_classes: bool = Field(False, description="skip (and report) classes with no inferred minority point instead of failing")


class JTTParams(Section):
    upweight: float = Field(20.0, ge=1, le=1000, description="JTT lambda_up: ERM training errors repeated this often")


class WCLParams(Section):
    """Difficulty-weighted contrastive learning (Sec. 5.2) with a jointly trained triplet encoder."""

    tau_plus: float = Field(0.0, ge=0, lt=1, description="class prior for the debiased-negative correction (0: off)")
    max_shift: int = Field(2, ge=0, le=16, description="augmented view: random translation up to this many pixels")
    noise_std: float = Field(8.0, ge=0, le=128, description="augmented view: Gaussian pixel noise (0..255 scale)")
    triplet_weight: float = Field(1.0, ge=0, le=100)


class Stage2Params(OptimParams):
    method: Literal["cnc", "supcon", "eps_supcon", "eps_supinfonce", "wcl", "jtt", "erm"] = "cnc"
    cnc: CNCParams = Field(default_factory=CNCParams)
    jtt: JTTParams = Field(default_factory=JTTParams)
    wcl: WCLParams = Field(default_factory=WCLParams)


class FairKLParams(Section):
    weight: float = Field(0.0, ge=0, le=1000, description="lambda of the FairKL term (0: off)")
    variant: Literal["kl", "mean", "authors"] = "kl"


class LossParams(Section):
    temperature: float = Field(0.1, gt=0, le=10, description="tau; s_ij = z_i . z_j / tau")
    epsilon: float = Field(0.25, ge=0, le=100, description="epsilon margin (logit units, after division by tau)")
    alpha: float = Field(1.0, ge=0, le=1000, description="weight of the contrastive term")
    fairkl: FairKLParams = Field(default_factory=FairKLParams)


class ProbeParams(Section):
    train_split: Literal["train", "val"] = "train"
    c_grid: list[float] = Field(default_factory=lambda: [0.01, 0.1, 1.0, 10.0], min_length=1,
                                description="inverse L2 strengths tried; the best validation worst-group wins")
    max_iter: int = Field(1000, ge=10, le=100000)
    standardize: bool = True

    @field_validator("c_grid")
    @classmethod
    def _positive(cls, values: list[float]) -> list[float]:
        if any(v <= 0 for v in values):
            raise ValueError(f"every value must be > 0, got {values}")
        return values


class UMAPParams(Section):
    neighbors: int = Field(15, ge=2, le=1000)
    min_dist: float = Field(0.1, ge=0, le=1)
    max_points: int = Field(2000, ge=10, description="points embedded per split (a seeded subset)")


class EvaluateParams(Section):
    splits: list[Literal["train", "val", "test"]] = Field(default_factory=lambda: ["test", "val"], min_length=1)
    normalize_alignment: bool = Field(False, description="alignment loss on L2-normalised rows (CNC uses raw outputs)")
    block_size: int = Field(2048, ge=16, description="rows per block of pairwise distances (memory bound)")
    umap: UMAPParams = Field(default_factory=UMAPParams)
    mi_max_iter: int = Field(1000, ge=10)


class ReportParams(Section):
    title: str = "debias report"
    paper_numbers: bool = Field(True, description="put the papers' reported numbers beside ours where the protocol matches")
    dpi: int = Field(110, ge=50, le=400)


class Params(Section):
    seed: int = Field(0, ge=0, lt=2**31)
    data: DataParams = Field(default_factory=DataParams)
    bias: BiasParams = Field(default_factory=BiasParams)
    model: ModelParams = Field(default_factory=ModelParams)
    erm: OptimParams = Field(default_factory=OptimParams)
    groups: GroupsParams = Field(default_factory=GroupsParams)
    stage2: Stage2Params = Field(default_factory=lambda: Stage2Params(
        optimizer="sgd", lr=1e-3, momentum=0.9, weight_decay=1e-4, epochs=3, selection="best_worst_group"))
    loss: LossParams = Field(default_factory=LossParams)
    probe: ProbeParams = Field(default_factory=ProbeParams)
    evaluate: EvaluateParams = Field(default_factory=EvaluateParams)
    report: ReportParams = Field(default_factory=ReportParams)

    @field_validator("seed", mode="before")
    @classmethod
    def _seed_is_int(cls, value: Any) -> Any:
        if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
            raise ValueError("seed must be a whole number")
        return value


# --------------------------------------------------------------------------- loading


def _valid_keys(model: type[BaseModel], prefix: str = "") -> list[str]:
    keys: list[str] = []
    for name, field in model.model_fields.items():
        dotted = f"{prefix}{name}"
        keys.append(dotted)
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            keys.extend(_valid_keys(annotation, dotted + "."))
    return keys


def _field_at(model: type[BaseModel], loc: tuple[Any, ...]) -> Any:
    """The pydantic FieldInfo at a dotted location, or None (list items, unions)."""
    field = None
    for part in loc:
        if not (isinstance(model, type) and issubclass(model, BaseModel)) or part not in model.model_fields:
            return None
        field = model.model_fields[part]
        model = field.annotation  # type: ignore[assignment]
    return field


def _allowed_range(field: Any) -> str | None:
    """'0 < value < 1' from a field's gt/ge/lt/le constraints."""
    if field is None:
        return None
    low = high = None
    for meta in field.metadata:
        for attr, sign in (("gt", "<"), ("ge", "<=")):
            if getattr(meta, attr, None) is not None:
                low = f"{getattr(meta, attr)} {sign} "
        for attr, sign in (("lt", "<"), ("le", "<=")):
            if getattr(meta, attr, None) is not None:
                high = f" {sign} {getattr(meta, attr)}"
    if low is None and high is None:
        return None
    return f"{low or ''}value{high or ''}"


def _describe(error: dict[str, Any], model: type[BaseModel]) -> str:
    loc = tuple(error["loc"])
    key = ".".join(str(part) for part in loc)
    kind = error["type"]
    if kind == "extra_forbidden":
        close = difflib.get_close_matches(key, _valid_keys(model), n=1, cutoff=0.6)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        return f"unknown parameter '{key}' (value {error['input']!r}){hint}"
    if not key:
        return error["msg"].removeprefix("Value error, ")
    if kind == "literal_error":
        return f"{key} = {error['input']!r} is not allowed; allowed: {error['ctx']['expected']}"
    message = error["msg"].removeprefix("Value error, ")
    allowed = _allowed_range(_field_at(model, loc))
    return f"{key} = {error['input']!r}: {message}" + (f"; allowed: {allowed}" if allowed else "")


def validate(raw: dict[str, Any]) -> Params:
    """Validate a params mapping; raise :class:`ParamsError` listing every problem."""
    try:
        return Params.model_validate(raw or {})
    except ValidationError as exc:
        problems = [_describe(err, Params) for err in exc.errors()]
        raise ParamsError("invalid params.yaml:\n  - " + "\n  - ".join(problems)) from None


def load_params(path: str | Path = "params.yaml") -> Params:
    """Read and validate ``params.yaml``; a missing or malformed file is a ParamsError."""
    path = Path(path)
    if not path.exists():
        raise ParamsError(f"{path} not found: run the stage from the repository root")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ParamsError(f"{path} is not valid YAML: {exc}") from None
    if raw is not None and not isinstance(raw, dict):
        raise ParamsError(f"{path} must hold a mapping of sections, not {type(raw).__name__}")
    return validate(raw or {})


def section(params: Params, dotted: str) -> Any:
    """The value at a dotted key, e.g. ``section(p, 'bias.foreground')``."""
    value: Any = params
    for part in dotted.split("."):
        value = getattr(value, part)
    return value


def as_dict(params: Params, keys: list[str] | None = None) -> dict[str, Any]:
    """Plain mapping of the given top-level/dotted keys (all when None), for logging and hashing."""
    full = params.model_dump(mode="json")
    if keys is None:
        return full
    out: dict[str, Any] = {}
    for dotted in keys:
        value: Any = full
        for part in dotted.split("."):
            value = value[part]
        out[dotted] = value
    return out


def params_hash(values: dict[str, Any]) -> str:
    """Stable short hash of the params a stage read (sorted JSON, sha256, 12 hex digits)."""
    blob = json.dumps(values, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:12]


def flatten(values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{'a': {'b': 1}}`` -> ``{'a.b': 1}``; lists are kept as JSON strings."""
    flat: dict[str, Any] = {}
    for key, value in values.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, dotted + "."))
        elif isinstance(value, (list, tuple)):
            flat[dotted] = json.dumps(value)
        else:
            flat[dotted] = value
    return flat
