"""Equalized-odds post-processing (Hardt, Price, Srebro 2016) of a fitted probe, for binary tasks
(``probe.postprocess: equalized_odds``); the declaration, the code is ``fit.py``."""

from __future__ import annotations

from debias.evaluation.variants import register_postprocess

register_postprocess("equalized_odds", binary=True, report=f"{__name__}.fit:equalized_odds_report",
                     display="equalized-odds post-processing", needs_attribute=True)
