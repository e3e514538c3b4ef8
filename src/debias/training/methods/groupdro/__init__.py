"""Group DRO (Sagawa et al. 2020): the ``groupdro`` declaration; its training is ``train.py``."""

from __future__ import annotations

from pydantic import Field

from debias.params import Section
from debias.training.methods.registry import register_method


class GroupDROParams(Section):
    """Group DRO (Sagawa et al. 2020, Alg. 1) on the groups table's groups (true with groups.method: true)."""

    step_size: float = Field(0.01, gt=0, le=100, description="eta_q of the group-weight update (Sagawa et al.: 0.01)")
    adjustment: float = Field(0.0, ge=0, le=100, description="C of the group adjustment C / sqrt(n_g) (CNC's CMNIST*: 0)")
    balanced_sampling: bool = Field(True, description="draw batches group-balanced, with replacement (Alg. 1's uniform "
                                    "group draw; the authors' runs: --reweight_groups); false: plain shuffled epochs")


SOURCES: dict[str, str] = {
    "step_size": "paper: GroupDRO (Sagawa et al. 2020): eta_q (default 0.01)",
    "adjustment": "paper: CNC App. D.2.5: C on CMNIST* (default 0)",
    "balanced_sampling": "code: GroupDRO's commands pass --reweight_groups (default true; Alg. 1 draws a group "
                         "uniformly)",
}

# memory_plan None: a step forwards stage2.batch_size images, no B x B matrix
register_method("groupdro", f"{__name__}.train:groupdro_method", display="GroupDRO", head_trained=True,
                section="groupdro", params=GroupDROParams, sources=SOURCES, memory_plan=None, capturable=True)
