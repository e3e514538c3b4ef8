"""Gather experiments for ``debias compare``: DVC's experiments (``dvc exp show --json``: the workspace, the
baseline commit, its experiments, queued, running and failed ones) and/or MLflow's pipeline parent runs.

Every experiment becomes one :class:`Experiment`: its flat params, its headline metrics
(:mod:`debias.core.headline`), its warnings and model-selection blocks, and a reader of its other files (per-group
accuracy tables, validation curves) for the figures. DVC experiments are read from DVC's cache at their
revision (``Repo.switch``), the workspace from disk; MLflow runs from the parent run (params, metrics, tags)
and the artifacts its stage runs logged (``outputs/<path>``).
"""

from __future__ import annotations

import csv
import functools
import io
import json
import math
import os
import subprocess
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from debias.core import headline, paths
from debias.core.errors import NEEDS_BIAS_LABELS
from debias.params import flatten
from debias.tools.compare.columns import METRIC_KEYS
from debias.tools.compare.stale import is_within, rerun_command, stale_outputs, stale_stages

GROUP_FILES = {"erm": paths.METRICS / "erm_groups.json", "stage2": paths.METRICS / "stage2_train_groups.json"}
CURVE_FILES = {"erm": paths.PLOTS / "erm_curves.csv", "stage2": paths.PLOTS / "stage2_curves.csv"}
# Every file the comparison reads of an experiment (warnings, selection, figures), fetched together.
DETAIL_FILES = (*headline.DETAILED.values(), *(p for ps in headline.EXTRA_WARNING_FILES.values() for p in ps),
                *GROUP_FILES.values(), *CURVE_FILES.values())
HEADLINE_FILES = {str(headline.headline_path(stage)): stage for stage in headline.STAGES}


@dataclass
class Experiment:
    """One pipeline run to compare."""

    name: str
    kind: str  # workspace | baseline | experiment | mlflow
    params: dict[str, Any]  # flat (``loss.epsilon``), lists as JSON strings
    metrics: dict[str, float]  # headline keys
    status: str = "done"  # done | queued | running | failed | no results
    rev: str | None = None
    timestamp: str | None = None  # ISO 8601
    warnings: dict[str, list[str]] = field(default_factory=dict)
    selection: dict[str, dict[str, Any]] = field(default_factory=dict)
    run_id: str | None = None  # the MLflow parent run
    reader: Callable[[Path], str | None] | None = field(default=None, repr=False)  # a file of this run, as text
    rejected: dict[str, str] = field(default_factory=dict)  # headline keys whose value is not a number (NaN, text)
    metric_stages: dict[str, str] = field(default_factory=dict)  # headline key -> the stage that wrote it
    stale: dict[str, str] = field(default_factory=dict)  # stage -> why its outputs are another run's (blanked)
    blanked: set[str] = field(default_factory=set)  # output paths of the stale stages: never read
    baseline_params: dict[str, Any] | None = None  # an experiment's baseline commit's params (the rerun command)
    reason: str = ""  # why it has no results (or which are blank), in words
    fix: str = ""  # the command that gives it results

    @property
    def has_results(self) -> bool:
        return bool(self.metrics)

    def read_json(self, path: Path) -> Any | None:
        text = self.reader(path) if self.reader else None
        try:
            return json.loads(text) if text else None
        except ValueError:
            return None

    def read_curves(self, path: Path) -> dict[str, list[float]] | None:
        text = self.reader(path) if self.reader else None
        if not text:
            return None
        rows = list(csv.DictReader(io.StringIO(text)))
        unlabelled = {key for row in rows for key, value in row.items() if value == NEEDS_BIAS_LABELS}  # no curve
        columns: dict[str, list[float]] = {}
        for row in rows:
            for key, value in row.items():
                if key not in unlabelled:
                    columns.setdefault(key, []).append(float(value) if value not in ("", None) else float("nan"))
        return columns

    def load_notes(self) -> None:
        """Warnings and selection blocks from the run's detailed metrics files (skipped when already known)."""
        if self.reader is None or self.warnings or self.selection:
            return
        if hasattr(self.reader, "prefetch"):
            self.reader.prefetch(DETAIL_FILES)
        documents = headline.stage_documents(self.read_json)
        self.warnings = headline.collect_warnings(documents)
        self.selection = headline.collect_selection(documents)


