"""The ``model`` section: the encoder."""

from __future__ import annotations

from typing import Annotated, Literal, get_args

from pydantic import Field, model_validator

from debias.params.base import Section

# Encoders with torchvision ImageNet weights (model.pretrained: true).
PRETRAINABLE = ("resnet18", "resnet50")


class MLPParams(Section):
    """The ``mlp`` encoder: [Linear, ReLU, BatchNorm1d] per hidden layer (WCL Sec. 6.2: "MLP with ReLU
    activation followed by batch normalization"); widths 3 x 100 as LfF's MLP (alinlab/LfF module/mlp.py)."""

    hidden: list[Annotated[int, Field(ge=1, le=65536)]] = Field(
        default_factory=lambda: [100, 100, 100], min_length=1, max_length=64,
        description="width of each hidden layer; its length is the depth; the last width is the feature size")
    batch_norm: bool = Field(True, description="BatchNorm1d after each ReLU (WCL); false: LfF's plain MLP")


# Image encoders with BatchNorm layers (debias.models; the mlp has them where model.mlp.batch_norm says so).
BATCHNORM_ENCODERS = ("simpleconv", "resnet18", "resnet50")


def has_batchnorm(model: "ModelParams", tabular: bool) -> bool:
    """Whether the encoder built for ``model`` has BatchNorm layers; ``tabular``: feature vectors, for which every
    ``model.name`` builds the mlp."""
    return model.mlp.batch_norm if tabular or model.name == "mlp" else model.name in BATCHNORM_ENCODERS


# Encoders whose last feature layer takes model.feature_activation (the others end as their paper built them:
# ResNets in ReLU + average pool, the MLP in BatchNorm).
ACTIVATION_ENCODERS = ("lenet5", "simpleconv")
FeatureActivation = Literal["relu", "tanh"]
HeadInput = Literal["raw", "unit"]  # what a network's linear head reads: z itself, or z / |z| (stage2.head.features)
HEAD_INPUTS: tuple[str, ...] = get_args(HeadInput)


class ModelParams(Section):
    name: Literal["lenet5", "simpleconv", "resnet18", "resnet50", "mlp"] = Field(
        "lenet5", description="image encoders (lenet5, simpleconv, resnet18, resnet50) are replaced by mlp for feature vectors")
    pretrained: bool = Field(False, description="resnet18 / resnet50: start from torchvision's ImageNet weights (CNC: ResNet-50)")
    feature_activation: Literal["auto", "relu", "tanh"] = Field(
        "auto", description="activation of the encoder's feature layer (lenet5, simpleconv). auto: each method's paper "
                            "(relu: ERM, JTT, CNC's LeNet-5, WCL with its projection head; tanh: the supcon family and "
                            "FairKL without a projection head, as the FairKL authors' encoder: a ReLU feature layer keeps "
                            "every normalised z in the positive orthant)")
    stem: Literal["auto", "cifar", "imagenet"] = Field(
        "auto", description="first layers of resnet18 / resnet50. imagenet: torchvision's 7x7 stride-2 convolution and "
                            "3x3 max-pool; cifar: one 3x3 stride-1 convolution, no max-pool; auto: imagenet with "
                            "pretrained weights or images over 64 px, else cifar")
    normalization: Literal["auto", "half", "cifar10", "imagenet"] = Field(
        "auto", description="per-channel mean / std of image inputs: half (0.5 / 0.5), cifar10 (CIFAR-10's, as FairKL's "
                            "code on Corrupted CIFAR-10 and bFFHQ), imagenet (ImageNet's); auto: the pretrained "
                            "weights' (imagenet), else half. Feature vectors are never normalised here")
    mlp: MLPParams = Field(default_factory=MLPParams)

    @model_validator(mode="after")
    def _weights_exist(self) -> "ModelParams":
        if self.pretrained and self.name not in PRETRAINABLE:
            raise ValueError(f"pretrained = true needs ImageNet weights, which name = {self.name} does not have; "
                             f"allowed: {', '.join(PRETRAINABLE)}")
        if self.stem != "auto" and self.name not in PRETRAINABLE:
            raise ValueError(f"stem = {self.stem} sets the first layers of {', '.join(PRETRAINABLE)}; name = {self.name} "
                             "keeps its own; allowed: auto")
        if self.stem == "cifar" and self.pretrained:
            raise ValueError("stem = cifar replaces the first convolution that the ImageNet weights (pretrained = true) "
                             "were trained with; allowed with pretrained: auto or imagenet")
        if self.feature_activation == "tanh" and self.name not in ACTIVATION_ENCODERS:
            raise ValueError(f"feature_activation = tanh replaces the last activation of {', '.join(ACTIVATION_ENCODERS)}; "
                             f"name = {self.name} keeps its own; allowed: auto or relu with {self.name}")
        return self
