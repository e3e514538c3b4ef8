"""Paper presets: named, versioned sets of params (``src/debias/tools/presets/*.yaml``) that carry a paper's protocol
and the objective its numbers came from, composed over ``params.yaml`` by ``debias preset apply NAME``.

A preset file holds ``name`` (= its file name), ``version`` (bumped whenever a value changes), ``title``, ``paper``
(the numbers the protocol produced there), ``objective``, ``deviations`` (where this pipeline cannot follow the paper),
``requires`` (params the user must give, e.g. a data folder) and ``blocks``: a list of ``{source, params}``, each
``source`` naming the paper table / section or official code file its values come from. ``extends: OTHER`` starts
from another preset's blocks (files named ``_*.yaml`` are bases only: listed by no command, applied by none).
"""

from __future__ import annotations

import copy
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from debias.core.errors import ParamsError
from debias.core.trees import flatten, merge, unflatten

PRESET_DIR = Path(__file__).resolve().parent
REQUIRED_KEYS = ("name", "version", "title", "paper", "objective", "blocks")
OPTIONAL_KEYS = ("extends", "deviations", "requires")
BLOCK_KEYS = ("source", "params")


class PresetError(ParamsError):
    """A preset is unknown, malformed, or does not compose into valid params."""


@dataclass(frozen=True)
class Preset:
    name: str
    version: int
    title: str
    paper: str
    objective: str
    blocks: list[dict[str, Any]]
    deviations: list[str] = field(default_factory=list)
    requires: dict[str, str] = field(default_factory=dict)

    def params(self) -> dict[str, Any]:
        """The blocks' params merged in order (a later block wins)."""
        out: dict[str, Any] = {}
        for block in self.blocks:
            out = merge(out, block["params"])
        return out

    def sources(self) -> dict[str, str]:
        """dotted key -> the source of its value (the last block that sets it)."""
        return {key: block["source"] for block in self.blocks for key in flatten(block["params"])}


# --------------------------------------------------------------------------- trees


def select(tree: dict, keys: list[str] | None) -> dict:
    """The subtrees of ``tree`` at the dotted ``keys`` (all of it when None); a key the tree lacks is an error."""
    if keys is None:
        return copy.deepcopy(tree)
    flat = flatten(tree)
    chosen = {k: v for k, v in flat.items() if any(k == key or k.startswith(key + ".") for key in keys)}
    missing = [key for key in keys if not any(k == key or k.startswith(key + ".") for k in flat)]
    if missing:
        raise PresetError(f"preset keys {missing} set no value; allowed: dotted keys the preset sets, e.g. "
                          f"{sorted({k.split('.')[0] for k in flat})}")
    return unflatten(chosen)


# --------------------------------------------------------------------------- loading


def _read(path: Path) -> dict[str, Any]:
    from debias.params import read_yaml

    raw = read_yaml(path)
    if not isinstance(raw, dict):
        raise PresetError(f"{path}: a preset is a mapping with {', '.join(REQUIRED_KEYS)}")
    return raw


def _file(name: str) -> Path:
    return PRESET_DIR / f"{name}.yaml"


def names() -> list[str]:
    """The presets one can apply (files not starting with ``_``), sorted."""
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml") if not p.stem.startswith("_"))


def _unknown(name: str) -> PresetError:
    import difflib

    close = difflib.get_close_matches(name, names(), n=1, cutoff=0.6)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    return PresetError(f"unknown preset '{name}'{hint}; allowed: {', '.join(names())}")


def _raw_blocks(name: str, seen: tuple[str, ...] = ()) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A preset file's mapping and its blocks with those of the presets it extends first."""
    path = _file(name)
    if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.\-]*", name) or not path.is_file():
        raise _unknown(name)
    if name in seen:
        raise PresetError(f"preset {path.name}: extends itself through {' -> '.join(seen + (name,))}")
    raw = _read(path)
    unknown = sorted(set(raw) - set(REQUIRED_KEYS) - set(OPTIONAL_KEYS))
    if unknown:
        raise PresetError(f"preset {path.name}: unknown keys {unknown}; allowed: {', '.join(REQUIRED_KEYS + OPTIONAL_KEYS)}")
    blocks = raw.get("blocks") or []
    for i, block in enumerate(blocks):
        if not isinstance(block, dict) or set(block) != set(BLOCK_KEYS) or not str(block["source"]).strip() \
                or not isinstance(block["params"], dict) or not block["params"]:
            raise PresetError(f"preset {path.name}: blocks[{i}] must hold exactly a non-empty 'source' (the paper "
                              "table / section or code file its values come from) and a non-empty 'params' mapping")
    inherited: list[dict[str, Any]] = []
    if raw.get("extends"):
        _, inherited = _raw_blocks(str(raw["extends"]), seen + (name,))
    return raw, inherited + blocks