# --------------------------------------------------------------------------- DVC


def dvc_env() -> dict[str, str]:
    """The environment for DVC subprocesses: no stage variables inherited."""
    return {k: v for k, v in os.environ.items() if not k.startswith("DVC_")}


def dvc_exp_show(root: Path, all_commits: bool = False) -> list[dict[str, Any]]:
    """``dvc exp show --json`` in ``root`` (``-A``: every commit's experiments, not only HEAD's); a DVC failure raises
    RuntimeError with its message."""
    command = ["dvc", "exp", "show", "--json", *(["-A"] if all_commits else [])]
    done = subprocess.run(command, cwd=root, env=dvc_env(), capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"`{' '.join(command)}` failed in {root}: {(done.stderr or done.stdout).strip()[-1500:]}")
    text = done.stdout.strip()
    return json.loads(text[text.index("["):]) if "[" in text else []


def is_number(value: Any) -> bool:
    """A finite-or-infinite real number a mean can take: not NaN, not text, not a boolean, not None."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value)


def _headline_values(data: dict[str, Any]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for path, entry in (data.get("metrics") or {}).items():
        if path in HEADLINE_FILES and isinstance(entry, dict):
            values.update(entry.get("data") or {})
    return values


def _metric_stages(data: dict[str, Any]) -> dict[str, str]:
    """Headline key -> the stage whose headline file holds it."""
    return {key: HEADLINE_FILES[path] for path, entry in (data.get("metrics") or {}).items()
            if path in HEADLINE_FILES and isinstance(entry, dict) for key in (entry.get("data") or {})}


def kept_value(value: Any) -> bool:
    """A headline value compare keeps: a number, or the needs-bias-labels marker (shown as it is, never averaged)."""
    return is_number(value) or value == NEEDS_BIAS_LABELS


def _headline_metrics(data: dict[str, Any]) -> dict[str, float | str]:
    return {k: v for k, v in _headline_values(data).items() if kept_value(v)}


def rejected_values(values: dict[str, Any]) -> dict[str, str]:
    """Headline values that are not numbers (NaN, text, ...), shown: left out of every mean, with a note (the
    needs-bias-labels marker is no rejected value: compare shows it in its column)."""
    return {k: ("NaN" if isinstance(v, float) else repr(v)[:40]) for k, v in values.items() if not kept_value(v)}


def tagged_needs_bias_labels(tags: dict[str, str]) -> dict[str, str]:
    """The headline keys a run's ``debias.needs_bias_labels`` tag names (``key, key: needs bias labels``), each
    with the marker: MLflow holds no number for them."""
    text = tags.get("debias.needs_bias_labels", "")
    keys = text.removesuffix(f": {NEEDS_BIAS_LABELS}").split(", ") if text else []
    return {key: NEEDS_BIAS_LABELS for key in keys if key in headline.LABELS}


def _params(data: dict[str, Any]) -> dict[str, Any]:
    return flatten(((data.get("params") or {}).get("params.yaml") or {}).get("data") or {})


def _status(revision: dict[str, Any], experiment: dict[str, Any], data: dict[str, Any]) -> str:
    executor = experiment.get("executor") or revision.get("executor") or {}
    state = str(executor.get("state") or (data.get("meta") or {}).get("state") or "").lower()
    if state in ("queued", "running", "failed"):  # "success" (a finished queued run) is done
        return state
    if revision.get("error") or state == "failed":
        return "failed"
    return "done" if _headline_metrics(data) else "no results"


def parse_exp_show(shown: list[dict[str, Any]]) -> list[Experiment]:
    """Experiments of ``dvc exp show --json``: the workspace, each baseline commit and each experiment of it."""
    found: list[Experiment] = []
    for entry in shown:
        data = entry.get("data") or {}
        kind = "workspace" if entry.get("rev") == "workspace" else "baseline"
        name = "workspace" if kind == "workspace" else (entry.get("name") or str(entry.get("rev", ""))[:7])
        found.append(Experiment(name, kind, _params(data), _headline_metrics(data),
                                "done" if _headline_metrics(data) else "no results",
                                None if kind == "workspace" else entry.get("rev"), data.get("timestamp"),
                                rejected=rejected_values(_headline_values(data)), metric_stages=_metric_stages(data)))
        baseline = _params(data)
        for experiment in entry.get("experiments") or []:
            revisions = experiment.get("revs") or []
            if not revisions:
                continue
            revision = revisions[0]
            data = revision.get("data") or {}
            name = revision.get("name") or experiment.get("name") or str(revision.get("rev", ""))[:7]
            found.append(Experiment(name, "experiment", _params(data), _headline_metrics(data),
                                    _status(revision, experiment, data), revision.get("rev"), data.get("timestamp"),
                                    rejected=rejected_values(_headline_values(data)),
                                    metric_stages=_metric_stages(data), baseline_params=baseline))
    return found


class DvcReader:
    """Reads files of one experiment: from disk for the workspace, else from DVC's cache at its revision. A file its
    dvc.lock (``lock``) records under DVC 3's hash, as an output or inside one, is read from the local cache by that
    hash (:meth:`_cached`); any other through DVC's filesystem at the revision, many in one switch (:meth:`prefetch`;
    a switch builds the revision's index: dvc.yaml and dvc.lock parsed)."""

    def __init__(self, root: Path, experiment: Experiment, repo: Any, lock: dict[str, Any] | None = None) -> None:
        self.root, self.experiment, self.repo = root, experiment, repo
        self.outputs = headline.recorded_outputs(lock)
        self.cache: dict[str, str | None] = {}

    def _read_here(self, key: str) -> str | None:
        try:
            if self.experiment.kind == "workspace":
                return (self.root / key).read_text(encoding="utf-8")
            return self.repo.dvcfs.read_text(key)
        except Exception:  # not an output at that revision, or not in this cache
            return None

    @functools.cached_property
    def stores(self) -> list[Path]:
        """The local DVC cache (``dvc cache dir``), where :meth:`_cached` looks."""
        from debias.tools.sweep.workspace import cache_dir

        return [Path(cache_dir(self.root))]

    def _cached(self, key: str) -> str | None:
        """``key`` read from the local cache by the hash dvc.lock records for it (the output's, or its entry's in
        the folder output holding it), None where that is not so (DVC's filesystem reads it then)."""
        from debias.tools.sweep.records import cached_text

        stores = self.stores
        parts = key.split("/")
        for cut in range(len(parts), 0, -1):
            entry = self.outputs.get("/".join(parts[:cut]))
            if entry is None:
                continue
            md5 = str(entry.get("md5") or "")
            if entry.get("hash") != "md5" or not md5:
                return None  # DVC 2's hash (another cache layout), or no hash
            if cut < len(parts):  # inside a folder output: its listing names the file's hash
                listing = cached_text(md5, stores) if md5.endswith(".dir") else None
                if listing is None:
                    return None
                inner = "/".join(parts[cut:])
                md5 = next((str(e.get("md5")) for e in json.loads(listing) if e.get("relpath") == inner), "")
            return cached_text(md5, stores) if md5 and not md5.endswith(".dir") else None
        return None

    def prefetch(self, paths: Iterable[Path]) -> None:
        keys = [str(p) for p in paths if str(p) not in self.cache]
        if not keys:
            return
        if self.experiment.kind == "workspace":
            self.cache.update({key: self._read_here(key) for key in keys})
            return
        for key in keys:
            try:
                self.cache[key] = self._cached(key)
            except (OSError, ValueError, AttributeError):  # a listing or object unreadable: DVC's filesystem says
                self.cache[key] = None
        keys = [key for key in keys if self.cache[key] is None]
        if not keys:
            return
        try:
            with self.repo.switch(self.experiment.rev):
                self.cache.update({key: self._read_here(key) for key in keys})
        except Exception:  # the revision is gone (an experiment removed meanwhile)
            self.cache.update({key: None for key in keys})

    def __call__(self, path: Path) -> str | None:
        if is_within(str(path), self.experiment.blanked):  # a stale stage's output: another run's
            return None
        self.prefetch([path])
        return self.cache.get(str(path))


