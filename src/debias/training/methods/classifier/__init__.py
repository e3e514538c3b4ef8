"""Cross-entropy baselines: the ``erm`` and ``jtt`` declarations; their training is ``train.py``."""

from __future__ import annotations

from pydantic import Field

from debias.params import Section
from debias.training.methods.registry import register_method


class JTTParams(Section):
    upweight: int = Field(20, ge=1, le=10000,
                          description="JTT lambda_up: extra copies of each ERM training error per epoch (each appears "
                                      "1 + upweight times, as JTT's run_expt.py; JTT paper's grid 20 / 50 / 100 on "
                                      "Waterbirds and CelebA; CNC's CMNIST*: ~1100)")


SOURCES: dict[str, str] = {
    "upweight": "ours: 20 at ~1k digits (default 20), not measured: compared with no other value (CNC App. D.2.5 "
                "tried {10, 100, 1000} and used ~1100 at CMNIST* 0.995, benchmarks/fullsize.yaml)",
}

# memory_plan None: a step forwards stage2.batch_size images (JTT's pool is drawn in such batches), no B x B matrix
register_method("erm", f"{__name__}.train:erm_method", display="ERM", head_trained=True, memory_plan=None,
                capturable=True)
register_method("jtt", f"{__name__}.train:jtt_method", display="JTT", head_trained=True, section="jtt",
                params=JTTParams, sources=SOURCES, memory_plan=None, capturable=True)
