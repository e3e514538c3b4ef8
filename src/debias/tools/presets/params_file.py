"""Applying a preset to ``params.yaml``: only the values that change are rewritten (comments, order and layout
of ``params.yaml`` stay byte for byte), the result is validated with the schema before anything is written, and
the file is replaced atomically: a symlinked ``params.yaml`` is written through (its target is replaced, in the
target's folder, and the link stays). A file that does not parse (a repeated key), uses YAML aliases the change
would break, is read-only or cannot be replaced (immutable, an unwritable folder) is a one-line
:class:`~debias.tools.presets.catalog.PresetError`, and nothing is written.
"""

from __future__ import annotations

import errno
import os
import re
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from debias.core.errors import ParamsError
from debias.core.trees import flatten, unflatten
from debias.tools.presets.catalog import Preset, PresetError, compose, flow_dump


# --------------------------------------------------------------------------- rewriting params.yaml in place


def _value_end(lines: list[str], line: int, col: int, in_flow: bool, where: str = "params.yaml") -> tuple[int, int]:
    """(line, column) just past the value that starts at (line, col): a bracketed flow value up to its closing
    bracket, a scalar up to its comment / line end (inside a flow collection: up to ',' or the closing bracket);
    ``where`` names the file in errors."""
    text = lines[line]
    if col < len(text) and text[col] in "[{":
        depth, quote = 0, ""
        for ln in range(line, len(lines)):
            start = col if ln == line else 0
            for c in range(start, len(lines[ln])):
                ch = lines[ln][c]
                if quote:
                    quote = "" if ch == quote else quote
                elif ch in "'\"":
                    quote = ch
                elif ch in "[{":
                    depth += 1
                elif ch in "]}":
                    depth -= 1
                    if depth == 0:
                        return ln, c + 1
        raise PresetError(f"{where} line {line + 1}: unclosed '{text[col]}'")
    end = len(text)
    if col < len(text) and text[col] in "'\"":
        close = text.find(text[col], col + 1)
        return line, (close + 1 if close > 0 else end)
    stops = [m.start() for m in re.finditer(r"\s#", text[col:])]
    if in_flow:
        stops += [m.start() for m in re.finditer(r"[,\]}]", text[col:])]
    if stops:
        end = col + min(stops)
    while end > col and text[end - 1] == " ":
        end -= 1
    return line, end


def _replace(lines: list[str], start: tuple[int, int], end: tuple[int, int], new: str) -> None:
    """Put ``new`` in place of the span; on one line, the spaces before an inline comment absorb the change in
    length (at least two stay), so comments keep their column where they can."""
    (l0, c0), (l1, c1) = start, end
    head, tail = lines[l0][:c0], lines[l1][c1:]
    if l0 == l1 and tail.lstrip(" ").startswith("#"):
        gap = len(tail) - len(tail.lstrip(" "))
        want = max(2, gap - (len(new) - (c1 - c0)))
        tail = " " * want + tail.lstrip(" ")
    lines[l0:l1 + 1] = [head + new + tail]


def _empty_value(lines: list[str], key_at: tuple[int, int], key: str) -> tuple[int, int] | None:
    """Where the value of ``key`` (at ``key_at``) goes when it is written empty (``key:`` alone or before a comment,
    as DVC writes null): right after the colon; None when the key's line holds a value."""
    line, col = key_at
    text = lines[line]
    colon = col + len(key)
    if text[colon:colon + 1] != ":":
        return None
    rest = text[colon + 1:].lstrip(" ")
    return (line, colon + 1) if rest == "" or rest.startswith("#") else None


def _starts_flow(lines: list[str], line: int, col: int) -> bool:
    """Whether the value written at (line, col) is a flow collection ([...] or {...}, empty ones included)."""
    return line < len(lines) and col < len(lines[line]) and lines[line][col] in "[{"


