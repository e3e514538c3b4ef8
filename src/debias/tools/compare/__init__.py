"""``debias compare``: many experiments on one page, and a terminal table no wider than 160 characters.

One row per experiment (the params that differ between the experiments compared, the headline test metrics
of :mod:`debias.core.headline`, its warnings), then the same grouped by every differing param but the seed: mean
± sample standard deviation over the seeds and their count, ranked by stage-2 worst-group accuracy, with a
Welch t-test of each group against the best one ("is the difference real?"). The HTML page (self-contained:
inline CSS, figures as data URIs; it opens from disk, offline) adds the per-group accuracy heatmaps and the
validation curves of the runs compared, side by side, and every warning. Tables are pandas data frames;
figures are matplotlib, as the report's.

The experiments come from :mod:`debias.tools.compare.collect` (DVC's experiments and/or MLflow's pipeline runs); the
selection and statistics are :mod:`debias.tools.compare.data`'s, the terminal table
:mod:`debias.tools.compare.terminal`'s and the page :mod:`debias.tools.compare.page`'s; this module gathers,
writes and logs.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from pathlib import Path

from debias.params import ReportParams
from debias.tools.compare.collect import Experiment
from debias.tools.compare.data import (Comparison, build_comparison, check_filter_keys, comparable, duplicate_notes,
                                       rank_metric, select)
from debias.tools.compare.page import check_out, default_out, write_page
from debias.tools.compare.terminal import MAX_WIDTH, describe_without_results, terminal_text, wrap

MIN_WIDTH = 40  # ours: the narrowest --width accepted (a name column and one metric column)


def log_to_mlflow(comparison: Comparison, written: dict[str, Path], root: Path) -> str:
    """Log the page, tables and figures as one run of the MLflow experiment ``<experiment>-compare`` (its own
    experiment, so the pipeline experiment keeps one row per pipeline run). Follows ``DEBIAS_TRACKING``:
    ``off`` skips, ``optional`` warns on a failure, ``required`` raises it. Returns what happened, in words."""
    import os

    from debias.core.errors import TrackingError
    from debias.harness.tracking import (DEFAULT_EXPERIMENT, KIND_TAG, check_reachable, ensure_experiment, tracking_mode,
                                 tracking_uri)

    mode = tracking_mode()
    if mode == "off":
        return "not logged to MLflow (DEBIAS_TRACKING=off)"
    uri = tracking_uri(root)
    name = os.environ.get("MLFLOW_EXPERIMENT_NAME", DEFAULT_EXPERIMENT) + "-compare"
    try:
        check_reachable(uri)
        from mlflow.entities import Metric, Param
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=uri)
        experiment_id = ensure_experiment(uri, name, root)
        stamp = dt.datetime.now().isoformat(timespec="seconds")
        run_id = client.create_run(experiment_id, tags={
            "mlflow.runName": f"compare {stamp}", KIND_TAG: "compare", "debias.source": comparison.source,
            "debias.filters": comparison.filters or "none",
            "debias.experiments": ", ".join(e.name for e in comparison.experiments)[:5000]}).info.run_id
        client.log_batch(run_id, params=[Param("experiments", str(len(comparison.experiments))),
                                         Param("groups", str(len(comparison.groups))),
                                         Param("varying_params", ", ".join(comparison.params)[:6000] or "none")])
        rank = rank_metric(comparison.frame)
        if rank is not None and comparison.ranked:
            best = comparison.groups.iloc[0]
            client.log_batch(run_id, metrics=[Metric(f"best_{rank}_mean", float(best[f"{rank}_mean"]),
                                                     int(dt.datetime.now().timestamp() * 1000), 0)])
        for key, path in written.items():
            client.log_artifact(run_id, str(path), "compare/figures" if key.startswith("figure:") else "compare")
        client.set_terminated(run_id, "FINISHED")
    except Exception as exc:
        message = f"the comparison was not logged to MLflow store {uri}: {type(exc).__name__}: {str(exc)[:300]}"
        if mode == "required":
            raise TrackingError(message + " (DEBIAS_TRACKING=optional logs nothing and goes on)") from None
        return message
    return f"logged to MLflow experiment '{name}' as run {run_id}"


def workspace_report_params(root: Path) -> ReportParams:
    """The ``report`` section of ``root``'s params.yaml (the intervals' level; the page states it), the schema's
    defaults where the file is missing or does not validate."""
    from debias.schema import load_params

    try:
        return load_params(root / "params.yaml").report
    except (OSError, ValueError):
        return ReportParams()


MAX_MARGIN = 100.0  # points: accuracies differ by at most 100, so a margin of 100 or more calls every difference none


def check_margin(margin: float | None) -> None:
    """Refuse (ValueError, one line) a ``--margin`` that is not a number of points above 0 and below
    :data:`MAX_MARGIN`."""
    if margin is not None and not 0 < margin < MAX_MARGIN:
        raise ValueError(f"--margin {margin:g}; allowed: a number of points above 0 and below {MAX_MARGIN:g} "
                         f"(accuracies differ by at most {MAX_MARGIN:g}; e.g. 2: equivalence within ±2 "
                         "points of accuracy)")


def head_commit(root: Path) -> str | None:
    """``root``'s HEAD commit (``git rev-parse HEAD``), None outside git or before the first commit."""
    import subprocess

    done = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=60)
    return done.stdout.strip() if done.returncode == 0 else None


