"""Method comparison on real MNIST digits, run through the pipeline itself (DVC experiment queue).

For every setting (bias protocol and strength) x seed x method of ``benchmarks/quality.yaml``
this runs ``dvc exp run -S ...`` in a scratch clone of the repository through ``debias sweep``'s
local launcher (DVC's queue, ``dvc queue start -j JOBS``: :func:`debias.tools.sweep.run_local`). The shared upstream of each (setting, seed) (download ->
inject_bias -> train_erm -> infer_groups with clusters) is queued first, so the method
experiments reuse it from DVC's run-cache. Results are collected from ``dvc exp show --json``
(metrics) and the clone's MLflow store (wall time of every stage run, by experiment tag), then
written as per-run CSV and a Markdown table of mean +- std over seeds.

    python benchmarks/quality.py --npz ../shared/datasets/mnist10k.npz --seeds 0 1 2 --jobs 2

``--workdir`` keeps the clone (and its MLflow store, ``mlflow ui`` there); rerunning with the
same ``--workdir`` skips experiments that already succeeded. ``--collect-only`` rebuilds the
tables from an existing workdir.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from debias.core.headline import forget_committed_run
from debias.tools import sweep
from debias.core.trees import flatten, merge  # noqa: F401 (speed.py, scale.py and gpu.py import merge from here)

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
ACCURACY = ("avg", "unbiased", "worst_group")
HEADLINE = {"avg": "avg", "unbiased": "unbiased", "worst_group": "worst"}  # accuracy -> its headline key suffix
UPSTREAM = "upstream"  # the method name of a (setting, seed)'s shared-upstream experiment; its ERM is the ERM row
# The official idx files of a torchvision MNIST-format source (Fashion-MNIST here), ``.gz`` or not.
RAW_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


# --------------------------------------------------------------------------- configuration


def apply_profile(config: dict, profile: str | None) -> dict:
    """``config`` with ``profiles[profile]`` (``base`` and per-method overrides) merged into its base and methods."""
    if not profile:
        return config
    changes = config["profiles"][profile]
    methods = {name: merge(entry, changes.get("methods", {}).get(name, {})) for name, entry in config["methods"].items()}
    return {**config, "base": merge(config["base"], changes.get("base", {})), "methods": methods}


def set_param_args(overrides: dict) -> list[str]:
    """``-S key=value`` arguments for ``dvc exp run`` (values in YAML flow style)."""
    args = []
    for key, value in flatten(overrides).items():
        # One line however long (a colour palette is > 80 characters): DVC's -S parser rejects a wrapped value.
        text = yaml.safe_dump(value, default_flow_style=True, width=float("inf")).strip()
        text = text.removesuffix("\n...").removesuffix("...").strip()
        args += ["-S", f"{key}={text}"]
    return args


def expand_preset(entry: dict) -> dict:
    """``entry`` with its ``preset`` (a paper preset of src/debias/tools/presets: a name, or ``{name, keys}`` to take only
    those dotted subtrees) replaced by the preset's params, the entry's own values merged over them."""
    spec = entry.get("preset")
    if spec is None:
        return entry
    from debias.tools import presets

    name, keys = (spec, None) if isinstance(spec, str) else (spec["name"], spec.get("keys"))
    own = {key: value for key, value in entry.items() if key != "preset"}
    return merge(presets.select(presets.load(name).params(), keys), own)


def experiment_name(setting: str, seed: int, method: str) -> str:
    return f"{setting}-s{seed}-{method}".replace("_", "-")


# Keys of a method's config entry that are not params: ``targets`` (the stages its experiment runs; default
# linear_probe and evaluate) and ``result`` (where its row's test accuracies are: default the stage-2 model,
# stage2_train.json; ``{file: probe, encoder: erm}``: that encoder's linear probe in probe.json, e.g. DFR's
# last-layer retraining of the ERM encoder).
JOB_KEYS = ("targets", "result")
METHOD_TARGETS = ["linear_probe", "evaluate"]


def plan(config: dict, settings: list[str], seeds: list[int], methods: list[str], forced: dict | None = None) -> list[dict]:
    """Every experiment to run, seed by seed, upstream ones first: name, setting, seed, method, overrides, targets
    (and ``result``, see :data:`JOB_KEYS`).

    Overrides merge setting <- method <- seed <- ``forced`` (command-line ``--set``, e.g. for a smoke run); a setting's
    or method's ``preset`` is expanded first (:func:`expand_preset`)."""
    forced = forced or {}
    upstream_groups = {"groups": {"method": "cluster"}}
    jobs = []
    for seed in seeds:  # seed-major: a run stopped early still covers every setting and method
        for setting in settings:
            jobs.append({"name": experiment_name(setting, seed, UPSTREAM), "setting": setting, "seed": seed,
                         "method": UPSTREAM, "targets": ["infer_groups"],
                         "overrides": merge(merge(merge(expand_preset(config["settings"][setting]), upstream_groups),
                                                  {"seed": seed}),
                                            forced)})
        for setting in settings:
            for method in methods:
                entry = expand_preset({k: v for k, v in config["methods"][method].items() if k not in JOB_KEYS})
                overrides = merge(merge(expand_preset(config["settings"][setting]), entry), {"seed": seed})
                jobs.append({"name": experiment_name(setting, seed, method), "setting": setting, "seed": seed,
                             "method": method, "targets": list(config["methods"][method].get("targets", METHOD_TARGETS)),
                             "result": config["methods"][method].get("result"), "overrides": merge(overrides, forced)})
    return jobs