def _subtree_last_line(node: Any, lines: list[str], where: str = "params.yaml") -> int:
    """The last line a mapping / sequence node occupies (0-based); ``where`` names the file in errors."""
    from ruamel.yaml.comments import CommentedMap, CommentedSeq

    last = node.lc.line
    if isinstance(node, CommentedMap):
        for key in node:
            kl, _ = node.lc.key(key)
            vl, vc = node.lc.value(key)
            last = max(last, kl)
            child = node[key]
            if isinstance(child, (CommentedMap, CommentedSeq)):
                if _starts_flow(lines, vl, vc):
                    last = max(last, _value_end(lines, vl, vc, False, where)[0])
                else:
                    last = max(last, _subtree_last_line(child, lines, where))
            elif child is None and _empty_value(lines, (kl, node.lc.key(key)[1]), str(key)) is not None:
                last = max(last, kl)  # `key:` written empty (DVC's null): ruamel places its value on the next token
            else:
                last = max(last, vl)
    elif isinstance(node, CommentedSeq):
        for i in range(len(node)):
            il, ic = node.lc.item(i)
            last = max(last, il)
            child = node[i]
            if isinstance(child, (CommentedMap, CommentedSeq)):  # nested lists (block lists of lists, as DVC writes)
                if _starts_flow(lines, il, ic):
                    last = max(last, _value_end(lines, il, ic, False, where)[0])
                else:
                    last = max(last, _subtree_last_line(child, lines, where))
    return last


def _block_lines(key: str, value: Any, indent: int) -> list[str]:
    if isinstance(value, dict) and value:
        out = [" " * indent + f"{key}:"]
        for k, v in value.items():
            out += _block_lines(k, v, indent + 2)
        return out
    return [" " * indent + f"{key}: {flow_dump(value)}"]


def _block_body(key: str, value: Any, indent: int) -> list[str]:
    """The lines under ``key:`` of ``value`` in block style, as ruamel (and so ``dvc exp run -S``) writes them,
    indented by ``indent``."""
    import io

    from ruamel.yaml import YAML

    yaml = YAML()
    yaml.default_flow_style = False
    buffer = io.StringIO()
    yaml.dump({key: value}, buffer)
    return [" " * indent + line for line in buffer.getvalue().rstrip("\n").split("\n")[1:]]


def rewrite(text: str, changes: dict[str, Any], where: str = "params.yaml") -> str:
    """``text`` (a YAML mapping in block style) with the leaves of ``changes`` set: existing values are replaced
    where they stand, missing keys are appended to their section; every other byte stays. ``where`` names the
    file in errors.

    One parse places every replacement up to the next missing key; they are applied from the end of the file
    backwards, so each keeps the place the parse gave it. An insertion moves lines, so the text is parsed again
    after each."""
    from ruamel.yaml.comments import CommentedMap

    lines = text.split("\n")
    pending = list(flatten(changes).items())
    while pending:
        doc = _load_yaml("\n".join(lines), f"{where} as rewritten", typ="rt")
        if doc is None:
            doc = CommentedMap()
        edits: list[tuple[tuple[int, int], Callable[[], None]]] = []
        for dotted, value in pending:
            node, parts, depth = _walk(doc, dotted, where)
            if parts[depth] not in node:
                break
            edits.append(_replacement(node, parts[depth], value, lines, where))
        if edits:
            for _, apply in sorted(edits, key=lambda edit: edit[0], reverse=True):
                apply()
            pending = pending[len(edits):]
        else:
            dotted, value = pending.pop(0)
            _insert(doc, *_walk(doc, dotted, where), value, lines, where)
    return "\n".join(lines)


def _walk(doc: Any, dotted: str, where: str) -> tuple[Any, list[str], int]:
    """``(node, parts, depth)``: the mapping holding the leaf ``dotted`` (``parts[depth]`` is its last part), or the
    one where its first missing part ``parts[depth]`` goes."""
    from ruamel.yaml.comments import CommentedMap

    parts = dotted.split(".")
    node = doc
    for depth, part in enumerate(parts):
        if not isinstance(node, CommentedMap):
            raise PresetError(f"{where}: {'.'.join(parts[:depth])} is not a mapping, cannot set {dotted}")
        if part not in node or depth == len(parts) - 1:
            return node, parts, depth
        node = node[part]
    raise AssertionError("unreachable: the loop returns at the last part")