def other_commits(gathered: list[Experiment], by_commit: dict[str, list[tuple[str, str]]],
                  head: str | None) -> dict[str, list[str]]:
    """DVC's experiments of commits other than ``head`` that ``gathered`` lacks (``dvc exp show`` without ``-A``
    shows HEAD's only): short commit -> their names."""
    shown = {e.rev for e in gathered if e.rev}
    apart = {commit[:7]: [name for name, rev in found if rev not in shown]
             for commit, found in by_commit.items() if commit != head}
    return {commit: names for commit, names in apart.items() if names}


def with_experiments(gathered: list[Experiment], by_commit: dict[str, list[tuple[str, str]]],
                     head: str | None) -> tuple[list[Experiment], int]:
    """``gathered`` (``dvc exp show -A``: a baseline per commit) less the baselines of commits other than ``head``
    that have no experiment, and how many were left out: only experiments and their baselines are compared."""
    kept = [e for e in gathered if e.kind != "baseline" or e.rev == head or e.rev in by_commit]
    return kept, len(gathered) - len(kept)


def commit_count(experiments: list[Experiment], by_commit: dict[str, list[tuple[str, str]]], head: str | None) -> int:
    """How many commits ``experiments`` come from: an experiment's baseline commit, a baseline's own, the workspace's
    HEAD."""
    baseline_of = {rev: commit for commit, found in by_commit.items() for _, rev in found}
    return len({baseline_of.get(e.rev or "", e.rev) if e.kind != "workspace" else head for e in experiments})


