"""Every param names where its default comes from (src/debias/schema/sources.py): a paper's table / section, an
official code file, or "ours" with the reason. The schema is walked, so a param added without a source fails here."""

from __future__ import annotations

from pydantic import BaseModel

from debias.schema import Params
from debias.schema.sources import KINDS, SOURCES

HOW = ('add a line  "{key}": "paper: <paper, table / section> | code: <official code file> | ours: <the measured '
       'reason>",  to SOURCES in src/debias/schema/sources.py')


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
    assert not stale, f"SOURCES in src/debias/schema/sources.py names params the schema lacks: {stale}; remove them"
    unkinded = [key for key, text in SOURCES.items() if not text.startswith(KINDS) or len(text) < 20]
    assert not unkinded, (f"sources that do not start with one of {KINDS} followed by the table / file / reason: "
                          f"{unkinded}")


def test_the_walk_finds_nested_params() -> None:
    keys = leaves(Params)
    assert {"loss.fairkl.weight", "stage2.cnc.temperature", "data.imagefolder.root", "seed"} <= set(keys)
    assert "loss.fairkl" not in keys and "stage2" not in keys


# --------------------------------------------------------------------------- quoted values are checked facts
# The convention (src/debias/schema/sources.py's docstring): a line quotes its key's value only as
#   "(default X" or "; default X"   the schema's default, which params.yaml keeps;
#   "schema default X"              the schema's default, where params.yaml states another value ...
#   "params.yaml Y"                 ... and that value.
# Every number or boolean leaf quotes its value so; where params.yaml departs from the schema the line names both.
# Values come from the schema and the committed params.yaml, never from this file: a default that changes
# makes its stale line fail here.

import re  # noqa: E402
import typing  # noqa: E402

import yaml  # noqa: E402

from tests.conftest import committed_text  # noqa: E402

_TOKEN = r"(-?[0-9][0-9_]*(?:\.[0-9]+)?(?:e-?[0-9]+)?|true|false|null|[a-z][a-z0-9_]*)"
MARKERS = {"default": re.compile(r"(?:\(|[;,] )default " + _TOKEN),
           "schema default": re.compile(r"schema default " + _TOKEN),
           "params.yaml": re.compile(r"params\.yaml " + _TOKEN)}


def _at(tree: dict, key: str) -> typing.Any:
    for part in key.split("."):
        tree = tree.get(part, {}) if isinstance(tree, dict) else {}
    return tree


def _is_scalar(value: typing.Any) -> bool:
    return isinstance(value, (bool, int, float))


def _literal_choices(key: str) -> tuple[str, ...]:
    """The allowed strings of a Literal-typed leaf (empty for other types)."""
    model: typing.Any = Params
    *sections, name = key.split(".")
    for section in sections:
        model = model.model_fields[section].annotation
    return tuple(arg for arg in typing.get_args(model.model_fields[name].annotation) if isinstance(arg, str))


def _parse(token: str, default: typing.Any, choices: tuple[str, ...]) -> tuple[bool, typing.Any]:
    """(is a value of this key, the value): a token of prose after a marker (``params.yaml comment``) is not."""
    if token == "null":
        return True, None
    if isinstance(default, bool):
        return token in ("true", "false"), token == "true"
    if isinstance(default, (int, float)) or default is None:
        try:
            return True, float(token)
        except ValueError:
            return False, None
    return token in choices, token


def quoted_value_errors(sources: dict[str, str], schema: dict, shipped: dict) -> dict[str, list[str]]:
    """Per key, what its source line gets wrong about the schema's default and params.yaml's value."""
    errors: dict[str, list[str]] = {}
    for key in leaves(Params):
        if key not in sources:
            continue
        text, default, in_yaml = sources[key], _at(schema, key), _at(shipped, key)
        value = default if in_yaml == {} else in_yaml
        differs = value != default
        expected = {"default": default, "schema default": default, "params.yaml": value}
        found: dict[str, list[typing.Any]] = {}
        for marker, pattern in MARKERS.items():
            for token in pattern.findall(text):
                ok, parsed = _parse(token, default, _literal_choices(key))
                if ok:
                    found.setdefault(marker, []).append(parsed)
        wrong = [f"quotes '{marker} {quoted}', but it is {expected[marker]!r}"
                 for marker, values in found.items() for quoted in values if quoted != expected[marker]]
        if differs and "default" in found:
            wrong.append(f"quotes one default, but the schema says {default!r} and params.yaml {value!r}: "
                         "write 'schema default X' and 'params.yaml Y'")
        if differs and not {"schema default", "params.yaml"} <= set(found):
            wrong.append(f"params.yaml states {value!r}, the schema {default!r}: the line must quote both "
                         f"('schema default {default}', 'params.yaml {value}')")
        elif _is_scalar(default) and not found:
            wrong.append(f"quotes no value: write '(default {default})'")
        if wrong:
            errors[key] = wrong
    return errors


def _schema_and_shipped() -> tuple[dict, dict]:
    return Params().model_dump(mode="json", warnings=False), yaml.safe_load(committed_text("params.yaml"))


def test_every_quoted_default_is_the_schemas_and_params_yamls() -> None:
    errors = quoted_value_errors(SOURCES, *_schema_and_shipped())
    assert not errors, "stale values in src/debias/schema/sources.py:\n" + "\n".join(
        f"  {key}: {'; '.join(problems)}" for key, problems in errors.items())


def test_the_check_catches_a_stale_quote_a_missing_one_and_prose() -> None:
    schema, shipped = _schema_and_shipped()
    key = "stage2.cnc.temperature"
    default = _at(schema, key)
    assert quoted_value_errors({key: f"paper: CNC App. D.2.4 (default {default})"}, schema, shipped) == {}
    stale = quoted_value_errors({key: f"paper: CNC App. D.2.4 (default {default + 1})"}, schema, shipped)[key]
    assert stale == [f"quotes 'default {default + 1}', but it is {default!r}"]
    unquoted = quoted_value_errors({key: f"paper: CNC App. D.2.4: tau {default}, scikit-learn's default 7"},
                                   schema, shipped)[key]
    assert unquoted == [f"quotes no value: write '(default {default})'"]
    moved = {**shipped, "stage2": {**shipped["stage2"], "cnc": {**shipped["stage2"]["cnc"], "temperature": 0.5}}}
    one = " ".join(quoted_value_errors({key: f"paper: CNC App. D.2.4 (default {default})"}, schema, moved)[key])
    assert "write 'schema default X' and 'params.yaml Y'" in one and "the line must quote both" in one
    both = {key: f"paper: CNC App. D.2.4 (schema default {default}); params.yaml 0.5 (ours: the params.yaml comment)"}
    assert key not in quoted_value_errors(both, schema, moved)
