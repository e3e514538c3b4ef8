"""The ``report`` section."""

from __future__ import annotations

from pydantic import Field

from debias.params.base import Section


class ReportParams(Section):
    title: str = "debias report"
    paper_numbers: bool = Field(True, description="put the papers' reported numbers beside ours where the protocol matches")
    dpi: int = Field(110, ge=50, le=400)
    confidence: float = Field(0.95, gt=0, lt=1, description="level of the Wilson interval every group accuracy carries "
                              "(ours: the conventional 95 %, issue 27)")
    min_group_n: int = Field(30, ge=1, description="a worst group with fewer test images is marked as too small to "
                             "read alone (ours: the usual n >= 30 rule of thumb, issue 27)")
