"""The ``stage2`` section: the stage-2 method, its optimiser and each method's own settings."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field

from debias.core.errors import DeclarationError
from debias.params.base import Section, schema_order
from debias.params.model import HeadInput
from debias.params.optim import STEP_DESCRIPTION, OptimParams, StepMode


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
    step: StepMode = Field("eager", description=STEP_DESCRIPTION + "; the methods whose declaration says capturable")


# Fields every stage-2 method shares; each method's own section (stage2.<section>) is declared by the method
# (debias.training.methods.registry) and joins Stage2Params when the schema is built (debias.schema).
STAGE2_SHARED_FIELDS = ("head", "speed", "tabular_view", *OptimParams.model_fields)
# stage2's defaults where they differ from erm's (OptimParams): CNC's optimiser (App. D.2.4)
STAGE2_DEFAULTS: dict[str, Any] = {"optimizer": "sgd", "lr": 1e-3, "momentum": 0.9, "weight_decay": 1e-4, "epochs": 3,
                                   "selection": "best_worst_group"}


class Stage2Base(OptimParams):
    """The ``stage2`` section's base: the optimiser fields; ``method``, ``head``, ``speed``, the methods' own sections
    and ``tabular_view`` join it in :func:`stage2_model`."""


def stage2_model(methods: Mapping[str, Any]) -> type[Stage2Base]:
    """Stage2Params from the registered ``methods`` (name -> MethodSpec): the optimiser fields, ``method`` allowing
    exactly the registered methods (the one declared the schema default first), ``head``, ``speed``, each method's
    own params section as the field ``stage2.<section>``, then ``tabular_view``."""
    from pydantic import create_model

    names = schema_order(methods, "stage-2 method")
    for spec in methods.values():
        if spec.section in (*STAGE2_SHARED_FIELDS, "method"):
            raise DeclarationError(f"stage-2 method '{spec.name}': stage2.{spec.section} is a field every method "
                                   "shares; allowed: another section name")
    sections = {spec.section: (spec.params, Field(default_factory=spec.params))
                for spec in sorted(methods.values(), key=lambda s: s.name != names[0]) if spec.section is not None}
    return create_model("Stage2Params", __base__=Stage2Base, __module__="debias.schema",
                        method=(Literal[names], names[0]),  # type: ignore[valid-type]
                        head=(HeadParams, Field(default_factory=HeadParams)),
                        speed=(SpeedParams, Field(default_factory=SpeedParams)), **sections,
                        tabular_view=(TabularViewParams, Field(default_factory=TabularViewParams)))
