"""params.yaml is written in the style `dvc exp run -S` writes it, so an experiment's diff is the line it changed."""

from __future__ import annotations

import difflib

import pytest
from dvc.utils.hydra import apply_overrides  # what `dvc exp run -S` calls to write params.yaml

from debias.tools import presets
from tests.conftest import committed_text


def changed_lines(before: str, after: str) -> list[str]:
    return [line for line in difflib.unified_diff(before.splitlines(), after.splitlines(), lineterm="", n=0)
            if line[:1] in "+-" and not line.startswith(("+++", "---"))]


@pytest.mark.parametrize("override, old, new", [
    ("loss.epsilon=0.25", "  epsilon: 0.0", "  epsilon: 0.25"),
    ("stage2.method=eps_supinfonce", "  method: cnc", "  method: eps_supinfonce"),
    ("data.path=data/external/mnist10k.npz", "  path: ", "  path: data/external/mnist10k.npz"),
])
def test_one_override_changes_one_line(tmp_path, override: str, old: str, new: str) -> None:
    text = committed_text("params.yaml")
    path = tmp_path / "params.yaml"
    path.write_text(text)
    apply_overrides(path, [override])
    diff = changed_lines(text, path.read_text())
    assert len(diff) == 2, "\n".join(diff)  # one line out, one line in
    assert diff[0].startswith("-" + old) and diff[1].startswith("+" + new), diff


def test_an_override_to_the_same_value_leaves_the_file_byte_identical(tmp_path) -> None:
    text = committed_text("params.yaml")
    path = tmp_path / "params.yaml"
    path.write_text(text)
    apply_overrides(path, ["seed=0"])
    assert path.read_text() == text


@pytest.mark.slow
def test_presets_still_rewrite_the_file_in_place() -> None:
    """The presets set values where they stand, DVC's empty nulls included (wcl-adult sets stage2.wcl.tau_plus)."""
    text = committed_text("params.yaml")
    applied = presets.plan_apply(text, presets.load("wcl-adult"))
    diff = changed_lines(text, applied.text)
    assert "-    tau_plus:" in diff and any(line.startswith("+    tau_plus: 0.1") for line in diff)
    for name in presets.names():
        if name != "fairkl-bffhq":  # needs a folder only the user can give
            presets.plan_apply(text, presets.load(name))