def dvc_reader(root: Path, experiment: Experiment, repo: Any, lock: dict[str, Any] | None = None) -> DvcReader:
    """A reader of ``experiment``'s files (see :class:`DvcReader`; ``lock``: its dvc.lock, parsed)."""
    return DvcReader(root, experiment, repo, lock)


def read_lock(root: Path, experiment: Experiment) -> dict[str, Any] | None:
    """``experiment``'s dvc.lock, parsed: the workspace's from disk, a commit's or an experiment's from git;
    None where there is none or it cannot be read. Parsed as DVC parses it (:func:`headline.parse_lock`)."""
    text = lock_text(root, experiment)
    return None if text is None else headline.parse_lock(text)


CONFLICT_MARKERS = ("<<<<<<< ", "=======", ">>>>>>> ")


def unreadable_lock(text: str | None) -> str | None:
    """Why dvc.lock's ``text`` cannot be read (git's merge conflict markers, or no YAML mapping), in words; None when
    it parses or there is none."""
    if text is None or headline.parse_lock(text) is not None:
        return None
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith(CONFLICT_MARKERS) or line == "=======":
            return (f"dvc.lock holds git's merge conflict markers ({line.split()[0]} at line {number}): a merge left "
                    "it unresolved")
    return "dvc.lock is no YAML mapping DVC can read"