# --------------------------------------------------------------------------- the scratch clone and DVC


def run(args: list[str], cwd: Path, env: dict[str, str] | None = None, check: bool = True) -> str:
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return done.stdout


def make_workspace(workdir: Path, base_params: dict) -> None:
    """Clone the repository's HEAD into ``workdir``, write the benchmark's base params and commit them."""
    run(["git", "clone", "-q", "--no-hardlinks", str(REPO), str(workdir)], cwd=REPO.parent)
    params_file = workdir / "params.yaml"
    params = merge(yaml.safe_load(params_file.read_text()), base_params)
    params_file.write_text(yaml.safe_dump(params, sort_keys=False))
    forget_committed_run(workdir)
    for command in (["dvc", "config", "core.analytics", "false"], ["dvc", "config", "core.check_update", "false"],
                    ["git", "add", "-A"], ["git", "commit", "-qm", "benchmark base params"]):
        run(command, cwd=workdir)


def missing_raw_files(raw: Path) -> list[str]:
    """The idx files of :data:`RAW_FILES` that ``raw`` holds neither as ``name`` nor ``name.gz``."""
    return [name for name in RAW_FILES if not any((raw / c).is_file() for c in (name, f"{name}.gz"))]


def link_raw_files(clone: Path, raw: Path) -> None:
    """Link the idx files (``name`` or ``name.gz``) into the clone's torchvision folder (the source decompresses
    ``.gz`` files beside them, inside the clone)."""
    if missing := missing_raw_files(raw):
        raise SystemExit(f"{raw} lacks {', '.join(missing)} (or .gz): point --raw at the Fashion-MNIST idx files")
    target = clone / "data" / "raw" / "fashion_mnist" / "FashionMNIST" / "raw"
    target.mkdir(parents=True, exist_ok=True)
    for name in RAW_FILES:
        found = next(raw / c for c in (name, f"{name}.gz") if (raw / c).is_file())
        (target / found.name).symlink_to(found.resolve())


def stage_env(threads: int, workdir: Path) -> dict[str, str]:
    """The environment ``dvc queue start`` hands to every worker (machine settings, never params).

    ``PYTHONPATH`` puts the clone's ``src`` first, so the stages run the cloned commit's package even
    where ``debias`` is installed editable from a working tree that changes during the benchmark.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DVC_", "MLFLOW_TRACKING"))}
    env["PYTHONPATH"] = os.pathsep.join([str(workdir / "src"), *filter(None, [env.get("PYTHONPATH")])])
    env.update(DEBIAS_THREADS=str(threads), DEBIAS_TRACKING="required", MLFLOW_DISABLE_TELEMETRY="true",
               OMP_WAIT_POLICY="PASSIVE", DEBIAS_DEVICE=env.get("DEBIAS_DEVICE", "cpu"),
               NUMBA_CACHE_DIR=env.get("NUMBA_CACHE_DIR", str(Path.home() / ".cache" / "debias" / "numba")),
               GIT_AUTHOR_NAME="debias-bench", GIT_AUTHOR_EMAIL="bench@debias.invalid",
               GIT_COMMITTER_NAME="debias-bench", GIT_COMMITTER_EMAIL="bench@debias.invalid")
    return env


def sweep_jobs(jobs: list[dict]) -> list[sweep.Job]:
    """The plan's experiments as ``debias sweep`` jobs (dotted ``-S`` overrides, target stages)."""
    return [sweep.Job(job["name"], flatten(job["overrides"]), list(job["targets"])) for job in jobs]


