"""``dvc exp run -S`` overrides checked before a run, without touching params.yaml.

DVC applies ``-S key=value`` by rewriting params.yaml in the workspace, and a run that then fails leaves the value
there. :func:`override_files` applies the same overrides with DVC's own code (``dvc.utils.hydra``: Hydra's
override grammar, sweeps such as ``loss.epsilon=0,0.25`` or ``range(...)`` expanded into one combination each,
as ``dvc exp run --queue -S`` does) to copies of the file in a temporary folder, so each copy can be validated
like params.yaml itself and the original stays byte-identical.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from debias.params import ParamsError


def sweep_sizes(overrides: list[str], limit: int) -> dict[str, tuple[int, bool]]:
    """Key -> (number of values, whether exact) of each sweep among ``overrides`` (``seed=range(0,1000000)``:
    (1000000, True)), counted without listing them: a range by its bounds, a list up to ``limit + 1`` values (then
    not exact); plain and malformed overrides are left to DVC's parser."""
    import itertools

    from hydra.core.override_parser.overrides_parser import OverridesParser

    from debias.tools.sweep.grid import range_length

    sizes: dict[str, tuple[int, bool]] = {}
    parser = OverridesParser.create()
    for text in overrides:
        try:
            override = parser.parse_override(text)
            if override.is_sweep_override():
                exact = range_length(override)
                counted = exact if exact is not None else sum(
                    1 for _ in itertools.islice(override.sweep_iterator(), limit + 1))
                sizes[override.key_or_group] = (counted, exact is not None or counted <= limit)
        except Exception:  # hydra's OverrideParseException, a glob sweep: get_hydra_sweeps names it
            continue
    return sizes


def override_sets(items: list[str], params_file: str = "params.yaml", limit: int | None = None) -> list[list[str]]:
    """The override lists of every combination ``items`` (``-S`` values) expand to; DVC's grouping by file
    (``file.yaml:key=value``) and sweep expansion. Overrides of another file than ``params_file`` are refused
    (the pipeline reads only params.yaml); a malformed override is a ParamsError naming it, and so are more than
    ``limit`` combinations (default :data:`~debias.tools.sweep.grid.MAX_POINTS`, a sweep's cap), counted before
    any is listed."""
    import math

    from dvc.utils.cli_parse import to_path_overrides
    from dvc.utils.hydra import get_hydra_sweeps

    from debias.tools.sweep.grid import MAX_POINTS

    limit = MAX_POINTS if limit is None else limit

    by_file = to_path_overrides(items)  # an override without a file prefix is DVC's default, params.yaml
    targets = {"params.yaml", params_file}
    others = sorted(name for name in by_file if name not in targets)
    if others:
        raise ParamsError(f"-S for {', '.join(others)}: the pipeline reads only {params_file}; allowed: -S key=value "
                          f"or -S {params_file}:key=value")
    merged = [override for name, overrides in by_file.items() if name in targets for override in overrides]
    sizes = sweep_sizes(merged, limit)
    total = math.prod(n for n, _ in sizes.values())
    if total > limit:
        counts = ", ".join(f"{key}: {n if exact else f'more than {limit}'} values" for key, (n, exact) in sizes.items())
        shown = total if all(exact for _, exact in sizes.values()) else f"more than {limit}"
        raise ParamsError(f"-S {' -S '.join(items)}: {shown} combinations ({counts}), more than "
                          f"{limit} (each is one experiment); nothing was checked: give fewer values (a range meant "
                          "as a list?)")
    try:
        sweeps = get_hydra_sweeps({params_file: merged})
    except Exception as exc:  # hydra's OverrideParseException, DVC's InvalidArgumentError (glob sweeps)
        raise ParamsError(f"-S {' '.join(items)}: not a valid override ({_cause(exc)}); allowed: key=value, "
                          "key=v1,v2 (a sweep), +key=value (a new key), ~key (delete)") from None
    return [sweep[params_file] for sweep in sweeps]


def _cause(exc: BaseException) -> str:
    """The innermost message of a chained exception, on one line."""
    while exc.__cause__ is not None:
        exc = exc.__cause__
    return " ".join(str(exc).split()) or type(exc).__name__


def _override_key(override: str) -> str:
    """The dotted key of one override: ``+loss.epsilon=1`` -> ``loss.epsilon``, ``~seed`` -> ``seed``."""
    return override.split("=", 1)[0].lstrip("+~").strip()


def refusal(exc: BaseException, overrides: list[str], params_file: str = "params.yaml") -> str:
    """DVC's refusal of ``overrides`` as one line. A key params.yaml does not hold (DVC sets only existing keys
    without ``+``) starts the line, with the closest known key: ``unknown parameter 'loss.epsiln'; did you mean
    'loss.epsilon'? (-S loss.epsiln=0.3; ...)``, never OmegaConf's ``Key ... is not in struct`` internals. The key
    named is the override's whole key (``lss.epsilon``, where OmegaConf names only the missing section ``lss``). A key
    the schema has but ``params_file`` leaves out (a method's section not stated) is said to be so, with how to add
    it, never "did you mean" itself."""
    import difflib
    import re

    from debias.schema import valid_keys

    given = f"-S {' -S '.join(overrides)}"
    found = re.search(r"full_key: (\S+)", _cause(exc))
    if found is None:
        return f"{given}: {_cause(exc)}"
    keys = [_override_key(o) for o in overrides]
    key = next((k for k in keys if k == found[1]), None) or next(
        (k for k in keys if k.startswith(found[1] + ".")), found[1])
    known = valid_keys()
    if key in known:  # a param of the schema the file leaves out: nothing to suggest but stating it
        return (f"'{key}' is a parameter {params_file} does not state ({given}); add it to {params_file}, or set it "
                f"with -S +{key}=VALUE")
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    return (f"unknown parameter '{key}'" + (f"; did you mean '{close[0]}'?" if close else "")
            + f" ({given}; +key=value adds a key params.yaml does not hold)")


@contextlib.contextmanager
def override_files(path: str | Path, items: list[str]) -> Iterator[list[tuple[list[str], Path | ParamsError]]]:
    """For each combination of ``items``: its overrides and a temporary copy of ``path`` with them applied by DVC
    (or the ParamsError DVC's refusal became, e.g. an unknown key set without ``+``). ``path`` is only read."""
    from dvc.utils.hydra import apply_overrides

    path = Path(path)
    if not path.exists():
        raise ParamsError(f"{path} not found: run from the repository root or name the params file")
    with tempfile.TemporaryDirectory(prefix="debias-check-params-") as folder:
        results: list[tuple[list[str], Path | ParamsError]] = []
        for index, overrides in enumerate(override_sets(items, path.name)):
            copy = Path(folder) / str(index) / path.name
            copy.parent.mkdir()
            shutil.copyfile(path, copy)
            try:
                apply_overrides(copy, overrides)
            except Exception as exc:  # DVC's InvalidArgumentError around hydra's ConfigCompositionException
                results.append((overrides, ParamsError(refusal(exc, overrides, path.name))))
                continue
            results.append((overrides, copy))
        yield results