def lock_text(root: Path, experiment: Experiment) -> str | None:
    """``experiment``'s dvc.lock as text: the workspace's from disk, a commit's or an experiment's from git; None
    where there is none."""
    if experiment.kind == "workspace":
        try:
            text = (root / "dvc.lock").read_text(encoding="utf-8")
        except OSError:
            return None
    elif experiment.rev:
        done = subprocess.run(["git", "show", f"{experiment.rev}:dvc.lock"], cwd=root, capture_output=True, text=True,
                              timeout=60)
        if done.returncode != 0:
            return None
        text = done.stdout
    else:
        return None
    return text


def git_files(root: Path, specs: list[str]) -> dict[str, bytes | None]:
    """``REV:PATH`` -> the file's bytes in git (one ``git cat-file --batch``), None where git has none."""
    if not specs:
        return {}
    done = subprocess.run(["git", "cat-file", "--batch"], cwd=root, input="".join(f"{s}\n" for s in specs).encode(),
                          capture_output=True, timeout=120)
    found: dict[str, bytes | None] = dict.fromkeys(specs)
    out, at = done.stdout, 0
    for spec in specs if done.returncode == 0 else []:
        end = out.index(b"\n", at)
        header = out[at:end].split()
        at = end + 1
        if len(header) == 3 and header[1] == b"blob":
            size = int(header[2])
            found[spec], at = out[at:at + size], at + size + 1
    return found


def headline_bytes(root: Path, experiments: list[Experiment]) -> dict[int, Callable[[str], bytes | None]]:
    """id(experiment) -> a reader of its headline files' bytes: the workspace's on disk, a revision's from git."""
    revs = [e.rev for e in experiments if e.kind != "workspace" and e.rev]
    stored = git_files(root, [f"{rev}:{name}" for rev in revs for name in HEADLINE_FILES])
    readers: dict[int, Callable[[str], bytes | None]] = {}
    for experiment in experiments:
        if experiment.kind == "workspace":
            readers[id(experiment)] = lambda name: (root / name).read_bytes() if (root / name).is_file() else None
        elif experiment.rev:
            readers[id(experiment)] = lambda name, rev=experiment.rev: stored.get(f"{rev}:{name}")
    return readers


