"""Every param names where its default comes from (src/debias/param_sources.py): a paper's table / section, an
official code file, or "ours" with the reason. The schema is walked, so a param added without a source fails here."""

from __future__ import annotations

from pydantic import BaseModel

from debias.param_sources import KINDS, SOURCES
from debias.params import Params

HOW = ('add a line  "{key}": "paper: <paper, table / section> | code: <official code file> | ours: <the measured '
       'reason>",  to SOURCES in src/debias/param_sources.py')


def leaves(model: type[BaseModel], prefix: str = "") -> list[str]:
    """The dotted names of the schema's leaf params (a nested section is walked, not a leaf)."""
    out: list[str] = []
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            out += leaves(annotation, f"{prefix}{name}.")
        else:
            out.append(f"{prefix}{name}")
    return out


def test_every_param_names_its_source() -> None:
    missing = [key for key in leaves(Params) if key not in SOURCES]
    assert not missing, "params without a source:\n" + "\n".join(HOW.format(key=key) for key in missing)


# Params another change of issue 30 adds to the schema (its branch is merged separately): their sources are here
# already. Once the schema has them, this set no longer matters; then remove it.
def test_every_source_names_a_param_and_a_kind() -> None:
    schema = set(leaves(Params))
    stale = sorted(set(SOURCES) - schema)
    assert not stale, f"SOURCES in src/debias/param_sources.py names params the schema lacks: {stale}; remove them"
    unkinded = [key for key, text in SOURCES.items() if not text.startswith(KINDS) or len(text) < 20]
    assert not unkinded, (f"sources that do not start with one of {KINDS} followed by the table / file / reason: "
                          f"{unkinded}")


def test_the_walk_finds_nested_params() -> None:
    keys = leaves(Params)
    assert {"loss.fairkl.weight", "stage2.cnc.temperature", "data.imagefolder.root", "seed"} <= set(keys)
    assert "loss.fairkl" not in keys and "stage2" not in keys
