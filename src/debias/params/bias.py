"""The ``bias`` section: how the bias is injected (foreground, background, corruption, given)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from debias.params.base import check_colours, RGB, Section, show

# Biased-MNIST colours (Bahng et al.; FairKL paper), indexed by class.
BACKGROUND_COLOURS: list[RGB] = [
    (255, 0, 0), (0, 255, 0), (0, 0, 255), (225, 225, 0), (225, 0, 225),
    (0, 255, 255), (255, 128, 0), (255, 0, 128), (128, 0, 255), (128, 128, 128),
]
# CMNIST* colours (CNC code): matplotlib hsv at 0, .2, .4, .6, .8, indexed by class.
FOREGROUND_COLOURS: list[RGB] = [
    (255, 0, 0), (208, 255, 0), (0, 255, 92), (0, 116, 255), (184, 0, 255),
]


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
    protocol: Literal["auto", "foreground", "background", "given", "corruption", "none"] = Field(
        "auto", description="auto: given where the raw data carries its own attribute a (adult, compas, imagefolder, "
                            "waterbirds, celeba, an npz with a), none where such a source has no attribute (an "
                            "imagefolder without attribute column), else the source's registered protocol (foreground "
                            "for the digit sources, corruption for cifar10); none: the data has no bias labels")
    max_uncolourable: float = Field(0.01, ge=0, le=1, description="largest fraction of a split's images on which the "
                                    "colour may not show (no stroke pixel >= threshold / no background); above it "
                                    "inject_bias refuses")
    foreground: ForegroundParams = Field(default_factory=ForegroundParams)
    background: BackgroundParams = Field(default_factory=BackgroundParams)
    corruption: CorruptionParams = Field(default_factory=CorruptionParams)