def blank_stale(experiment: Experiment, lock: dict[str, Any] | None,
                read: Callable[[str], bytes | None] | None = None) -> None:
    """Blank the metrics and files of ``experiment``'s stale stages (:mod:`debias.tools.compare.stale`) and the metrics
    of each headline file that does not match its dvc.lock (``read``: its bytes; :func:`headline.mismatches`), and say
    why."""
    found = stale_stages(lock, experiment.params)
    files = headline.mismatches(lock, read, HEADLINE_FILES) if read is not None else {}
    if not found and not files:
        return
    experiment.stale = {**found, **{HEADLINE_FILES[name]: f"{name} {why}" for name, why in files.items()
                                    if HEADLINE_FILES[name] not in found}}
    experiment.blanked = stale_outputs(lock, found) | set(files)
    for key in [k for k, stage in experiment.metric_stages.items() if stage in experiment.stale]:
        experiment.metrics.pop(key, None)
        experiment.rejected.pop(key, None)
    reasons = []
    if found:
        stage, why = next(iter(found.items()))
        others = f" (and {len(found) - 1} more stage{'s' if len(found) > 2 else ''} after it)" if len(found) > 1 else ""
        reasons.append(f"stale: {stage} {why}{others}; its metrics are another run's, left blank")
    reasons += [f"{name} {why}: its numbers are left out" for name, why in files.items()]
    experiment.reason = "; ".join(reasons)
    committed = "dvc repro, then commit dvc.lock" + (" and reports/metrics" if files else "")
    experiment.fix = ("dvc repro" if experiment.kind == "workspace" else committed if experiment.kind == "baseline"
                      else rerun_command(experiment.params, experiment.baseline_params))
    if not experiment.metrics and experiment.status == "done":
        experiment.status = "no results"


def explain_missing(experiment: Experiment, lock_problem: str | None = None) -> None:
    """Why an experiment that finished has none of the compared metrics (none at all, or only the data's and the
    groups' numbers; ``lock_problem``: why its dvc.lock cannot be read, :func:`unreadable_lock`), and the command
    that computes them."""
    if (any(k in experiment.metrics for k in METRIC_KEYS) or experiment.reason
            or experiment.status in ("queued", "running", "failed")):
        return
    if lock_problem is not None:
        experiment.reason = f"{lock_problem}; DVC reads no metrics of it"
        experiment.fix = ("git checkout HEAD -- dvc.lock` (or resolve the conflict by hand), then `dvc repro"
                          if experiment.kind == "workspace" else "git show " + str(experiment.rev)[:7] + ":dvc.lock`"
                          " to see it; fix it in a new commit, then `dvc exp run")
    elif experiment.kind == "workspace":
        experiment.reason, experiment.fix = "no metrics files in the workspace", "dvc repro"
    elif experiment.kind == "baseline":
        experiment.reason = ("its metrics files are not in this clone's DVC cache (the dvc.lock committed there names "
                             "outputs computed elsewhere; `dvc pull` fetches them where a DVC remote holds them)")
        experiment.fix = "dvc exp run"
    else:
        experiment.reason = "no metrics files at its revision"
        experiment.fix = rerun_command(experiment.params, experiment.baseline_params)


def progress(message: str) -> None:
    """A line on stderr while compare gathers (reading DVC's experiments takes tens of seconds): what it does now."""
    print(f"[compare] {message} ...", file=sys.stderr, flush=True)


def experiments_by_commit(root: Path) -> dict[str, list[tuple[str, str]]]:
    """Every DVC experiment of ``root`` by its baseline commit (``dvc exp list -A``): commit -> (name, revision) of
    each; ``dvc exp show`` without ``-A`` shows HEAD's only."""
    from dvc.repo import Repo

    with Repo(str(root)) as repo:
        return {str(commit): [(str(name), str(rev)) for name, rev in found]
                for commit, found in repo.experiments.ls(all_commits=True).items()}