def load(name: str) -> Preset:
    """The preset ``name`` (``NAME@VERSION`` also checks its version); unknown names list the known ones."""
    name, _, pinned = name.partition("@")
    if name.startswith("_"):
        raise _unknown(name)
    raw, blocks = _raw_blocks(name)
    missing = [key for key in REQUIRED_KEYS if key not in raw or raw[key] in (None, "", [])]
    if missing:
        raise PresetError(f"preset {name}.yaml lacks {', '.join(missing)}")
    if raw["name"] != name:
        raise PresetError(f"preset {name}.yaml names itself '{raw['name']}'; allowed: its file name '{name}'")
    version = raw["version"]
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise PresetError(f"preset {name}.yaml: version = {version!r}; allowed: a whole number >= 1")
    if pinned and pinned != str(version):
        raise PresetError(f"preset {name} is at version {version}, not {pinned}: its values changed since (git log "
                          f"src/debias/tools/presets/{name}.yaml); drop '@{pinned}' to use version {version}")
    return Preset(name=name, version=version, title=str(raw["title"]), paper=str(raw["paper"]),
                  objective=str(raw["objective"]), blocks=blocks, deviations=list(raw.get("deviations") or []),
                  requires=dict(raw.get("requires") or {}))


# --------------------------------------------------------------------------- composing


def parse_sets(items: list[str]) -> dict[str, Any]:
    """``["a.b=1", ...]`` -> ``{"a": {"b": 1}}`` (values parsed as YAML, as ``dvc exp run -S``)."""
    import yaml

    flat: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise PresetError(f"--set {item!r}: expected KEY=VALUE (e.g. data.imagefolder.root=data/external/bffhq)")
        flat[key.strip()] = yaml.safe_load(text)
    return unflatten(flat)


def compose(base: dict[str, Any], preset: Preset, sets: dict[str, Any] | None = None) -> dict[str, Any]:
    """``base`` (params.yaml's mapping) <- the preset's params <- ``sets``; a required param left unset is an error."""
    sets = sets or {}
    given = flatten(sets)
    missing = [key for key in preset.requires if key not in given]
    if missing:
        lines = "\n".join(f"  --set {key}=...  ({preset.requires[key]})" for key in missing)
        raise PresetError(f"preset {preset.name} needs values only you can give:\n{lines}")
    return merge(merge(base, preset.params()), sets)


def set_args(values: dict[str, Any]) -> list[str]:
    """``-S key=value`` pairs for ``dvc exp run`` (values in one-line YAML flow style), one per leaf."""
    import yaml

    args = []
    for key, value in flatten(values).items():
        text = yaml.safe_dump(value, default_flow_style=True, width=float("inf")).strip()
        text = text.removesuffix("...").strip()
        args += ["-S", f"{key}={text}"]
    return args


def shell_line(args: list[str]) -> str:
    """``args`` quoted for a POSIX shell (and for ``xargs``)."""
    return " ".join(shlex.quote(a) for a in args)


def flow_dump(value: Any) -> str:
    """``value`` as one line of YAML flow style (``[1, 2]``, ``{a: 1}``, ``0.5``)."""
    import yaml

    text = yaml.safe_dump(value, default_flow_style=True, width=float("inf")).strip()
    return text.removesuffix("...").strip()


def describe(preset: Preset) -> str:
    """The preset as text: what it is, where every value comes from, what it cannot follow."""
    out = [f"{preset.name} (version {preset.version}): {preset.title}", f"  paper's result: {preset.paper}",
           f"  objective: {preset.objective}"]
    for block in preset.blocks:
        out.append(f"  from {block['source']}:")
        out += [f"    {key} = {flow_dump(value)}" for key, value in flatten(block["params"]).items()]
    if preset.requires:
        out.append("  you give (--set KEY=VALUE):")
        out += [f"    {key}: {why}" for key, why in preset.requires.items()]
    if preset.deviations:
        out.append("  deviations from the paper:")
        out += [f"    - {d}" for d in preset.deviations]
    return "\n".join(out)