def compare(root: Path, source: str = "dvc", method: str | None = None, param_filters: Iterable[str] = (),
            last: int | None = None, tags: dict[str, str] | None = None, out: Path | None = None,
            mlflow: bool = True, max_width: int = MAX_WIDTH, sweep: str | None = None,
            margin: float | None = None, all_commits: bool = False) -> tuple[Comparison, dict[str, Path], str]:
    """Gather, select, tabulate, write the page (``out``, default ``reports/compare``) and log it; returns the
    comparison, the files written and the terminal text. ``sweep``: only the experiments of that ``debias sweep``
    (its plan's names), so another experiment with other params is never ranked among its values. ``margin``
    (points): each verdict also tests equivalence within ±margin. ``all_commits``: DVC's experiments of every
    commit (``dvc exp show -A``); without it, those of other commits are counted and named in a note."""
    import os

    from debias.harness.tracking import DEFAULT_EXPERIMENT, tracking_mode, tracking_uri
    from debias.tools.compare import collect

    if last is not None and last < 1:
        raise ValueError(f"--last {last}; allowed: a whole number >= 1 (the most recent experiments to compare)")
    if max_width < MIN_WIDTH:
        raise ValueError(f"--width {max_width}; allowed: {MIN_WIDTH} or more characters")
    check_margin(margin)
    if all_commits and source == "mlflow":
        raise ValueError("--all-commits reads DVC's experiments of every commit; allowed with --source dvc or both "
                         "(MLflow's runs are not kept by commit)")
    page = out or default_out(root)
    check_out(page, own_folder=page.resolve() == default_out(root).resolve())  # before the slow gathering
    gathered: list[Experiment] = []
    borrowed = None
    elsewhere: dict[str, list[str]] = {}
    by_commit: dict[str, list[tuple[str, str]]] = {}
    head, commit_notes = None, []
    if source in ("dvc", "both"):
        gathered += collect.from_dvc(root, all_commits=True) if all_commits else collect.from_dvc(root)
        head = head_commit(root)
        try:
            by_commit = collect.experiments_by_commit(root)
        except Exception as exc:  # DVC could not list them: say so, compare what exp show gave
            commit_notes.append(f"other commits' experiments not counted (`dvc exp list -A` failed: "
                                f"{type(exc).__name__}: {str(exc)[:200]})")
        if all_commits:
            gathered, dropped = with_experiments(gathered, by_commit, head)
            if dropped:
                commit_notes.append(f"--all-commits: {dropped} commit{'s' if dropped != 1 else ''} without experiments "
                                    "left out")
        else:
            elsewhere = other_commits(gathered, by_commit, head)
        if tracking_mode() != "off":
            borrowed = collect.baseline_from_mlflow(
                gathered, tracking_uri(root), os.environ.get("MLFLOW_EXPERIMENT_NAME", DEFAULT_EXPERIMENT))
    if source in ("mlflow", "both"):
        gathered += collect.from_mlflow(tracking_uri(root), os.environ.get("MLFLOW_EXPERIMENT_NAME", DEFAULT_EXPERIMENT),
                                        tags)
    if sweep is not None:
        from debias.tools.sweep.workspace import load_state

        members = {job["name"] for job in load_state(root, sweep)["jobs"]}
        gathered = [e for e in gathered if e.name in members]
    filters = "; ".join(filter(None, [f"--sweep {sweep}" if sweep else "", "--all-commits" if all_commits else "",
                                      f"--margin {margin:g}" if margin is not None else "",
                                      f"--method {method}" if method else "",
                                      *(f"--param {p}" for p in param_filters), f"--last {last}" if last else "",
                                      *(f"--tag {k}={v}" for k, v in (tags or {}).items())]))
    check_filter_keys(gathered, param_filters)
    chosen = select(gathered, method, param_filters, last)
    if not chosen:
        with_results = [e.name for e in gathered if comparable(e)]
        raise ValueError(f"no experiment to compare ({source}{'; ' + filters if filters else ''}): "
                         + (f"those with results are {', '.join(with_results)}" if with_results else
                            "none has results yet (run `dvc repro` or `dvc exp run`)"
                            + (f"; {describe_without_results(gathered)}" if gathered else ""))
                         + (f"; {sum(map(len, elsewhere.values()))} experiments of other commits are not shown: "
                            "--all-commits compares them" if elsewhere else ""))
    collect.progress(f"reading the warnings and figures' files of {len(chosen)} experiments")
    for experiment in chosen:
        experiment.load_notes()
    comparison = build_comparison(chosen, gathered, source, filters, margin)
    comparison.other_commits = elsewhere
    comparison.sweep = sweep
    commits = commit_count(comparison.experiments, by_commit, head) if all_commits else 1
    if commits > 1:
        commit_notes.insert(0, f"--all-commits: experiments of {commits} commits compared together; the code may "
                               "differ between commits, not only the params shown")
    if borrowed and any(e.kind == "baseline" for e in comparison.experiments):
        comparison.notes.insert(0, borrowed)
    comparison.notes += duplicate_notes(gathered, method, param_filters) + commit_notes
    text = terminal_text(comparison, max_width)
    written = write_page(comparison, page, own_folder=page.resolve() == default_out(root).resolve(),
                         report=workspace_report_params(root))
    logged = log_to_mlflow(comparison, written, root) if mlflow else "not logged to MLflow (--no-mlflow)"
    text += "\n".join(wrap(f"page: {written['html']} (opens offline); {logged}", max_width)) + "\n"
    return comparison, written, text