def run_queue(workdir: Path, jobs: list[dict], workers: int, env: dict[str, str], deadline: float = float("inf"),
              poll_s: float = 10.0) -> list[str]:
    """Run ``jobs`` on ``debias sweep``'s local launcher (DVC's queue, ``workers`` workers) in ``workdir``: what is
    done, queued or running is not queued again; at ``deadline`` the queue stops. Returns the names that did not
    succeed (:func:`debias.tools.sweep.run_local`)."""
    return sweep.run_local(workdir, sweep_jobs(jobs), workers, env, deadline, poll_s, log="quality")


def write_sweep_file(path: Path, jobs: list[dict], base: dict, name: str) -> Path:
    """The plan as a ``debias sweep --file`` (every experiment's params: the benchmark's base, then its own), to run
    the grid on a cluster: ``debias sweep --file PATH --launcher slurm --dvc-remote ...``."""
    experiments = [{"name": job.name, "set": {**flatten(base), **job.overrides}, "targets": job.targets}
                   for job in sweep_jobs(jobs)]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({"name": name, "upstream": "infer_groups", "experiments": experiments},
                                   sort_keys=False, width=float("inf")))
    return path


# --------------------------------------------------------------------------- collection


def shown_experiments(workdir: Path) -> dict[str, dict]:
    """Experiment name -> ``{"params": params.yaml dict, "metrics": headline values}`` from ``dvc exp show --json``
    (the headline files ``reports/metrics/<stage>.json`` are the pipeline's DVC metrics; src/debias/core/headline.py)."""
    shown = json.loads(run(["dvc", "exp", "show", "--json"], cwd=workdir))  # --all-commits: minutes
    found: dict[str, dict] = {}

    def visit(entry: dict) -> None:
        for exp in entry.get("experiments") or []:
            for revision in exp.get("revs") or []:
                data = revision.get("data") or {}
                name = revision.get("name") or exp.get("name")
                if name and data and not revision.get("error"):
                    metrics: dict = {}
                    for value in (data.get("metrics") or {}).values():
                        metrics.update(value.get("data", {}))
                    found[name] = {"params": (data.get("params") or {}).get("params.yaml", {}).get("data", {}),
                                   "metrics": metrics}

    for entry in shown:
        visit(entry)
    return found


def store_uri(workdir: Path, tracking_uri: str | None = None) -> str:
    """Where the stages logged: ``tracking_uri`` (a tracking server, e.g. for a grid run by ``debias sweep`` on a
    cluster), else the clone's own SQLite store."""
    return tracking_uri or f"sqlite:///{workdir / 'mlflow.db'}"


def stage_runs(workdir: Path, tracking_uri: str | None = None) -> tuple[dict[str, dict[str, float]], float, dict[str, dict[str, float]]]:
    """Experiment name -> stage -> wall seconds of its MLflow run, the seconds from the first run's start to the
    last one's end (stages restored from the run-cache have no run: absent), and experiment name -> the metrics
    of its evaluate run (Î(Y;Z) and H(A), which the headline files leave out)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=store_uri(workdir, tracking_uri))
    experiments = [e.experiment_id for e in client.search_experiments()]
    seconds: dict[str, dict[str, float]] = {}
    evaluated: dict[str, dict[str, float]] = {}
    starts, ends = [], []
    for found in client.search_runs(experiments, filter_string="attributes.status = 'FINISHED'", max_results=50000):
        name = found.data.tags.get("debias.dvc_experiment")
        stage = found.data.tags.get("debias.stage")  # parent runs (one per pipeline run) have none
        if name and stage and found.info.end_time:
            seconds.setdefault(name, {})[stage] = (found.info.end_time - found.info.start_time) / 1000
            starts.append(found.info.start_time)
            ends.append(found.info.end_time)
            if stage == "evaluate":
                evaluated[name] = dict(found.data.metrics)
    return seconds, ((max(ends) - min(starts)) / 1000 if starts else 0.0), evaluated


def stage_warnings(workdir: Path, tracking_uri: str | None = None) -> dict[str, dict[str, list[str]]]:
    """Experiment name -> stage -> the warning codes of its MLflow run (tag ``debias.warnings``, one ``code: message``
    per line; :mod:`debias.core.health`)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=store_uri(workdir, tracking_uri))
    experiments = [e.experiment_id for e in client.search_experiments()]
    found: dict[str, dict[str, list[str]]] = {}
    for run_ in client.search_runs(experiments, filter_string="attributes.status = 'FINISHED'", max_results=50000):
        name, stage = run_.data.tags.get("debias.dvc_experiment"), run_.data.tags.get("debias.stage")
        lines = (run_.data.tags.get("debias.warnings") or "").splitlines()
        if name and stage and lines:
            found.setdefault(name, {})[stage] = sorted({line.split(":", 1)[0].strip() for line in lines})
    return found


