"""The report's params tables: what this run changed against the committed params.yaml, and where the committed
params depart from the papers' settings (the schema's defaults) with the reason params.yaml's comment gives.

Both list only params that apply to the run (:mod:`debias.schema.applicability`). The committed file is
``git show HEAD:params.yaml`` in the report's root; outside git (an exported tree) or without a commit the first
table says it cannot be built.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any


from debias.params import Params, as_dict, flatten, parse_yaml
from debias.schema import schema, validate
from debias.schema.applicability import RunContext, applies

PARAMS_FILE = "params.yaml"
_KEY = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z_][\w-]*):(?P<rest>.*)$")


def committed_text(root: Path, name: str = PARAMS_FILE) -> tuple[str | None, str]:
    """``(text of HEAD:<name>, where it came from: the command and the commit)``, or ``(None, why not)`` when git or
    the commit is missing. Git is no dep DVC tracks: the report names the commit, so one built before a later
    commit says which commit it compared with."""
    try:
        done = subprocess.run(["git", "show", f"HEAD:{name}"], cwd=root, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as error:
        return None, f"git is not available ({error})"
    if done.returncode != 0:
        last = ((done.stderr or done.stdout).strip().splitlines() or ["no output"])[-1]
        return None, f"`git show HEAD:{name}` failed ({last[:200]})"
    commit = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=root, capture_output=True, text=True,
                            timeout=60).stdout.strip()
    return done.stdout, f"`git show HEAD:{name}`, commit {commit}"


def _inline_comment(rest: str) -> tuple[str, int | None]:
    """The comment of a YAML value (text, column within ``rest``): the first '#' after whitespace outside quotes."""
    quote = None
    for i, ch in enumerate(rest):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or rest[i - 1].isspace()):
            return rest[i + 1:].strip(), i
    return "", None


def yaml_comments(text: str) -> dict[str, str]:
    """Dotted key -> its comment in a params.yaml text, every key in file order ('' without a comment): the
    comment lines right above the key and the comment after its value (with the lines continuing it, aligned
    under it), joined."""
    comments: dict[str, list[str]] = {}
    stack: list[tuple[int, str]] = []  # (indent, key) of the open sections
    pending: list[str] = []  # comment lines waiting for the next key
    last_key, last_column = None, None  # the previous key and the column of its inline comment
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            column = len(line) - len(line.lstrip())
            if last_key is not None and column == last_column:
                comments[last_key].append(stripped[1:].strip())
            else:
                pending.append(stripped[1:].strip())
            continue
        match = _KEY.match(line)
        if not match:  # a continued value (a list over lines) or a blank line
            if not stripped:
                pending, last_column = [], None
            continue
        indent = len(match["indent"])
        while stack and stack[-1][0] >= indent:
            stack.pop()
        dotted = ".".join([*(k for _, k in stack), match["key"]])
        stack.append((indent, match["key"]))
        inline, at = _inline_comment(match["rest"])
        comments.setdefault(dotted, []).extend([*pending, *([inline] if inline else [])])
        pending = []
        last_key = dotted
        last_column = None if at is None else indent + len(match["key"]) + 1 + at
    return {key: " ".join(lines) for key, lines in comments.items()}


def reason(key: str, comments: dict[str, str]) -> str:
    """The comment of ``key``; else of the nearest key above it in its section (a comment block above a
    section's first key usually explains the next few); else the same for the enclosing section; '' if none."""
    keys = list(comments)
    while key:
        if comments.get(key):
            return comments[key]
        parent = key.rpartition(".")[0]
        if key in keys:
            siblings = [k for k in keys[: keys.index(key)] if k.rpartition(".")[0] == parent and comments[k]]
            if siblings:
                return comments[siblings[-1]]
        key = parent
    return ""


@dataclass(frozen=True)
class ParamChange:
    """One param whose value differs between two settings."""

    key: str
    value: Any
    base: Any
    reason: str = ""


def differing(ours: Params, base: Params, context: RunContext) -> tuple[list[ParamChange], list[str]]:
    """(params of ``ours`` that differ from ``base`` and apply to the run, keys that differ but do not apply)."""
    mine, theirs = flatten(as_dict(ours)), flatten(as_dict(base))
    keys = [k for k, v in mine.items() if theirs.get(k) != v]
    return ([ParamChange(k, mine[k], theirs.get(k)) for k in keys if applies(k, context)],
            [k for k in keys if not applies(k, context)])


def committed_params(text: str) -> Params:
    """The params of a committed params.yaml text (validated by the schema), parsed as DVC parses it (YAML 1.2:
    ``1e-3`` is a number, as in the stages)."""
    return validate(parse_yaml(text.encode("utf-8"), Path("params.yaml")) or {})


def departures(committed: Params, text: str, context: RunContext) -> tuple[list[ParamChange], list[str]]:
    """Where the committed params depart from the schema defaults (the papers' settings), each with the reason
    from the committed file's comments; and the departing keys that do not apply to the run."""
    comments = yaml_comments(text)
    found, skipped = differing(committed, schema()(), context)
    return [ParamChange(c.key, c.value, c.base, reason(c.key, comments)) for c in found], skipped