def _insert(doc: Any, node: Any, parts: list[str], depth: int, value: Any, lines: list[str], where: str) -> None:
    """Append the missing ``parts[depth]`` (with the rest of the path under it, then ``value``) to ``node``."""
    rest = unflatten({".".join(parts[depth + 1:]): value}) if depth < len(parts) - 1 else value
    if node is doc:
        insert_at, indent = len(lines) - (1 if lines and lines[-1] == "" else 0), 0
    else:
        if node.fa.flow_style():
            raise PresetError(f"{where}: {'.'.join(parts[:depth])} is written in flow style {{...}}; "
                              f"set {'.'.join(parts)} there by hand")
        insert_at = _subtree_last_line(node, lines, where) + 1
        indent = node.lc.key(next(iter(node)))[1] if len(node) else 2 * depth
    lines[insert_at:insert_at] = _block_lines(parts[depth], rest, indent)


def _replacement(node: Any, key: str, value: Any, lines: list[str],
                 where: str) -> tuple[tuple[int, int], Callable[[], None]]:
    """Where the value of ``node[key]`` starts, and the edit of ``lines`` that writes ``value`` in its place."""
    from ruamel.yaml.comments import CommentedMap, CommentedSeq

    child = node[key]
    vl, vc = node.lc.value(key)
    empty = _empty_value(lines, node.lc.key(key), key) if child is None else None
    if empty is not None:  # `key:` written empty (DVC's null)
        return empty, lambda: _replace(lines, empty, empty, " " + flow_dump(value))
    if isinstance(child, (CommentedMap, CommentedSeq)) and not _starts_flow(lines, vl, vc):
        kl, kc = node.lc.key(key)  # a block collection (as dvc exp run -S writes lists): its lines anew
        last = _subtree_last_line(child, lines, where)

        def block() -> None:
            lines[kl + 1:last + 1] = _block_body(key, value, kc)
        return (kl + 1, 0), block
    end = _value_end(lines, vl, vc, bool(node.fa.flow_style()), where)
    return (vl, vc), lambda: _replace(lines, (vl, vc), end, flow_dump(value))


def _load_yaml(text: str, where: str, typ: str = "safe") -> Any:
    """``text`` parsed (ruamel, YAML 1.2 as DVC reads params.yaml); a parse error (a repeated key, an undefined
    alias, bad syntax) is a one-line PresetError naming ``where`` and the place."""
    from ruamel.yaml import YAML

    try:
        return YAML(typ=typ, pure=True).load(text)
    except Exception as exc:  # ruamel's YAMLError, DuplicateKeyError, ComposerError, ...
        lines = [line.strip().replace('in "<unicode string>", ', "") for line in str(exc).splitlines()
                 if line.strip() and not line.strip().startswith("^") and "yaml.dev" not in line
                 and "suppress this check" not in line]
        raise PresetError(f"{where} is not valid YAML ({type(exc).__name__}): " + " | ".join(lines[:6])[:600]
                          + "; nothing written") from None


def _aliases(text: str) -> list[str]:
    """The anchors (``&name``) and aliases (``*name``) of ``text``, each with its line, in order."""
    from ruamel.yaml import YAML
    from ruamel.yaml.events import AliasEvent

    found = []
    for event in YAML(typ="rt", pure=True).parse(text):
        anchor = getattr(event, "anchor", None)
        if anchor:
            sign = "*" if isinstance(event, AliasEvent) else "&"
            found.append(f"{sign}{anchor} (line {event.start_mark.line + 1})")
    return found


