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
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from debias.errors import ParamsError

Channel = Annotated[int, Field(ge=0, le=255)]
RGB = Annotated[list[Channel], Field(min_length=3, max_length=3)]  # 0..255 each: fails here, not in a uint8 cast

# Bias colours closer than this (Euclidean distance in RGB, 0..255 per channel) to each other, or to the
# pixels they must stand out from (black background of CMNIST*, white strokes of Biased-MNIST), are refused
# as indistinguishable: an eighth of the closest pair in the papers' palettes (Biased-MNIST: 101.5 between
# (255, 0, 0) and (255, 0, 128); CMNIST*: 214.2), i.e. well beyond sensor-noise-level differences.
MIN_COLOUR_DISTANCE = 12.0
# s_ij = z_i.z_j / tau: float32 cosines of D-dim features carry rounding errors of about sqrt(D) * 2^-24
# (~5e-7 at D = 84, ~1.3e-6 at D = 512); divided by tau they must stay far below a logit unit, so tau >= 1e-4
# (1.3e-2 nats at most). The papers use 0.05 - 0.5.
MIN_TEMPERATURE = 1e-4

# Biased-MNIST colours (Bahng et al.; FairKL paper), indexed by class.
BACKGROUND_COLOURS: list[RGB] = [
    (255, 0, 0), (0, 255, 0), (0, 0, 255), (225, 225, 0), (225, 0, 225),
    (0, 255, 255), (255, 128, 0), (255, 0, 128), (128, 0, 255), (128, 128, 128),
]
# CMNIST* colours (CNC code): matplotlib hsv at 0, .2, .4, .6, .8, indexed by class.
FOREGROUND_COLOURS: list[RGB] = [
    (255, 0, 0), (208, 255, 0), (0, 255, 92), (0, 116, 255), (184, 0, 255),
]


def show(value: Any, limit: int = 80) -> str:
    """``repr(value)`` bounded in depth, length and characters: an error message never echoes an unbounded value
    (a YAML of a few lines can expand, through aliases, into gigabytes)."""
    import reprlib

    shortener = reprlib.Repr()
    shortener.maxlevel, shortener.maxlist, shortener.maxdict, shortener.maxstring, shortener.maxother = 3, 6, 6, 60, 60
    text = shortener.repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def check_colours(colours: list[list[int]], key: str, backdrop: tuple[int, int, int], backdrop_name: str) -> None:
    """Refuse colours closer than MIN_COLOUR_DISTANCE to each other or to the ``backdrop`` they are painted against."""
    import math

    for i, first in enumerate(colours):
        if math.dist(first, backdrop) < MIN_COLOUR_DISTANCE:
            raise ValueError(f"{key}[{i}] = {first} cannot be told apart from {backdrop_name} {list(backdrop)}; allowed: "
                             f"an RGB distance of at least {MIN_COLOUR_DISTANCE:g}")
        for j in range(i + 1, len(colours)):
            if math.dist(first, colours[j]) < MIN_COLOUR_DISTANCE:
                raise ValueError(f"{key}[{i}] = {first} and {key}[{j}] = {colours[j]} cannot be told apart; allowed: "
                                 f"colours at least {MIN_COLOUR_DISTANCE:g} apart (RGB distance)")


