"""The ``health`` section: when a training loss counts as unstable."""

from __future__ import annotations

from pydantic import Field

from debias.params.base import Section


class HealthParams(Section):
    """When a training loss counts as unstable (``unstable-training``, :func:`debias.core.health.loss_instability`).

    Ours: a rise by a quarter of the fall so far is far above the epoch-to-epoch noise of a loss that converges
    (a fraction of a percent of its fall) and well below the jump of a loss thrown off its minimum."""

    loss_spike: float = Field(0.25, gt=0, description="an epoch whose loss rose over the previous epoch's by more "
                              "than this fraction of the fall so far (first epoch's loss minus the lowest) is a spike "
                              "(ours: a quarter of the fall, far above a converging loss's noise)")
    loss_end: float = Field(0.25, gt=0, description="the last epoch's loss above the minimum by more than this "
                            "fraction of the fall ends high, a slow drift up included (ours: as loss_spike)")
    loss_min_fall: float = Field(0.1, ge=0, lt=1, description="judge only once the loss fell by this fraction of "
                                 "|first epoch's loss| (ours: a loss that barely moved has no convergence to lose)")
