"""The sections of ``params.yaml``, each a typed, validated model: the leaf of the package (it imports nothing of
debias but :mod:`debias.core`); the whole schema, with the sections the registries declare, is :mod:`debias.schema`.

Every stage loads its parameters through :func:`debias.schema.load_params`, so unknown keys
(``loss.epsilion``), wrong types and out-of-range values fail before any data is read,
with one message naming the key, the value, what is allowed and, for a typo, the
closest valid key. Defaults are the papers' settings; ``params.yaml`` states every value
the default pipeline uses, with the reason where it departs from a paper.

One module per section (``data``, ``bias``, ``model``, ``optim`` for ``erm``, ``groups``, ``stage2``, ``loss``,
``probe``, ``evaluate``, ``report``, ``health``), the shared :class:`Section` base in ``base`` and the root
:class:`Params` (every section, the checks across them) in ``root``; every name is re-exported here, so
``from debias.params import X`` is the way to import any of them. ``groups``, ``stage2`` and ``probe`` are built from
the registries' declarations by :mod:`debias.schema`; here they are their bases (``GroupsBase``, ``Stage2Base``,
``ProbeBase``), what the code reading them annotates. A stage's code dependencies list only the section modules of the params it reads
(:mod:`debias.tools.deps`).
"""

from __future__ import annotations

from debias.core.errors import ParamsError  # noqa: F401  (raised by debias.schema.validate and load_params)
from debias.params.base import (  # noqa: F401
    Channel, check_colours, MIN_COLOUR_DISTANCE, MIN_TEMPERATURE, RGB, schema_order, Section, show
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
from debias.params.groups import GroupsBase  # noqa: F401
from debias.params.health import HealthParams  # noqa: F401
from debias.params.loss import EpsSupConParams, FairKLParams, LossParams  # noqa: F401
from debias.params.optim import ErmParams, OptimParams  # noqa: F401
from debias.params.probe import _positive_distinct, ProbeBase  # noqa: F401
from debias.params.report import ReportParams  # noqa: F401
from debias.params.stage2 import (  # noqa: F401
    HeadParams, SpeedParams, Stage2Base, STAGE2_DEFAULTS, STAGE2_SHARED_FIELDS, TabularViewParams
)
from debias.params.root import (  # noqa: F401
    _allowed_range, _describe, _field_at, _valid_keys, as_dict, EXPECTED_KIND, flatten, MIN_IMAGE_SIZE, Params,
    params_hash, parse_yaml, PHOTO_SOURCES, problems, read_yaml, section, STROKE_PROTOCOLS, TABULAR_SOURCES,
    UNATTRIBUTED_SOURCES
)
