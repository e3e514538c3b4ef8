"""The one typed, validated view of ``params.yaml``.

Every stage loads its parameters through :func:`load_params`, so unknown keys
(``loss.epsilion``), wrong types and out-of-range values fail before any data is read,
with one message naming the key, the value, what is allowed and, for a typo, the
closest valid key. Defaults are the papers' settings; ``params.yaml`` states every value
the default pipeline uses, with the reason where it departs from a paper.

One module per section (``data``, ``bias``, ``model``, ``optim`` for ``erm``, ``groups``, ``stage2``, ``loss``,
``probe``, ``evaluate``, ``report``, ``health``), the shared :class:`Section` base in ``base`` and the whole
schema with its loading in ``root``; every name is re-exported here, so ``from debias.params import X`` is the way
to import any of them. A stage's code dependencies list only the section modules of the params it reads
(:mod:`debias.tools.deps`).
"""

from __future__ import annotations

from debias.core.errors import ParamsError  # noqa: F401  (raised by validate and load_params)
from debias.params.base import (  # noqa: F401
    Channel, check_colours, MIN_COLOUR_DISTANCE, MIN_TEMPERATURE, RGB, Section, show
)
from debias.params.data import (  # noqa: F401
    CELEBA_ATTRIBUTES, CelebAParams, Cifar10Params, DataParams, ImageFit, ImageFolderParams, PATH_SOURCES, SplitName,
    TabularParams, WATERBIRDS_URL, WaterbirdsParams
)
from debias.params.bias import (  # noqa: F401
    BACKGROUND_COLOURS, BackgroundParams, BiasParams, CorruptionName, CorruptionParams, DFA_CORRUPTIONS,
    FOREGROUND_COLOURS, ForegroundParams
)
from debias.params.model import (  # noqa: F401
    ACTIVATION_ENCODERS, FeatureActivation, HEAD_INPUTS, HeadInput, MLPParams, ModelParams, PRETRAINABLE
)
from debias.params.evaluate import EvaluateParams, UMAPParams  # noqa: F401
from debias.params.health import HealthParams  # noqa: F401
from debias.params.loss import EpsSupConParams, FairKLParams, LossParams  # noqa: F401
from debias.params.optim import OptimParams  # noqa: F401
from debias.params.probe import _positive_distinct, ProbeBase  # noqa: F401
from debias.params.report import ReportParams  # noqa: F401
from debias.params.stage2 import HeadParams, SpeedParams, STAGE2_SHARED_FIELDS, TabularViewParams  # noqa: F401
from debias.params.root import (  # noqa: F401
    _allowed_range, _describe, _field_at, _valid_keys, as_dict, EXPECTED_KIND, flatten, load_params, MIN_IMAGE_SIZE,
    Params, params_hash, PHOTO_SOURCES, read_yaml, section, STROKE_PROTOCOLS, TABULAR_SOURCES, UNATTRIBUTED_SOURCES,
    validate
)

# The declarations (stage-2 methods: debias.training.methods.registry, group-inference methods:
# debias.groups.registry, probe variants: debias.evaluation.variants) may import anything above, a method kept in
# one module its training code too: Stage2Params, GroupsParams and ProbeParams are built from them last (the
# stage-2 discovery first: it imports the DEBIAS_METHODS modules, which may register anything), and the schema
# completed with them.
from debias.params import groups as _groups, probe as _probe, root as _root, stage2 as _stage2  # noqa: E402

Stage2Params = _root.Stage2Params = _stage2.Stage2Params = _stage2.stage2_model()
GroupsParams = _root.GroupsParams = _groups.GroupsParams = _groups.groups_model()
ProbeParams = _root.ProbeParams = _probe.ProbeParams = _probe.probe_model()
Params.model_rebuild()

# the declared sections, by the names they had in this package
from debias.evaluation.probes.dfr import DFRParams  # noqa: E402, F401
from debias.groups.methods.cluster import ClusterParams  # noqa: E402, F401
from debias.groups.methods.soft import SoftParams  # noqa: E402, F401
