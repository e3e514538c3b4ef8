"""Plans of DVC experiments run through the pipeline itself: (setting, seed, method) jobs, a scratch clone of the
repository, DVC's queue (``debias sweep``'s local launcher), and what the clone's ``dvc exp show`` and MLflow store
hold afterwards. The method comparison, the tabular study and the label-free selection study run on it."""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import subprocess
from pathlib import Path

import yaml

from debias.core.headline import forget_committed_run
from debias.core.trees import flatten, merge
from debias.tools import sweep

REPO = Path(__file__).resolve().parent.parent


UPSTREAM = "upstream"  # the method name of a (setting, seed)'s shared-upstream experiment; its ERM is the ERM row


# The official idx files of a torchvision MNIST-format source (Fashion-MNIST here), ``.gz`` or not.
RAW_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


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


def finish(out: Path, rows: list[dict], text: str, header: str, workdir: Path, keep: bool) -> int:
    """Write the results (:func:`write_results`), print them, remove a temporary ``workdir`` unless ``keep``; 0."""
    write_results(out, rows, text, header)
    print(header + "\n\n" + text)
    if not keep:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0
