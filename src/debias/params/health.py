"""The ``health`` section: when a training loss counts as unstable."""

from __future__ import annotations

from pydantic import Field

from debias.params.base import Section


class HealthParams(Section):
    """When a training loss counts as unstable (``unstable-training``, :func:`debias.core.health.loss_instability`).

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