def from_dvc(root: Path, all_commits: bool = False) -> list[Experiment]:
    """Every experiment DVC shows for ``root``'s HEAD (``all_commits``: for every commit, ``dvc exp show -A``), with
    a reader of its files; a stage whose lock entry does not match the experiment's params is blanked
    (:func:`blank_stale`)."""
    progress(f"reading DVC's experiments (dvc exp show{' -A' if all_commits else ''})")
    experiments = parse_exp_show(dvc_exp_show(root, all_commits))
    progress(f"{len(experiments)} experiments; checking each one's dvc.lock against its params and metrics files")
    readers = headline_bytes(root, [e for e in experiments if e.status in ("done", "no results")])
    locks: dict[int, dict[str, Any] | None] = {}
    for experiment in experiments:
        text = None
        if experiment.status in ("done", "no results"):
            text = lock_text(root, experiment)
            locks[id(experiment)] = None if text is None else headline.parse_lock(text)
            blank_stale(experiment, locks[id(experiment)], readers.get(id(experiment)))
        explain_missing(experiment, unreadable_lock(text))
    from dvc.repo import Repo

    repo = Repo(str(root))
    for experiment in experiments:
        if experiment.kind == "workspace" or experiment.rev:
            experiment.reader = dvc_reader(root, experiment, repo, locks.get(id(experiment)))
    workspace = next((e for e in experiments if e.kind == "workspace"), None)
    for experiment in experiments:
        if experiment.kind == "baseline" and experiment.fix and workspace is not None:
            # the workspace may hold an experiment's params: rerun the baseline's own, never the workspace's
            rerun = rerun_command(experiment.params, workspace.params)
            if rerun != "dvc exp run":
                experiment.fix = rerun
    return experiments


BASELINE_DIFF = "none (the baseline's params)"  # the params_diff tag of a pipeline run of the baseline's params
# A run has its results when it has this headline key (stage 2's test average: a number with or without bias labels);
# the baseline's ERM numbers alone may come from DVC's cache where an identical upstream ran here.
STAGE2_RESULT = "s2_avg"


def baseline_from_mlflow(experiments: list[Experiment], uri: str, experiment_name: str) -> str | None:
    """Give the baseline commit the results of this machine's newest finished MLflow pipeline run of that commit with
    the baseline's params (``dvc repro`` logs one): metrics, warnings and files, computed here as the experiments are;
    returns a note saying so. Without such a run a baseline keeps what DVC shows: the commit's git-tracked headline
    metrics (computed where its dvc.lock was written), said in the note, or nothing."""
    from debias.tools.compare.columns import param_key

    def same_params(a: Experiment, b: Experiment) -> bool:
        return {k: param_key(v) for k, v in a.params.items()} == {k: param_key(v) for k, v in b.params.items()}

    for baseline in experiments:
        if baseline.kind != "baseline" or not baseline.rev:
            continue
        committed = (f"{baseline.name} (the baseline commit's params): the commit's own numbers (its git-tracked "
                     "reports/metrics, computed where its dvc.lock was written, maybe another machine or thread count)"
                     if STAGE2_RESULT in baseline.metrics else None)
        if any(e.kind == "workspace" and same_params(e, baseline) and not e.stale and STAGE2_RESULT in e.metrics
               for e in experiments):
            continue  # the workspace holds the baseline's results: read from its files
        try:
            runs = from_mlflow(uri, experiment_name, {"debias.git_commit": baseline.rev,
                                                      "debias.params_diff": BASELINE_DIFF})
        except Exception:  # no store, or one that cannot be read: the baseline stays as DVC shows it
            return committed
        done = sorted((r for r in runs if r.status == "done" and STAGE2_RESULT in r.metrics),
                      key=lambda r: r.timestamp or "")
        if not done:
            return committed
        run = done[-1]
        baseline.metrics, baseline.rejected, baseline.warnings = run.metrics, run.rejected, run.warnings
        baseline.reader, baseline.run_id, baseline.timestamp = run.reader, run.run_id, run.timestamp
        baseline.status, baseline.reason, baseline.fix, baseline.stale = "done", "", "", {}
        return (f"{baseline.name} (the baseline commit's params): results of this machine's pipeline run "
                f"{run.run_id} in MLflow ({run.timestamp}), computed here as the experiments are (DVC's cache does not "
                "hold that commit's outputs; its git-tracked numbers: `dvc metrics diff`)")
    return None


# --------------------------------------------------------------------------- MLflow