@dataclass(frozen=True)
class Applied:
    text: str  # the new params.yaml
    changes: dict[str, tuple[Any, Any]]  # dotted key -> (old, new); old is None where the key was absent


def plan_apply(text: str, preset: Preset, sets: dict[str, Any] | None = None, where: str = "params.yaml") -> Applied:
    """The new params.yaml text for ``preset`` (and ``sets``) over ``text`` (the file ``where``, named in errors);
    validated, nothing written.

    Raises PresetError when the composition fails the schema or the rewritten text would not read back as it."""
    from debias.schema import validate

    base = _load_yaml(text, where) or {}
    if not isinstance(base, dict):
        raise PresetError(f"{where} holds a {type(base).__name__}, not a mapping of sections; nothing written")
    target = compose(base, preset, sets)
    try:
        validate(target)
    except ParamsError as exc:
        raise PresetError(f"preset {preset.name} (version {preset.version}) does not compose into valid params; "
                          f"nothing written:\n{str(exc).replace('invalid params.yaml:', f'invalid {where}:', 1)}") from None
    old, new = flatten(base), flatten(target)
    changes = {k: (old.get(k), v) for k, v in new.items() if k not in old or old[k] != v
               or type(old[k]) is not type(v)}
    aliases = _aliases(text) if changes else []
    try:
        rewritten = rewrite(text, unflatten({k: v for k, (_, v) in changes.items()}), where) if changes else text
        ok = _load_yaml(rewritten, f"{where} as rewritten") == target  # the surgery must yield the composition
    except PresetError as exc:
        if not aliases:
            raise
        ok, why = False, str(exc)
    if not ok:
        if aliases:
            raise PresetError(f"preset {preset.name}: {where} shares values through YAML anchors and aliases "
                              f"({', '.join(aliases[:6])}), which rewriting the changed values in place would "
                              "break; write those values out instead of the alias, then apply again; nothing written")
        raise PresetError(f"preset {preset.name}: {where} could not be rewritten in place; nothing written")
    return Applied(rewritten, changes)


def read_params(path: Path) -> str:
    """The text of ``path`` (through a symlink: its target's); missing, unreadable or not UTF-8 is a PresetError."""
    if not path.is_file():
        raise PresetError(f"{path} not found: run from the repository root or give --params")
    try:
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PresetError(f"{path} is not UTF-8 text (byte offset {exc.start}); save it as UTF-8") from None
    except OSError as exc:
        raise PresetError(f"{path} cannot be read ({exc.strerror or exc})") from None


def write_atomic(path: Path, text: str) -> Path:
    """Replace ``path`` with ``text`` in one step (a temporary file in its folder, then os.replace) and return the
    file written. A symlink is written through: its target is replaced (the temporary file in the target's folder)
    and the link stays. A read-only file, or one that cannot be replaced (immutable, an unwritable folder), is a
    PresetError and the file is left as it was."""
    target = Path(os.path.realpath(path))
    shown = str(path) if target == path.absolute() else f"{path} (a link to {target})"
    if target.exists() and not target.stat().st_mode & 0o222:
        raise PresetError(f"{shown} is read-only (mode {target.stat().st_mode & 0o777:o}); make it writable "
                          "(chmod u+w) to apply a preset; nothing written")
    if target.exists() and not os.access(target, os.W_OK):
        raise PresetError(f"{shown} cannot be written (not yours, or an immutable file: lsattr shows it, chattr -i "
                          "clears it); nothing written")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    except OSError as exc:
        raise PresetError(f"{shown} cannot be replaced: its folder {target.parent} is not writable "
                          f"({exc.strerror or exc}); nothing written") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as handle:
            handle.write(text)
        if target.exists():
            os.chmod(tmp, target.stat().st_mode & 0o7777)
        os.replace(tmp, target)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        hint = " (an immutable file? lsattr shows it, chattr -i clears it)" if exc.errno == errno.EPERM else ""
        raise PresetError(f"{shown} cannot be replaced ({exc.strerror or exc}){hint}; nothing written") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target
