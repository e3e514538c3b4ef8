"""The ``data`` section: which source, its splits and its per-source settings."""

from __future__ import annotations

import difflib
from typing import Literal

from pydantic import Field, model_validator

from debias.params.base import Section, show

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
    attribute_column: str | None = Field(
        "place", min_length=1, description="the bias attribute's column; null: the data has no bias labels (groups are "
        "inferred, and every number that needs the true attribute says so)")
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
        if self.attribute_column is None and self.attribute_values is not None:
            raise ValueError("data.imagefolder.attribute_values is set but data.imagefolder.attribute_column is null; "
                             "allowed: attribute_values with an attribute column, or neither")
        for name in ("label_values", "attribute_values"):
            values = getattr(self, name)
            if values is not None and (len(values) < 2 or len(set(map(str, values))) != len(values)):
                raise ValueError(f"data.imagefolder.{name} = {values}; allowed: at least two distinct values")
        columns = [self.path_column, self.label_column] + [c for c in (self.attribute_column, self.split_column) if c]
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
