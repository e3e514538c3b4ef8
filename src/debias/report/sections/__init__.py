"""The report's sections, one module each, in :data:`REGISTRY`'s order: a module holds its ``TITLE`` and
``section(context) -> Section``; adding a section is one new module and one entry here."""

from __future__ import annotations

from types import ModuleType

from debias.report.sections import (curves, dataset, group_inference, headline, papers, per_group, provenance,
                                    representations, results, run_params, stage_warnings)

# In the order a reader needs them: the headline card, what to distrust, the results, how they came about, then
# the data, provenance and params.
REGISTRY: tuple[ModuleType, ...] = (headline, stage_warnings, results, per_group, curves, representations,
                                    group_inference, papers, dataset, provenance, run_params)
SECTIONS = tuple(module.TITLE for module in REGISTRY)