ROW_STAGE = {"erm": "train_erm"}  # the stage whose warnings a row carries (default: train_contrastive)


def add_warnings(rows: list[dict], warnings: dict[str, dict[str, list[str]]]) -> list[dict]:
    """Each row's ``warnings`` (the codes of the stage that produced its numbers, ';'-joined; '' when none)."""
    for row in rows:
        stage = ROW_STAGE.get(row["method"], "linear_probe" if row.get("from_probe") else "train_contrastive")
        row["warnings"] = ";".join(warnings.get(row["experiment"], {}).get(stage, []))
        row.pop("from_probe", None)
    return rows


def rows_of(jobs: list[dict], shown: dict[str, dict], seconds: dict[str, dict[str, float]],
            evaluated: dict[str, dict[str, float]] | None = None) -> list[dict]:
    """One CSV row per (setting, seed, method), the ERM row taken from each upstream experiment."""
    rows = []
    evaluated = evaluated or {}
    by_name = {job["name"]: job for job in jobs}
    erm_of: dict[tuple, dict] = {}  # (setting, seed) -> ERM representation metrics (identical in every method experiment)
    for job in jobs:
        got = shown.get(job["name"])
        if job["method"] != UPSTREAM and got and got["metrics"].get("align_erm") is not None:
            extra = evaluated.get(job["name"], {})
            erm_of[(job["setting"], job["seed"])] = {
                "alignment_loss": got["metrics"].get("align_erm"), "mi_a": got["metrics"].get("mi_a_erm"),
                "mi_y": extra.get("erm.test.mi_y"), "h_a": extra.get("erm.test.h_a")}
    for name, job in by_name.items():
        got = shown.get(name)
        if got is None:
            continue
        metrics = got["metrics"]
        row: dict[str, Any] = {"setting": job["setting"], "seed": job["seed"]}
        row.update(n_train=metrics.get("bias_n"), n_conflicting=metrics.get("bias_conflicting"))
        if job["method"] == UPSTREAM:
            prefix = "erm"
            rep = erm_of.get((job["setting"], job["seed"]), {})
            stage_time = seconds.get(name, {}).get("train_erm")
            row["method"] = "erm"
        elif job.get("result"):  # a linear probe's result (e.g. DFR on the ERM encoder): its headline keys
            encoder = "erm" if job["result"].get("encoder", "stage2") == "erm" else "s2"
            prefix = f"probe_{encoder}"
            rep = (erm_of.get((job["setting"], job["seed"]), {}) if encoder == "erm" else
                   {"alignment_loss": metrics.get("align_s2"), "mi_a": metrics.get("mi_a_s2")})
            stage_time = seconds.get(name, {}).get("linear_probe")
            row["method"] = job["method"]
            row["from_probe"] = True
        else:
            prefix = "s2"
            extra = evaluated.get(name, {})
            rep = {"alignment_loss": metrics.get("align_s2"), "mi_a": metrics.get("mi_a_s2"),
                   "mi_y": extra.get("stage2.test.mi_y"), "h_a": extra.get("stage2.test.h_a")}
            stage_time = seconds.get(name, {}).get("train_contrastive")
            row["method"] = job["method"]
        test = {k: metrics.get(f"{prefix}_{HEADLINE[k]}") for k in ACCURACY}
        if all(v is None for v in test.values()):
            continue  # queued, failed or stopped at the time limit: no result
        row.update({f"test_{k}": test[k] for k in ACCURACY})
        row.update(alignment_loss=rep.get("alignment_loss"), mi_a=rep.get("mi_a"), mi_y=rep.get("mi_y"),
                   h_a=rep.get("h_a"), train_seconds=stage_time,
                   experiment_seconds=sum(seconds.get(name, {}).values()) or None, experiment=name)
        rows.append(row)
    return rows


