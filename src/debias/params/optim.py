"""The optimiser settings shared by ``erm`` and ``stage2`` (``erm``: these and how its step runs)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from debias.params.base import Section, show

# The selection rules (debias.training.selection.RULES): the last epoch, two on the true groups (worst group; the
# unbiased mean over groups), and two that need no bias label (worst class; worst inferred group, whose groups
# infer_groups infers from ERM: not for ERM).
Selection = Literal["last", "best_worst_group", "best_worst_class", "best_worst_inferred_group", "best_unbiased"]
NEEDS_INFERRED_GROUPS = ("best_worst_inferred_group",)
NEEDS_TRUE_GROUPS = ("best_worst_group", "best_unbiased")  # rules reading the true groups: refused for data without bias labels
# How a training step runs (debias.training.captured): op by op, or captured once per batch shape as a CUDA graph.
StepMode = Literal["eager", "cuda_graph"]
EAGER, CUDA_GRAPH = "eager", "cuda_graph"


def capture_problems(method: str, capturable: bool, reason: str, autocast: str = "none",
                     compiled: bool = False) -> list[str]:
    """Why a ``cuda_graph`` step cannot run for what the params alone say (the method's step, autocast, compile), each
    with what is allowed; the device, the ranks and the data's fit are the run's (debias.training.captured)."""
    problems = []
    if not capturable:
        problems.append(f"stage2.method = {method} has no capturable step ({reason})")
    if autocast != "none":
        problems.append(f"stage2.speed.autocast = {autocast}: autocast under capture is not supported here "
                        "(pytorch/pytorch#71631); allowed with cuda_graph: stage2.speed.autocast none")
    if compiled:
        problems.append("stage2.speed.compile = true: a compiled encoder is not combined with a captured step; "
                        "allowed with cuda_graph: stage2.speed.compile false")
    return problems
STEP_DESCRIPTION = ("eager: the training step launched op by op (the CPU path); cuda_graph: captured once per batch "
                    "shape as a CUDA graph and replayed (CUDA only; debias.training.captured) (ours)")


class OptimParams(Section):
    optimizer: Literal["sgd", "adam"] = "sgd"
    lr: float = Field(1e-3, gt=0, le=10)
    momentum: float = Field(0.9, ge=0, lt=1)
    weight_decay: float = Field(5e-4, ge=0, le=10)
    batch_size: int = Field(32, ge=1, le=65536)
    epochs: int = Field(5, ge=1, le=10000)
    lr_milestones: list[int] = Field(default_factory=list, description="epochs at which the lr is multiplied by lr_gamma")
    lr_gamma: float = Field(0.1, gt=0, le=1)
    selection: Selection = Field("last", description="which epoch is kept: last | best_worst_group | best_unbiased (true "
                                 "groups) | best_worst_class | best_worst_inferred_group (no bias label; stage 2 only)")
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


class ErmParams(OptimParams):
    """The ``erm`` section: the optimiser settings and how the training step runs."""

    step: StepMode = Field("eager", description=STEP_DESCRIPTION)