class Section(BaseModel):
    """Base for every params section: unknown keys are errors, values are validated strictly.

    Strict: no bool where a number is expected (YAML's ``true`` is not 1), no string where a number is
    expected, no float where a whole number is expected; no NaN or infinity anywhere (``allow_inf_nan``).
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=False, strict=True,
                              allow_inf_nan=False)


# Where an image file's pixels come from before resizing to data.image_size x data.image_size:
# ``stretch`` resizes the whole image to a square (GroupDRO's Waterbirds transform),
# ``center_square`` keeps the central square of side min(H, W) (GroupDRO's CelebA transform,
# torchvision's ImageNet transforms). ``crop_fraction`` then keeps the central fraction of that
# square in each dimension: 224/256 = 0.875 is "resize to 256, centre-crop 224".
ImageFit = Literal["stretch", "center_square"]
SplitName = Literal["train", "val", "test"]
# The 40 binary attributes of CelebA's list_attr_celeba.txt, in the file's order.
CELEBA_ATTRIBUTES: tuple[str, ...] = (
    "5_o_Clock_Shadow", "Arched_Eyebrows", "Attractive", "Bags_Under_Eyes", "Bald", "Bangs", "Big_Lips", "Big_Nose",
    "Black_Hair", "Blond_Hair", "Blurry", "Brown_Hair", "Bushy_Eyebrows", "Chubby", "Double_Chin", "Eyeglasses",
    "Goatee", "Gray_Hair", "Heavy_Makeup", "High_Cheekbones", "Male", "Mouth_Slightly_Open", "Mustache",
    "Narrow_Eyes", "No_Beard", "Oval_Face", "Pale_Skin", "Pointy_Nose", "Receding_Hairline", "Rosy_Cheeks",
    "Sideburns", "Smiling", "Straight_Hair", "Wavy_Hair", "Wearing_Earrings", "Wearing_Hat", "Wearing_Lipstick",
    "Wearing_Necklace", "Wearing_Necktie", "Young",
)
# GroupDRO's Waterbirds archive (Sagawa et al. 2020), the data CNC and JTT use.
WATERBIRDS_URL = "https://nlp.stanford.edu/data/dro/waterbird_complete95_forest2water2.tar.gz"


class ImageFolderParams(Section):
    """A folder of image files plus a metadata table (CSV or parquet), one row per image.

    Defaults are the layout of Waterbirds' metadata.csv (GroupDRO and WILDS): ``img_filename``,
    ``y``, ``place`` and ``split`` coded 0 / 1 / 2.
    """

    root: str | None = Field(None, description="folder the image paths are relative to (relative to the repository root or absolute)")
    metadata: str = Field("metadata.csv", description="the table, relative to root or absolute; .csv or .parquet")
    path_column: str = Field("img_filename", min_length=1)
    label_column: str = Field("y", min_length=1)
    attribute_column: str = Field("place", min_length=1)
    split_column: str | None = Field("split", description="null: seeded stratified split (data.val_fraction / data.test_fraction)")
    split_values: dict[SplitName, int | str] = Field(
        default_factory=lambda: {"train": 0, "val": 1, "test": 2}, description="the split column's value for each split")
    label_values: list[int | str] | None = Field(
        None, description="class names in class order (class i = label_values[i]); needed when labels are not integers")
    attribute_values: list[int | str] | None = Field(
        None, description="attribute names in order (a = i for attribute_values[i]); needed when not integers")
    fit: ImageFit = "stretch"
    crop_fraction: float = Field(1.0, gt=0, le=1)

    @model_validator(mode="after")
    def _consistent(self) -> "ImageFolderParams":
        if self.split_column is not None and set(self.split_values) != {"train", "val", "test"}:
            raise ValueError(
                f"data.imagefolder.split_values names {sorted(self.split_values)}; allowed: exactly train, val and test")
        if len(set(map(str, self.split_values.values()))) != len(self.split_values):
            raise ValueError(f"data.imagefolder.split_values {self.split_values} gives two splits the same value")
        for name in ("label_values", "attribute_values"):
            values = getattr(self, name)
            if values is not None and (len(values) < 2 or len(set(map(str, values))) != len(values)):
                raise ValueError(f"data.imagefolder.{name} = {values}; allowed: at least two distinct values")
        columns = [self.path_column, self.label_column, self.attribute_column] + ([self.split_column] if self.split_column else [])
        if len(set(columns)) != len(columns):
            raise ValueError(f"data.imagefolder columns {columns} name one column twice; allowed: distinct columns")
        return self


class WaterbirdsParams(Section):
    """Waterbirds (Sagawa et al. 2020): y = waterbird, a = water background; official splits."""

    url: str = Field(WATERBIRDS_URL, description="the archive GroupDRO's README gives")
    fit: ImageFit = Field("stretch", description="GroupDRO / CNC: Resize((256, 256)) then CenterCrop(224)")
    crop_fraction: float = Field(0.875, gt=0, le=1)


class CelebAParams(Section):
    """CelebA (Liu et al. 2015) as in GroupDRO / JTT / CNC: target Blond_Hair, bias attribute Male."""

    target: str = "Blond_Hair"
    attribute: str = "Male"
    fit: ImageFit = Field("center_square", description="GroupDRO / CNC: CenterCrop(178) of the 178x218 images, then Resize(224)")
    crop_fraction: float = Field(1.0, gt=0, le=1)

    @model_validator(mode="after")
    def _known_and_distinct(self) -> "CelebAParams":
        for name in ("target", "attribute"):
            value = getattr(self, name)
            if value not in CELEBA_ATTRIBUTES:
                close = difflib.get_close_matches(value, CELEBA_ATTRIBUTES, n=1)
                hint = f" (did you mean '{close[0]}'?)" if close else ""
                raise ValueError(f"data.celeba.{name} = '{value}' is not a CelebA attribute{hint}; "
                                 f"allowed: {', '.join(CELEBA_ATTRIBUTES)}")
        if self.target == self.attribute:
            raise ValueError(f"data.celeba.target and data.celeba.attribute are both '{self.target}'; allowed: two different attributes")
        return self


class Cifar10Params(Section):
    """CIFAR-10 (torchvision): validation carved from the official 50k training images."""

    val_size: int = Field(5000, ge=1, le=49990, description="validation images carved from the official training split")


class TabularParams(Section):
    """adult / compas (WCL Sec. 6.2): plain random train/val/test splits (70/15/15 by default)."""

    val_fraction: float = Field(0.15, gt=0, lt=1, description="adult/compas: random validation fraction (WCL: 15 %)")
    test_fraction: float = Field(0.15, gt=0, lt=1, description="adult/compas: random test fraction (WCL: 15 %)")
    keep_sensitive_feature: bool = Field(
        True, description="the sensitive attribute (adult: sex, compas: race) stays one of the input features")
    compas_races: list[str] = Field(
        default_factory=lambda: ["African-American", "Caucasian"], min_length=2,
        description="compas: the races kept, in attribute order (a = position); rows of other races are dropped")
    verify_sha256: bool = Field(
        True, description="ours: refuse adult/compas files whose sha256 is not the published one (a copy cut at a line "
                          "boundary reads without any error, with fewer rows); false reads a file changed on purpose "
                          "(e.g. a small file in the dataset's format)")

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


# Sources that read data.path: npz (the .npz file), adult / compas (a folder holding the dataset's original files,
# read in place instead of data/raw/<source>/: how offline machines and queued experiments, which run in temporary
# copies of the repository without data/raw, reach them).
PATH_SOURCES = ("npz", "adult", "compas")


class DataParams(Section):
    source: Literal["digits", "mnist", "fashion_mnist", "npz", "imagefolder", "waterbirds", "celeba", "cifar10", "adult",
                    "compas"] = "digits"
    path: str | None = Field(None, description="npz: path to a local .npz; adult / compas: a folder holding the original "
                                               "files (relative to the repository root or absolute)")
    val_fraction: float = Field(0.15, gt=0, lt=1, description="digits/npz: stratified validation fraction (adult/compas: data.tabular)")
    test_fraction: float = Field(0.25, gt=0, lt=1, description="digits/npz: stratified test fraction (adult/compas: data.tabular)")
    mnist_val_size: int = Field(6000, ge=1, description="mnist, fashion_mnist: validation images carved from the official training split")
    image_size: int = Field(28, ge=8, le=512, description="side of the square images after resizing (unused by adult/compas)")
    max_per_split: int | None = Field(None, ge=1, description="optional cap on images (rows) per split (smoke runs)")
    max_train: int | None = Field(
        None, ge=1, description="optional cap on training images (rows) only, after max_per_split: a seeded subset, "
                                "nested across caps (scaling runs: validation and test keep their size)")
    memory_gb: float | None = Field(
        None, gt=0, description="image-file sources: memory the decoded splits may use (null: the memory available when loading)")
    imagefolder: ImageFolderParams = Field(default_factory=ImageFolderParams)
    waterbirds: WaterbirdsParams = Field(default_factory=WaterbirdsParams)
    celeba: CelebAParams = Field(default_factory=CelebAParams)
    cifar10: Cifar10Params = Field(default_factory=Cifar10Params)
    tabular: TabularParams = Field(default_factory=TabularParams, description="adult / compas only")

    @model_validator(mode="after")
    def _fractions_leave_a_train_split(self) -> "DataParams":
        if self.val_fraction + self.test_fraction >= 0.9:
            raise ValueError(
                f"val_fraction + test_fraction = {self.val_fraction + self.test_fraction:g} "
                "leaves too little training data; allowed: a sum below 0.9"
            )
        if self.source == "npz" and not self.path:
            raise ValueError("path is required when source is 'npz' (a local .npz with x and y)")
        if self.source not in PATH_SOURCES and self.path:
            raise ValueError(f"path = {show(self.path)} is read only by source npz (a .npz file) and adult / compas "
                             f"(a folder of the original files), but source is '{self.source}': set path: null")
        if self.source == "imagefolder" and not self.imagefolder.root:
            raise ValueError("imagefolder.root is required when source is 'imagefolder' "
                             "(the folder of images with its metadata table)")
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
            raise ValueError(f"class_digits {show(self.class_digits)} uses a label twice; allowed: disjoint groups")
        if any(len(group) == 0 for group in self.class_digits):
            raise ValueError(f"class_digits {show(self.class_digits)} holds an empty class; allowed: every class "
                             "names at least one label")
        if len(self.colours) < len(self.class_digits):
            raise ValueError(
                f"colours has {len(self.colours)} colours for {len(self.class_digits)} classes; "
                "allowed: at least one colour per class"
            )
        if len(self.class_digits) < 2:
            raise ValueError("class_digits needs at least 2 classes")
        check_colours(self.colours[: len(self.class_digits)], "colours", (0, 0, 0), "the black background")
        return self


class BackgroundParams(Section):
    """Biased-MNIST (Bahng et al.): background painted with the class colour for a fraction rho."""

    rho: float = Field(0.99, gt=0, lt=1, description="training correlation (papers: 0.99 ... 0.999)")
    eval_rho: float = Field(0.1, gt=0, lt=1, description="validation/test correlation (0.1 = uniform over 10 colours)")
    colours: list[RGB] = Field(default_factory=lambda: list(BACKGROUND_COLOURS))

    @model_validator(mode="after")
    def _colours_stand_out(self) -> "BackgroundParams":
        check_colours(self.colours, "colours", (255, 255, 255), "the white strokes")
        return self


# Corruptions the ``corruption`` protocol implements (debias.data.corruptions), Hendrycks &
# Dietterich's CIFAR-10-C definitions.
CorruptionName = Literal[
    "brightness", "contrast", "saturate", "gaussian_noise", "shot_noise", "speckle_noise", "impulse_noise",
    "gaussian_blur", "defocus_blur", "pixelate", "elastic_transform", "frost", "original",
]
# Corrupted CIFAR-10 as in DFA (Lee et al. 2021), whose data and numbers the FairKL paper's Table 4 uses;
# indexed by class. (LfF's Type-0 / Type-1 lists add snow, fog, spatter, JPEG, glass, motion and zoom blur.)
DFA_CORRUPTIONS: list[str] = [
    "brightness", "contrast", "gaussian_noise", "frost", "elastic_transform",
    "gaussian_blur", "defocus_blur", "impulse_noise", "saturate", "pixelate",
]


class CorruptionParams(Section):
    """Corrupted CIFAR-10 (LfF / DFA protocol): each class correlated with one corruption type."""

    rho: float = Field(0.99, gt=0, lt=1, description="training fraction with the class's corruption (FairKL Table 4: 0.995 ... 0.95)")
    eval_rho: float = Field(0.1, gt=0, lt=1, description="validation/test fraction (0.1 = uniform over 10 types)")
    types: list[CorruptionName] = Field(default_factory=lambda: list(DFA_CORRUPTIONS), description="corruption of class i = types[i]")
    severity: int = Field(4, ge=1, le=5, description="Hendrycks & Dietterich's severity level")
    frost_dir: str | None = Field(
        None, description="folder with Hendrycks' frost1.png ... frost6.jpg (null: the copies inside the imagecorruptions package)")

    @model_validator(mode="after")
    def _distinct_types(self) -> "CorruptionParams":
        if len(set(self.types)) != len(self.types) or len(self.types) < 2:
            raise ValueError(f"bias.corruption.types = {self.types}; allowed: at least two distinct corruptions")
        return self


class BiasParams(Section):
    protocol: Literal["auto", "foreground", "background", "given", "corruption"] = Field(
        "auto", description="auto: given where the raw data carries its own attribute a (adult, compas, imagefolder, "
                            "waterbirds, celeba, an npz with a), else the source's registered protocol (foreground for "
                            "the digit sources, corruption for cifar10)")
    max_uncolourable: float = Field(0.01, ge=0, le=1, description="largest fraction of a split's images on which the "
                                    "colour may not show (no stroke pixel >= threshold / no background); above it "
                                    "inject_bias refuses")
    foreground: ForegroundParams = Field(default_factory=ForegroundParams)
    background: BackgroundParams = Field(default_factory=BackgroundParams)
    corruption: CorruptionParams = Field(default_factory=CorruptionParams)


# Encoders with torchvision ImageNet weights (model.pretrained: true).
PRETRAINABLE = ("resnet18", "resnet50")


class MLPParams(Section):
    """The ``mlp`` encoder: [Linear, ReLU, BatchNorm1d] per hidden layer (WCL Sec. 6.2: "MLP with ReLU
    activation followed by batch normalization"); widths 3 x 100 as LfF's MLP (alinlab/LfF module/mlp.py)."""

    hidden: list[Annotated[int, Field(ge=1, le=65536)]] = Field(
        default_factory=lambda: [100, 100, 100], min_length=1, max_length=64,
        description="width of each hidden layer; its length is the depth; the last width is the feature size")
    batch_norm: bool = Field(True, description="BatchNorm1d after each ReLU (WCL); false: LfF's plain MLP")


# Encoders whose last feature layer takes model.feature_activation (the others end as their paper built them:
# ResNets in ReLU + average pool, the MLP in BatchNorm).
ACTIVATION_ENCODERS = ("lenet5", "simpleconv")
FeatureActivation = Literal["relu", "tanh"]


class ModelParams(Section):
    name: Literal["lenet5", "simpleconv", "resnet18", "resnet50", "mlp"] = Field(
        "lenet5", description="image encoders (lenet5, simpleconv, resnet18, resnet50) are replaced by mlp for feature vectors")
    pretrained: bool = Field(False, description="resnet18 / resnet50: start from torchvision's ImageNet weights (CNC: ResNet-50)")
    feature_activation: Literal["auto", "relu", "tanh"] = Field(
        "auto", description="activation of the encoder's feature layer (lenet5, simpleconv). auto: each method's paper "
                            "(relu: ERM, JTT, CNC's LeNet-5, WCL with its projection head; tanh: the supcon family and "
                            "FairKL without a projection head, as the FairKL authors' encoder: a ReLU feature layer keeps "
                            "every normalised z in the positive orthant)")
    mlp: MLPParams = Field(default_factory=MLPParams)

    @model_validator(mode="after")
    def _weights_exist(self) -> "ModelParams":
        if self.pretrained and self.name not in PRETRAINABLE:
            raise ValueError(f"pretrained = true needs ImageNet weights, which name = {self.name} does not have; "
                             f"allowed: {', '.join(PRETRAINABLE)}")
        if self.feature_activation == "tanh" and self.name not in ACTIVATION_ENCODERS:
            raise ValueError(f"feature_activation = tanh replaces the last activation of {', '.join(ACTIVATION_ENCODERS)}; "
                             f"name = {self.name} keeps its own; allowed: auto or relu with {self.name}")
        return self


class OptimParams(Section):
    optimizer: Literal["sgd", "adam"] = "sgd"
    lr: float = Field(1e-3, gt=0, le=10)
    momentum: float = Field(0.9, ge=0, lt=1)
    weight_decay: float = Field(5e-4, ge=0, le=10)
    batch_size: int = Field(32, ge=1, le=65536)
    epochs: int = Field(5, ge=1, le=10000)
    lr_milestones: list[int] = Field(default_factory=list, description="epochs at which the lr is multiplied by lr_gamma")
    lr_gamma: float = Field(0.1, gt=0, le=1)
    selection: Literal["last", "best_worst_group"] = "last"
    eval_batch_size: int = Field(1024, ge=1)
    augment_shift: int = Field(0, ge=0, le=16, description="random translation of training images in pixels (CNC's code: random crops); 0: off; ignored for feature vectors")

    @model_validator(mode="after")
    def _milestones_fire(self) -> "OptimParams":
        milestones = self.lr_milestones
        if milestones != sorted(set(milestones)):
            raise ValueError(f"lr_milestones = {show(milestones)}; allowed: strictly increasing epochs")
        late = [m for m in milestones if not 1 <= m < self.epochs]
        if late:
            raise ValueError(f"lr_milestones {show(late)} never take effect with epochs = {self.epochs}; "
                             f"allowed: epochs 1 .. {self.epochs - 1}")
        return self


class ClusterParams(Section):
    """CNC App. D.2.3: UMAP of ERM features, then KMeans/GMM, clusters matched to classes."""

    algorithm: Literal["kmeans", "gmm"] = "kmeans"
    umap_components: int = Field(2, ge=1, le=64)
    umap_neighbors: int = Field(15, ge=2, le=1000)
    umap_min_dist: float = Field(0.1, ge=0, le=1)
    per_class: int = Field(1, ge=1, le=100, description="1: one cluster per class (CNC); k > 1: k clusters within each class (GEORGE-style)")
    n_init: int = Field(10, ge=1, le=100)


class SoftParams(Section):
    """Soft bias scores (FairKL paper App. B.2.4): softmax of the bias-capturing (ERM) model's logits / temperature."""

    temperature: float = Field(1.0, gt=0, le=1000, description="softmax temperature of the ERM logits (1: its softmax; "
                                                               "higher: softer scores)")


class GroupsParams(Section):
    method: Literal["pred", "cluster", "true", "soft"] = "pred"
    cluster: ClusterParams = Field(default_factory=ClusterParams)
    soft: SoftParams = Field(default_factory=SoftParams)

    @field_validator("method", mode="before")
    @classmethod
    def _yaml_true_is_the_oracle(cls, value: Any) -> Any:
        """YAML (and ``dvc exp run -S groups.method=true``) reads the word true as a boolean."""
        return "true" if value is True else value


HeadInput = Literal["raw", "unit"]  # what a network's linear head reads: z itself, or z / |z|
HEAD_INPUTS: tuple[str, ...] = get_args(HeadInput)


class HeadParams(Section):
    """The linear head fitted on frozen features after every epoch for methods without a CE-trained head."""

    features: HeadInput = Field("raw", description="the head's input: raw (the encoder output z, as the linear probe "
                                "reads it) | unit (z / |z|, the released FairKL code's classifier: fc(normalize(feat)))")

    weight_decay: float = Field(1e-4, ge=0, le=100, description="L2 penalty weight_decay * |W|^2 added to the head's mean CE")
    max_iter: int = Field(100, ge=1, le=100000, description="L-BFGS iterations of the head fit")
    warm_start: bool = Field(True, description="start each epoch's fit from the previous epoch's head instead of zero "
                             "(ours: on the default data 17 % fewer L-BFGS iterations and the same selected epoch and "
                             "accuracies in 3 of 3 seeds, benchmarks/results/head_warm_start.md); false: from zero")
    tolerance: float = Field(1e-7, gt=0, le=1, description="stop once every gradient entry is below it (L-BFGS's "
                             "tolerance_grad; torch's default 1e-7)")


class TabularViewParams(Section):
    """SCARF views of feature vectors (Bahri et al. 2022) for the self-supervised methods (wcl, dcl, hcl)."""

    corruption_rate: float = Field(0.6, ge=0, le=1, description="share of each row's features replaced from the "
                                                               "marginals (SCARF: 0.6)")


class SpeedParams(Section):
    """Opt-in speed settings of stage 2's encoder (each off by default; measured effects: docs/gpu.md)."""

    autocast: Literal["none", "bf16"] = Field("none", description="bf16: the encoder's forward under bfloat16 autocast, "
                                              "its features cast back to float32 for the losses and the head (ours)")
    compile: bool = Field(False, description="torch.compile the encoder in place (ours; the first steps compile)")
    channels_last: bool = Field(False, description="convolution weights in channels-last memory format (ours)")


# Fields every stage-2 method shares; each method's own section (stage2.<section>) is declared by the method
# (debias.training.methods.registry) and joins Stage2Params below, before Params.
STAGE2_SHARED_FIELDS = ("head", "speed", "tabular_view", *OptimParams.model_fields)


class FairKLParams(Section):
    weight: float = Field(0.0, ge=0, le=1000, description="lambda of the FairKL term (0: off)")
    variant: Literal["kl", "mean", "released"] = Field(
        "kl", description="kl: the paper's Eq. 10 (Gaussian KL of the pair-set distances) with alpha * L_con; mean: "
                          "Eq. 9; released: the objective of the authors' released code (main_infonce.py, losses.py), "
                          "alpha^2 * (tau / 0.07) * L_con + weight * (moment matching on similarities + two linear "
                          "terms), the code that produced the paper's tables (docs/methods.md)")
    variance_floor: float = Field(1e-6, gt=0, le=1, description="variances of the pair-set distances are floored at this "
                                  "(squared-distance units, 0..16) so the Gaussian KL (Eq. 10) stays finite")
    sampler: Literal["shuffle", "stratified"] = Field(
        "shuffle", description="shuffle: plain shuffled batches (the paper); stratified: every batch holds "
                               "minority_per_batch inferred-minority points, so FairKL's four pair sets are never empty "
                               "(an extension, not in the paper)")
    minority_per_batch: int = Field(16, ge=1, le=65536, description="stratified: inferred-minority points per batch")


class EpsSupConParams(Section):
    """eps-SupCon's own margin and FairKL weight (FairKL paper Table 6 tunes them apart from eps-SupInfoNCE's)."""

    epsilon: float = Field(0.0, ge=0, le=100, description="epsilon of eps-SupCon (logit units); FairKL paper Table 6: "
                           "0.25 / 0 / 0.5 / 0 at rho 0.999 / 0.997 / 0.995 / 0.99 (default: rho 0.99's)")
    fairkl_weight: float = Field(0.0, ge=0, le=1000, description="lambda of FairKL with eps-SupCon (used instead of "
                                 "loss.fairkl.weight); FairKL paper Table 6: 0.75 / 0.5 / 0.5 / 0.5 at rho 0.999 / "
                                 "0.997 / 0.995 / 0.99; 0: off (the default, as loss.fairkl.weight's)")


class LossParams(Section):
    """The supervised contrastive losses (supcon, eps_supcon, eps_supinfonce) and FairKL; CNC and WCL keep their own
    temperature in stage2.cnc / stage2.wcl."""

    temperature: float = Field(0.1, ge=MIN_TEMPERATURE, le=10, description="tau of the supcon family (SupCon and FairKL "
                               "papers: 0.1); s_ij = z_i . z_j / tau (>= MIN_TEMPERATURE: float32)")
    epsilon: float = Field(0.5, ge=0, le=100, description="epsilon margin (logit units, after division by tau); FairKL "
                           "paper Table 6: 0.5 for eps-SupInfoNCE at every rho")
    alpha: float = Field(1.0, ge=0, le=1000, description="weight of the contrastive term (FairKL paper Eq. 11 / "
                         "Table 6: 0.03; with fairkl.variant released the code applies it twice, alpha^2)")
    fairkl: FairKLParams = Field(default_factory=FairKLParams)
    eps_supcon: EpsSupConParams = Field(default_factory=EpsSupConParams)


def _positive_distinct(values: list[float]) -> list[float]:
    if any(v <= 0 for v in values):
        raise ValueError(f"every value must be > 0, got {show(values)}")
    if len(set(values)) != len(values):
        raise ValueError(f"values repeat in {show(values)}; allowed: distinct values")
    return values


class DFRParams(Section):
    """DFR (Kirichenko, Izmailov, Wilson 2022), DFR^Val_Tr as its released code (dfr_evaluate_spurious.py) runs it:
    L1 logistic regression (liblinear) on group-balanced subsets of the validation split."""

    c_grid: list[float] = Field(default_factory=lambda: [1.0, 0.7, 0.3, 0.1, 0.07, 0.03, 0.01], min_length=1,
                                description="inverse strengths tried (DFR's C_OPTIONS); the best worst-group of the other half wins")
    penalty: Literal["l1", "l2"] = Field("l1", description="DFR: l1")
    retrains: int = Field(20, ge=1, le=1000, description="balanced subsets of the whole validation split whose "
                                                         "weights are averaged (DFR: 20)")

    @field_validator("c_grid")
    @classmethod
    def _positive(cls, values: list[float]) -> list[float]:
        return _positive_distinct(values)


class ProbeParams(Section):
    train_split: Literal["train", "val"] = "train"
    c_grid: list[float] = Field(default_factory=lambda: [0.01, 0.1, 1.0, 10.0], min_length=1,
                                description="inverse L2 strengths tried; the best validation worst-group wins")
    max_iter: int = Field(1000, ge=10, le=100000)
    standardize: bool = True
    method: Literal["logistic", "dfr"] = Field("logistic", description="logistic: the probe above; dfr: last-layer "
                                               "retraining on group-balanced validation data (train_split ignored)")
    dfr: DFRParams = Field(default_factory=DFRParams)
    postprocess: Literal["none", "equalized_odds"] = Field(
        "none", description="equalized_odds: Hardt et al.'s post-processing of the probe (fairlearn ThresholdOptimizer, "
                            "fitted on the probe's selection data), binary tasks; reported beside the probe")

    @field_validator("c_grid")
    @classmethod
    def _positive(cls, values: list[float]) -> list[float]:
        return _positive_distinct(values)


class UMAPParams(Section):
    neighbors: int = Field(15, ge=2, le=1000)
    min_dist: float = Field(0.1, ge=0, le=1)
    max_points: int = Field(2000, ge=10, description="points embedded per split (a seeded subset)")


class EvaluateParams(Section):
    splits: list[Literal["train", "val", "test"]] = Field(default_factory=lambda: ["test", "val"], min_length=1)
    normalize_alignment: bool = Field(False, description="alignment loss on L2-normalised rows (CNC uses raw outputs)")
    block_size: int = Field(2048, ge=16, description="rows per block of pairwise distances (memory bound)")
    max_pair_points: int | None = Field(
        20000, ge=2, description="pairwise metrics (alignment loss, distance statistics) of a split with more rows use "
                                 "a seeded subset of about this many, stratified by group (time bound); null: all rows")
    umap: UMAPParams = Field(default_factory=UMAPParams)
    mi_max_iter: int = Field(1000, ge=10, description="iterations of the logistic regression behind the MI estimate")
    mi_c: float = Field(1.0, gt=0, le=1e6, description="inverse L2 strength C of the MI estimator's logistic regression "
                        "p(y|z) (CNC App. D.2.1 fits sklearn's default, C = 1)")


class ReportParams(Section):
    title: str = "debias report"
    paper_numbers: bool = Field(True, description="put the papers' reported numbers beside ours where the protocol matches")
    dpi: int = Field(110, ge=50, le=400)
    confidence: float = Field(0.95, gt=0, lt=1, description="level of the Wilson interval every group accuracy carries "
                              "(ours: the conventional 95 %, issue 27)")
    min_group_n: int = Field(30, ge=1, description="a worst group with fewer test images is marked as too small to "
                             "read alone (ours: the usual n >= 30 rule of thumb, issue 27)")


class HealthParams(Section):
    """When a training loss counts as unstable (``unstable-training``, :func:`debias.health.loss_instability`).

    Ours, measured on the default run (default params, digits, `dvc repro`): the eps-SupInfoNCE + FairKL loss fell
    from 5.53 to 0.283 at epoch 13, jumped to 1.89 at epoch 14 (31 % of its fall) and from 1.94 to 3.36 at epoch 16
    (27 %), then recovered; its other epoch-to-epoch rises are <= 1 % of the fall (ERM's loss never rose)."""

    loss_spike: float = Field(0.25, gt=0, description="an epoch whose loss rose over the previous epoch's by more "
                              "than this fraction of the fall so far (first epoch's loss minus the lowest) is a spike "
                              "(ours: the default run's spike rose 31 % and 27 %, its noise <= 1 %)")
    loss_end: float = Field(0.25, gt=0, description="the last epoch's loss above the minimum by more than this "
                            "fraction of the fall ends high, a slow drift up included (ours: as loss_spike)")
    loss_min_fall: float = Field(0.1, ge=0, lt=1, description="judge only once the loss fell by this fraction of "
                                 "|first epoch's loss| (ours: a loss that barely moved has no convergence to lose)")


def _stage2_model() -> type[OptimParams]:
    """Stage2Params: the optimiser fields, ``method`` allowing exactly the registered methods (the one declared
    the schema default first), ``head``, ``speed``, each method's own params section as the field
    ``stage2.<section>``, then ``tabular_view``."""
    from pydantic import create_model

    from debias.training.methods.registry import import_declarations

    methods = import_declarations()
    defaults = [name for name, spec in methods.items() if spec.schema_default]
    if len(defaults) != 1:
        raise RuntimeError(f"exactly one stage-2 method must be the schema default; registered: {sorted(methods)}, "
                           f"defaults: {defaults}")
    names = (defaults[0], *(name for name in methods if name != defaults[0]))
    for spec in methods.values():
        if spec.section in (*STAGE2_SHARED_FIELDS, "method"):
            raise RuntimeError(f"stage-2 method '{spec.name}': stage2.{spec.section} is a field every method shares; "
                               "allowed: another section name")
    sections = {spec.section: (spec.params, Field(default_factory=spec.params))
                for spec in sorted(methods.values(), key=lambda s: s.name != defaults[0]) if spec.section is not None}
    return create_model("Stage2Params", __base__=OptimParams, __module__=__name__,
                        method=(Literal[names], defaults[0]),  # type: ignore[valid-type]
                        head=(HeadParams, Field(default_factory=HeadParams)),
                        speed=(SpeedParams, Field(default_factory=SpeedParams)), **sections,
                        tabular_view=(TabularViewParams, Field(default_factory=TabularViewParams)))


# Source / protocol combinations that make no sense (Params._protocol_fits_source).
PHOTO_SOURCES = ("imagefolder", "waterbirds", "celeba")  # carry their own attribute
STROKE_PROTOCOLS = ("foreground", "background")  # paint grey digit strokes or backgrounds
UNATTRIBUTED_SOURCES = ("cifar10",)  # photos without a bias attribute
TABULAR_SOURCES = ("adult", "compas")  # feature vectors with their sensitive attribute
MIN_IMAGE_SIZE = {"lenet5": 16}  # smallest image side an encoder can take (LeNet-5: two 5x5 convs and 2x2 pools)


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
    health: HealthParams = Field(default_factory=HealthParams)

    @field_validator("seed", mode="before")
    @classmethod
    def _seed_is_int(cls, value: Any) -> Any:
        if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
            raise ValueError("seed must be a whole number")
        return value

    @model_validator(mode="after")
    def _protocol_fits_source(self) -> "Params":
        source, protocol = self.data.source, self.bias.protocol
        if source in PHOTO_SOURCES and protocol in STROKE_PROTOCOLS:
            raise ValueError(f"bias.protocol = {protocol} recolours grey digit strokes; data.source = {source} holds photos "
                             "that carry their own bias attribute; allowed: bias.protocol = auto, given (or corruption)")
        if source in TABULAR_SOURCES and protocol not in ("auto", "given"):
            raise ValueError(f"bias.protocol = {protocol} biases images; data.source = {source} holds feature vectors "
                             "with their own sensitive attribute; allowed: bias.protocol = auto or given")
        if source in UNATTRIBUTED_SOURCES and protocol == "given":
            raise ValueError(f"bias.protocol = given needs a bias attribute that data.source = {source} does not have; "
                             "allowed: bias.protocol = auto or corruption (Corrupted CIFAR-10)")
        smallest = MIN_IMAGE_SIZE.get(self.model.name)
        if smallest and source not in TABULAR_SOURCES and self.data.image_size < smallest:
            raise ValueError(f"model.name = {self.model.name} needs data.image_size >= {smallest} (its two 5x5 "
                             f"convolutions and pools), got {self.data.image_size}")
        return self


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


EXPECTED_KIND = {"float_type": "a number", "float_parsing": "a number", "int_type": "a whole number",
                 "int_parsing": "a whole number", "int_from_float": "a whole number", "bool_type": "true or false"}


def _describe(error: dict[str, Any], model: type[BaseModel]) -> str:
    """One line for one pydantic error: the dotted key, the (bounded) value, what is allowed."""
    loc = tuple(error["loc"])
    key = ".".join(str(part) for part in loc)
    kind = error["type"]
    value = error.get("input")
    message = error["msg"].removeprefix("Value error, ")
    if kind == "extra_forbidden":
        close = difflib.get_close_matches(key, _valid_keys(model), n=1, cutoff=0.6)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        return f"unknown parameter '{key}' (value {show(value)}){hint}"
    if not key:
        return message
    if kind == "value_error" and isinstance(value, dict):  # a section's own check; its message starts with a field
        return message if message.startswith(f"{key}.") else f"{key}.{message}"  # named in full already: not twice
    if kind == "literal_error":
        return f"{key} = {show(value)} is not allowed; allowed: {error['ctx']['expected']}"
    if kind in EXPECTED_KIND and isinstance(value, (bool, str)):
        message = f"{'a boolean' if isinstance(value, bool) else 'a string'} where {EXPECTED_KIND[kind]} is expected"
    allowed = _allowed_range(_field_at(model, loc))
    return f"{key} = {show(value)}: {message}" + (f"; allowed: {allowed}" if allowed else "")


def validate(raw: dict[str, Any]) -> Params:
    """Validate a params mapping; raise :class:`ParamsError` listing every problem (at most 20)."""
    try:
        return Params.model_validate(raw or {})
    except ValidationError as exc:
        errors = exc.errors()
        problems = [_describe(err, Params) for err in errors[:20]]
        more = f"\n  ... and {len(errors) - 20} more" if len(errors) > 20 else ""
        raise ParamsError("invalid params.yaml:\n  - " + "\n  - ".join(problems) + more) from None


def read_yaml(path: Path) -> Any:
    """``path`` parsed as YAML 1.2 (as DVC parses params.yaml, so ``1e-3`` is a number for both); a file that is
    not UTF-8, not YAML, or repeats a key is a ParamsError naming the file and the place."""
    from ruamel.yaml import YAML

    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise ParamsError(f"{path} is not UTF-8 text (byte {data[exc.start]:#04x} at line {line}); save it as UTF-8") from None
    try:
        return YAML(typ="safe", pure=True).load(text)
    except Exception as exc:  # ruamel's YAMLError, DuplicateKeyError, ...
        lines = [line for line in str(exc).splitlines() if line.strip()][:6]
        raise ParamsError(f"{path} is not valid YAML ({type(exc).__name__}): " + " | ".join(l.strip() for l in lines)[:600]) from None


def load_params(path: str | Path = "params.yaml") -> Params:
    """Read and validate ``params.yaml``; a missing or malformed file is a ParamsError."""
    path = Path(path)
    if not path.exists():
        raise ParamsError(f"{path} not found: run the stage from the repository root")
    raw = read_yaml(path)
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
    full = params.model_dump(mode="json", warnings=False)  # defaults hold tuples where params.yaml holds lists
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


# The stage-2 methods' declarations may import anything above (a method kept in one module imports its training
# code, which names Params in annotations): the schema is completed last.
Stage2Params = _stage2_model()
Params.model_rebuild()