def mean_std(values: list[float], scale: float = 1.0, digits: int = 1) -> str:
    values = [scale * v for v in values if v is not None]
    if not values:
        return "–"
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    spread = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.{digits}f} ± {spread:.{digits}f}"


def warning_flag(group: list[dict]) -> str:
    """`` ⚠ code in k of n seeds`` for each warning code carried by some of the rows ``group`` ('' when none)."""
    codes = [set(filter(None, (r.get("warnings") or "").split(";"))) for r in group]
    return "".join(f" ⚠ {code} in {sum(code in c for c in codes)} of {len(group)} seeds"
                   for code in sorted(set().union(*codes)))


def warning_notes(rows: list[dict]) -> list[str]:
    """The legend of the warning codes the rows carry (:data:`debias.core.health.CODES`); empty when none."""
    from debias.core.health import CODES

    found = sorted({code for r in rows for code in (r.get("warnings") or "").split(";") if code})
    if not found:
        return []
    return ["⚠ code in k of n seeds: k of the row's n runs carried that warning (debias.core.health) from the stage behind "
            "its numbers; each run's metrics JSON and MLflow hold the full message. "
            + " ".join(f"*{code}*: {CODES.get(code, 'see debias.core.health')}." for code in found)]


def markdown(rows: list[dict], config: dict, settings: list[str], methods: list[str]) -> str:
    """Mean ± std over seeds per (setting, method); accuracies in %, alignment loss and Î(A;Z) (nats) on test."""
    labels = config.get("labels", {})
    lines = ["| setting | method | test avg | test unbiased | test worst-group | alignment loss | Î(A;Z) | "
             "train s | experiment s | seeds | paper |",
             "|---|---|---|---|---|---|---|---:|---:|---:|---|"]
    for setting in settings:
        paper = config.get("paper", {}).get(setting, {})
        for method in ["erm", *methods]:
            group = [r for r in rows if r["setting"] == setting and r["method"] == method]
            if not group:
                continue
            cells = [mean_std([r[f"test_{k}"] for r in group], 100) for k in ACCURACY]
            cells += [mean_std([r[k] for r in group], digits=3) for k in ("alignment_loss", "mi_a")]
            for key in ("train_seconds", "experiment_seconds"):
                seconds = [r[key] for r in group if r[key] is not None]
                cells.append(f"{statistics.mean(seconds):.0f}" if seconds else "–")
            cells += [str(len(group)), paper.get(method, "")]
            lines.append(f"| {setting} | {labels.get(method, method)}{warning_flag(group)} | "
                         + " | ".join(cells) + " |")
    notes = [f"- {setting}: {config['paper'][setting]['reference']}" for setting in settings
             if setting in config.get("paper", {})]
    counts = []
    for setting in settings:
        conflicting = [r["n_conflicting"] for r in rows if r["setting"] == setting and r["method"] == "erm"
                       and r["n_conflicting"] is not None]
        n_train = [r["n_train"] for r in rows if r["setting"] == setting and r["n_train"]]
        if conflicting:
            low, high = min(conflicting), max(conflicting)
            counts.append(f"{setting}: {low if low == high else f'{low}–{high}'} of {n_train[0]}")
    return "\n".join(lines + ["", *warning_notes(rows),
                              "", "Bias-conflicting training images: " + "; ".join(counts) + ".",
                              "", "Papers' numbers (column *paper*):", *notes])


def read_rows(paths: list[str]) -> list[dict]:
    """Rows of earlier runs' CSV files (numbers parsed; empty cells are None); a (setting, seed, method) given
    twice keeps the later file's row (a rerun replaces the run before it), in the first one's place."""
    rows: dict[tuple, dict] = {}
    for path in paths:
        with open(path, newline="") as handle:
            for row in csv.DictReader(handle):
                parsed: dict[str, Any] = {}
                for key, value in row.items():
                    if value == "":
                        parsed[key] = None
                    elif key in ("setting", "method", "experiment", "warnings"):
                        parsed[key] = value
                    else:
                        parsed[key] = int(value) if key in ("seed", "n_train", "n_conflicting") else float(value)
                rows[parsed["setting"], parsed["seed"], parsed["method"]] = parsed
    return list(rows.values())