def from_mlflow(uri: str, experiment_name: str, tags: dict[str, str] | None = None) -> list[Experiment]:
    """The pipeline parent runs of MLflow experiment ``experiment_name`` (with ``tags`` equal to the values given),
    with a reader of the artifacts their stage runs logged."""
    from debias.harness.tracking import KIND_TAG, PARENT_TAG
    from debias.harness.tracking.store import sqlite_path

    database = sqlite_path(uri)
    if database is not None and not database.exists():
        return []  # no store: nothing logged (MLflow would create an empty database, migrations and all)
    from mlflow.tracking import MlflowClient

    os.environ["MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"] = "false"  # a command line tool: no bar per small file
    client = MlflowClient(tracking_uri=uri)
    found = client.get_experiment_by_name(experiment_name)
    if found is None:
        return []
    clauses = [f"tags.`{KIND_TAG}` = 'pipeline'"] + [f"tags.`{k}` = {quoted(v)}" for k, v in (tags or {}).items()]
    runs = client.search_runs([found.experiment_id], filter_string=" and ".join(clauses), max_results=5000)
    experiments = []
    for run in runs:
        run_tags = run.data.tags
        name = run_tags.get("debias.dvc_experiment") or run.info.run_name or run.info.run_id[:8]
        warnings = {key.split(".", 2)[2]: value.splitlines() for key, value in run_tags.items()
                    if key.startswith("debias.warnings.")}
        status = {"FINISHED": "done", "RUNNING": "running", "FAILED": "failed", "KILLED": "failed"}.get(
            run.info.status, run.info.status.lower())
        values = {**{k: v for k, v in run.data.metrics.items() if k in headline.LABELS},
                  **tagged_needs_bias_labels(run_tags)}
        metrics = {k: v for k, v in values.items() if kept_value(v)}
        experiment = Experiment(name, "mlflow", dict(run.data.params), metrics, status if metrics else "no results",
                                None, _iso(run.info.start_time), warnings, {}, run.info.run_id,
                                rejected=rejected_values(values))
        experiment.reader = mlflow_reader(client, found.experiment_id, run.info.run_id, PARENT_TAG)
        experiments.append(experiment)
    return experiments


def quoted(value: str) -> str:
    """``value`` as a string literal of MLflow's search filter: in single quotes, or double quotes when it holds a
    single quote (``none (the baseline's params)``); a value holding both is refused."""
    if "'" not in value:
        return f"'{value}'"
    if '"' in value:
        raise ValueError(f"tag value {value!r} holds both quote characters; MLflow's filter cannot search for it")
    return f'"{value}"'


def _iso(millis: int | None) -> str | None:
    if not millis:
        return None
    import datetime as dt

    return dt.datetime.fromtimestamp(millis / 1000).isoformat(timespec="seconds")


def mlflow_reader(client: Any, experiment_id: str, parent_id: str, parent_tag: str) -> Callable[[Path], str | None]:
    """Read ``outputs/<path>`` from the stage runs nested under ``parent_id`` (listed once, newest first)."""
    index: dict[str, str] | None = None  # path -> the stage run that logged it
    cache: dict[str, str | None] = {}

    def listing(run_id: str, folder: str) -> list[str]:
        found = []
        for item in client.list_artifacts(run_id, folder):
            found += listing(run_id, item.path) if item.is_dir else [item.path]
        return found

    def read(path: Path) -> str | None:
        nonlocal index
        key = str(path)
        if key in cache:
            return cache[key]
        if index is None:
            index = {}
            children = client.search_runs([experiment_id], filter_string=f"tags.`{parent_tag}` = '{parent_id}'",
                                          max_results=100)
            for child in reversed(children):  # oldest first: a later run's copy wins
                index.update({name.removeprefix("outputs/"): child.info.run_id
                              for name in listing(child.info.run_id, "outputs")})
        cache[key] = None
        if key in index:
            import tempfile

            import mlflow.artifacts

            with tempfile.TemporaryDirectory() as tmp:
                local = mlflow.artifacts.download_artifacts(run_id=index[key], artifact_path=f"outputs/{key}",
                                                            dst_path=tmp, tracking_uri=client._tracking_client.tracking_uri)
                cache[key] = Path(local).read_text(encoding="utf-8")
        return cache[key]
    return read