def write_results(out: Path, rows: list[dict], text: str, header: str) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.with_suffix(".csv"), "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    out.with_suffix(".md").write_text(f"{header}\n\n{text}\n")


def add_queue_arguments(parser: argparse.ArgumentParser, seeds: list[int]) -> None:
    """The options quality.py and tabular.py share: what to run (seeds, settings, methods, --set), how (workers,
    threads, time limit) and where (--workdir, --collect-only)."""
    parser.add_argument("--seeds", type=int, nargs="+", default=seeds)
    parser.add_argument("--settings", nargs="*", help="subset of the config's settings")
    parser.add_argument("--methods", nargs="*", help="subset of the config's methods")
    parser.add_argument("--jobs", type=int, default=2, help="DVC queue workers (dvc queue start -j)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads per worker (DEBIAS_THREADS)")
    parser.add_argument("--workdir", help="scratch clone to create or resume (default: a temporary folder)")
    parser.add_argument("--max-minutes", type=float, help="stop the queue after this long and report what finished")
    parser.add_argument("--collect-only", action="store_true", help="only rebuild the tables from --workdir")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                        help="overrides of every experiment (YAML values, over setting and method), e.g. for a "
                        "smoke run: stage2.epochs=1")


def parse_sets(items: list[str]) -> dict:
    """``["a.b=1", "c=x"]`` -> ``{"a": {"b": 1}, "c": "x"}`` (values parsed as YAML)."""
    forced: dict = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--set {item!r}: expected KEY=VALUE, e.g. stage2.epochs=1")
        node = forced
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = yaml.safe_load(value)
    return forced


def checked_selection(parser: argparse.ArgumentParser, config: dict,
                      args: argparse.Namespace) -> tuple[list[str], list[str], dict]:
    """The settings and methods to run (default: all of the config's) and the --set overrides; an unknown name
    or a malformed --set is a usage error naming it."""
    unknown = [s for s in args.settings or [] if s not in config["settings"]]
    unknown += [m for m in args.methods or [] if m not in config["methods"]]
    if unknown:
        parser.error(f"unknown settings/methods {unknown}; allowed: {sorted(config['settings'])}, "
                     f"{sorted(config['methods'])}")
    try:
        forced = parse_sets(args.set)
    except ValueError as exc:
        parser.error(str(exc))
    return args.settings or list(config["settings"]), args.methods or list(config["methods"]), forced


def open_workdir(parser: argparse.ArgumentParser, workdir: Path, base: dict) -> bool:
    """Make the benchmark clone at ``workdir`` unless it is one already (then it is resumed); True when made.
    A non-empty folder that is not a clone is a usage error."""
    if (workdir / ".dvc").is_dir():
        return False
    if workdir.exists() and any(workdir.iterdir()):
        parser.error(f"--workdir {workdir} exists and is not a benchmark clone")
    if workdir.exists():
        workdir.rmdir()
    make_workspace(workdir, base)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    data = parser.add_mutually_exclusive_group()
    data.add_argument("--npz", help="path to mnist10k.npz (x uint8 [N,28,28], y), read in place as data.path")
    data.add_argument("--raw", help="folder of the Fashion-MNIST idx files (.gz accepted), linked into the clone's "
                      "data/raw for data.source fashion_mnist (e.g. --config benchmarks/fullsize.yaml)")
    parser.add_argument("--config", default=str(HERE / "quality.yaml"))
    parser.add_argument("--profile", help="a profile of the config's `profiles` (e.g. cpu), merged over its base and "
                        "methods")
    add_queue_arguments(parser, seeds=[0, 1, 2])
    parser.add_argument("--upstream-only", action="store_true", help="run only each (setting, seed)'s upstream "
                        "(data, ERM, clusters): the ERM rows, e.g. a bias-free setting's plain-model ceiling")
    parser.add_argument("--from-csv", nargs="*", metavar="CSV",
                        help="only rebuild the Markdown from earlier runs' CSV files (e.g. halves run on two machines)")
    parser.add_argument("--out", default=str(HERE / "results" / "quality"))
    parser.add_argument("--sweep-file", metavar="YAML", help="only write the grid as a `debias sweep --file` (to run "
                        "it on a SLURM cluster: docs/cluster.md), then collect with --collect-only --workdir <repo>")
    parser.add_argument("--tracking-uri", help="--collect-only: the MLflow server the stages logged to (default: the "
                        "workdir's mlflow.db)")
    args = parser.parse_args(argv)

    config = yaml.safe_load(Path(args.config).read_text())
    if args.profile and args.profile not in config.get("profiles", {}):
        parser.error(f"--profile {args.profile}: not in {args.config}; allowed: {sorted(config.get('profiles', {}))}")
    config = apply_profile(config, args.profile)
    settings, methods, forced = checked_selection(parser, config, args)
    needs_data = not (args.from_csv or args.collect_only)
    if needs_data and not (args.npz or args.raw):
        parser.error("give --npz (mnist10k.npz) or --raw (Fashion-MNIST idx files)")
    if args.sweep_file and args.raw:
        parser.error("--sweep-file takes --npz (read in place by every task); --raw links files into one clone")
    if args.npz and not Path(args.npz).is_file():
        parser.error(f"--npz {args.npz}: no such file")
    if args.raw and (not Path(args.raw).is_dir() or missing_raw_files(Path(args.raw))):
        parser.error(f"--raw {args.raw}: not a folder holding {', '.join(RAW_FILES)} (.gz accepted)")
    base = merge(config["base"], {"data": {"path": str(Path(args.npz).resolve())}}) if args.npz else config["base"]
    jobs = plan(config, settings, args.seeds, methods, forced)
    if args.upstream_only:
        jobs = [job for job in jobs if job["method"] == UPSTREAM]
    command = "python benchmarks/quality.py " + " ".join(sys.argv[1:] if argv is None else argv)
    if args.sweep_file:
        written = write_sweep_file(Path(args.sweep_file), jobs, base, Path(args.sweep_file).stem)
        print(f"wrote {written} ({len(jobs)} experiments): debias sweep --file {written} --launcher slurm "
              "--dvc-remote PATH (docs/cluster.md)")
        return 0
    if args.from_csv:
        rows = read_rows(args.from_csv)
        settings = [s for s in settings if any(r["setting"] == s for r in rows)]
        write_results(Path(args.out), rows, markdown(rows, config, settings, methods), f"Command: `{command}`")
        return 0

    workdir = Path(args.workdir).resolve() if args.workdir else Path(tempfile.mkdtemp(prefix="debias-quality-"))
    started = time.time()
    if not args.collect_only:
        if open_workdir(parser, workdir, base) and args.raw:
            link_raw_files(workdir, Path(args.raw))
        deadline = started + 60 * args.max_minutes if args.max_minutes else float("inf")
        unfinished = run_queue(workdir, jobs, args.jobs, stage_env(args.threads, workdir), deadline)
    wall = time.time() - started
    unfinished = [] if args.collect_only else unfinished
    seconds, span, evaluated = stage_runs(workdir, args.tracking_uri)
    rows = add_warnings(rows_of(jobs, shown_experiments(workdir), seconds, evaluated),
                        stage_warnings(workdir, args.tracking_uri))
    if not rows:
        print("[quality] no results", file=sys.stderr)
        return 1
    import torch

    total_stage_s = sum(r["experiment_seconds"] or 0 for r in rows)
    commit = run(["git", "rev-parse", "--short", "HEAD~1"], cwd=workdir).strip()  # HEAD: the base params
    header = (f"Command: `{command}` (pipeline code at commit {commit})\n\nMachine: {os.cpu_count()} CPUs ({platform.processor() or platform.machine()}), "
              f"torch {torch.__version__}, {args.jobs} queue workers x {args.threads} thread(s). "
              + ("" if args.collect_only else f"Benchmark wall time: {wall / 60:.1f} min; ")
              + f"first stage run's start to last one's end: {span / 60:.1f} min; stage runs' wall time summed "
              f"over all experiments: {total_stage_s / 60:.1f} min; {len(rows)} result rows, {len(jobs)} experiments"
              + (f", {len(unfinished)} unfinished at the time limit." if unfinished else "."))
    text = markdown(rows, config, settings, methods)
    write_results(Path(args.out), rows, text, header)
    print(header + "\n\n" + text)
    if not args.workdir and not args.collect_only:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
