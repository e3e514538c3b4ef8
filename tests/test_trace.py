"""The DVC graph, proven by running it: each stage's command from dvc.yaml, in a scratch copy of the repository at
tiny sizes, under ``strace -f`` (every file any process of the stage opens, probes, renames, removes or runs, by
whatever library: :func:`debias.tools.trace_log.read_strace`) and Python's audit hook (tests/trace_hook/sitecustomize.py,
on PYTHONPATH for these processes only: which ``debias`` module imported which). Per stage
(:func:`debias.tools.trace.check_stage`): every file read is a dep or a declared environment file, no other stage's
out is probed, every file written is an out or declared as none (NOT_OUTS), every project module imported is a dep
or a side channel. The stages run as plain processes (``DEBIAS_FORKSERVER=0``): a stage forked by the warm fork
server is no child of the traced command.

All behind ``slow``: the default pipeline, every stage once, and beside it a whole pipeline on an image folder
without bias labels (whose outputs are also checked to say which numbers need bias labels); then every stage-2
method, group-inference method and probe variant, each rerunning its own stage on the default pipeline's upstream
outputs. Each stage is one single-threaded process, so the fixtures run two at a time (the machine's two cores).
Without ``strace`` (CI installs it, .ci/run) these tests skip, naming it. The checker itself is tested without a
pipeline: reads made through pyarrow, ctypes and a subprocess, a temporary file the stage did not make, a symlink
out of the repository and a probe of another stage's out are each found, the same with strace's seccomp filter as
without; and in a traced clone where no stage ran (the real dvc.yaml), scripts run as a stage: a failed open of
another stage's out, a glob of a folder of the stage's own outs that shows other stages' outs (the atomic writer's
own listing of it passes), a read under ``.dvc/``, a non-dep hard-linked or symlinked into the stage's out, an
exists() of an undeclared file, a failed chdir and a getxattr of another stage's out, a chmod of a file that is no
out, and another stage's out renamed away and back are each found.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from debias.tools.trace import changed_files, check_stage, declared, snapshot
from debias.tools.trace_log import Trace, read_hook, read_strace, strace_command
from tests.conftest import REPO, copy_worktree, unlabelled_image_folder
from tests.faults.conftest import deep_update

HOOK = REPO / "tests" / "trace_hook"


def _strace_problem() -> str | None:
    """Why strace cannot trace here (not installed, or ptrace refused in this container), else None."""
    if shutil.which("strace") is None:
        return "strace is not installed (apt-get install strace; .ci/run installs it)"
    done = subprocess.run(["strace", "-f", "-qq", "-o", os.devnull, "true"], capture_output=True, text=True)
    return None if done.returncode == 0 else f"strace cannot trace here: {done.stderr.strip()[:200]}"


STRACE_PROBLEM = _strace_problem()
pytestmark = pytest.mark.skipif(STRACE_PROBLEM is not None, reason=STRACE_PROBLEM or "")
STAGES = ["source", "download", "inject_bias", "train_erm", "infer_groups", "train_contrastive", "linear_probe",
          "evaluate", "report"]
# Tiny sizes: one or two epochs on 120 images per split; the default methods (cluster groups, CNC).
TINY: dict = {
    "data": {"max_per_split": 120},
    "erm": {"epochs": 2},
    "stage2": {"epochs": 1},
    "probe": {"c_grid": [1.0], "max_iter": 50, "dfr": {"c_grid": [1.0], "retrains": 2}},
    "evaluate": {"splits": ["test"], "mi_max_iter": 20, "umap": {"max_points": 60}},
}


class TracedClone:
    """A scratch copy of the repository whose stages run as DVC runs them (dvc.yaml's command), traced."""

    def __init__(self, root: Path, runtime: Path, changes: dict | None = None) -> None:
        self.root = copy_worktree(root)
        self.runtime = runtime  # the fork servers' socket folder (XDG_RUNTIME_DIR)
        self.base = deep_update(yaml.safe_load((self.root / "params.yaml").read_text()), TINY)
        self.set_params(changes or {})
        for command in (["git", "init", "-q"], ["git", "add", "-A"],
                        ["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "trace"]):
            subprocess.run(command, cwd=self.root, check=True, capture_output=True)
        self.stages = yaml.safe_load((self.root / "dvc.yaml").read_text())["stages"]
        self.runs = 0
        self.output = ""  # every stage's stdout and stderr, in order
        self.traces: dict[str, tuple] = {}  # stage -> (trace, files changed, files before) of its last run

    def set_params(self, changes: dict) -> None:
        """params.yaml: the tiny base with ``changes`` merged in."""
        params = deep_update(copy.deepcopy(self.base), changes)
        (self.root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))

    def external(self) -> list[str]:
        """The data source's external files (absolute), as the source stage fingerprints them."""
        from debias.data.sources.base import external_files
        from debias.schema import load_params

        return [str(p) for p in external_files(load_params(self.root / "params.yaml").data).values()]

    def run(self, name: str) -> list[str]:
        """Run stage ``name``'s dvc.yaml command under strace and the hook; its violations (:func:`check_stage`)."""
        trace = self.trace(name, self.stages[name]["cmd"].split("#", 1)[0])
        assert trace.imports or name == "source", f"{name}: the hook logged no import (is {HOOK} on PYTHONPATH?)"
        assert trace.reads, f"{name}: strace logged no read"
        return self.check(name, self.stages[name])

    def trace(self, name: str, command: str) -> Trace:
        """Run the shell line ``command`` as DVC runs stage ``name`` (in the clone, with DVC's variables), under
        strace and the hook; its trace, kept with the files it changed for :meth:`check`."""
        self.runs += 1
        log = self.root.parent / f"trace-{self.root.name}-{self.runs}-{name}.jsonl"
        os_log = log.with_suffix(".strace")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_TRACKING", "DVC_", "DEBIAS_"))}
        env.update(DEBIAS_TRACKING="off", DEBIAS_THREADS="1", DEBIAS_FORKSERVER="0", DEBIAS_TRACE_LOG=str(log),
                   XDG_RUNTIME_DIR=str(self.runtime),
                   DVC_STAGE=name, DVC_ROOT=str(self.root), PYTHONPATH=os.pathsep.join([str(HOOK), str(self.root / "src")]),
                   PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
        before = snapshot(self.root)
        traced = shlex.join(strace_command(os_log)) + " " + command
        done = subprocess.run(traced, shell=True, cwd=self.root, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, f"{name} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        self.output += done.stdout + done.stderr
        trace = read_strace(os_log, self.root, ignore=(HOOK,)).merge(read_hook(log))
        self.traces[name] = (trace, changed_files(before, snapshot(self.root)), set(before))
        return trace

    def check(self, name: str, entry: dict) -> list[str]:
        """The violations of stage ``name``'s last traced run held against the dvc.yaml entry ``entry``."""
        trace, changed, existed = self.traces[name]
        others = [out for other, stage in self.stages.items() if other != name for out in declared(stage)[1]]
        return check_stage(name, entry, trace, changed, self.root, self.external(), existed=existed,
                           others_outs=others)


def _trace_all(clone: TracedClone) -> dict[str, list[str]]:
    """Every stage of ``clone`` run in order, traced; the violations by stage."""
    return {name: clone.run(name) for name in STAGES}


IMAGE_FOLDER_TRAIN = 32  # training images of the image-folder pipeline


def _trace_image_folder(root: Path, runtime: Path) -> tuple[TracedClone, list[str]]:
    """A pipeline on an image folder (external files: read by source and download alone, through the fingerprint)
    without its attribute column: the no-bias-labels path of every stage, label-free selection rules."""
    clone = TracedClone(root / "repo", runtime, unlabelled_image_folder(root / "shapes", n_train=IMAGE_FOLDER_TRAIN))
    return clone, [problem for problems in _trace_all(clone).values() for problem in problems]


def _selected(request: pytest.FixtureRequest, names: set[str] | dict) -> list[pytest.Item]:
    """This module's selected tests among ``names`` (by function name), in the session's order."""
    return [item for item in request.session.items
            if getattr(item, "module", None) is request.module and getattr(item, "originalname", "") in names]


IMAGE_FOLDER_TESTS = {"test_a_pipeline_on_an_image_folder_without_bias_labels_reads_its_deps_and_writes_its_outs",
                      "test_a_pipeline_on_an_image_folder_without_bias_labels_says_which_numbers_need_them"}


@pytest.fixture(scope="module")
def pipelines(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """The default pipeline and, when its test is selected, the image-folder one, traced side by side: each stage is
    one single-threaded process, so the two pipelines take the machine's two cores."""
    from tests.test_forkserver import _stop_servers

    runtime = Path(tempfile.mkdtemp(prefix="dfs", dir="/tmp"))  # short: a socket path holds < 108 bytes
    pool = ThreadPoolExecutor(max_workers=2)
    default = TracedClone(tmp_path_factory.mktemp("trace") / "repo", runtime)
    futures = {"default": pool.submit(lambda: (default, _trace_all(default)))}
    if _selected(request, IMAGE_FOLDER_TESTS):
        futures["image_folder"] = pool.submit(_trace_image_folder, tmp_path_factory.mktemp("trace-folder"), runtime)
    yield futures
    pool.shutdown(wait=True)
    _stop_servers([str(runtime)])
    shutil.rmtree(runtime, ignore_errors=True)


@pytest.fixture(scope="module")
def default_pipeline(pipelines) -> tuple[TracedClone, dict[str, list[str]]]:
    return pipelines["default"].result()


@pytest.mark.slow
def test_every_stage_of_the_default_pipeline_reads_its_deps_and_writes_its_outs(default_pipeline) -> None:
    _, found = default_pipeline
    problems = [problem for name in STAGES for problem in found[name]]
    assert not problems, "\n".join(problems)


@pytest.mark.slow
def test_a_dep_left_out_of_dvc_yaml_is_found_whoever_reads_it(default_pipeline) -> None:
    """data/groups removed from train_contrastive's and report's deps: their reads (pyarrow's C++ reader, in
    groups/inference.py and report/inputs.py) are violations."""
    clone, _ = default_pipeline
    for name in ("train_contrastive", "report"):
        entry = copy.deepcopy(clone.stages[name])
        entry["deps"] = [d for d in entry["deps"] if d != "data/groups"]
        problems = clone.check(name, entry)
        assert any(p.startswith(f"{name} reads data/groups/") and "not among its deps" in p for p in problems), problems


# --------------------------------------------------------------------------- the checker on reads no hook sees

PROBE_SCRIPT = """
import ctypes, os, subprocess, sys
import pyarrow.parquet as pq
root, outside = sys.argv[1], sys.argv[2]
pq.read_table(os.path.join(root, "data/groups/train.parquet"))                          # pyarrow (C++)
libc = ctypes.CDLL(None)
libc.fopen.restype = ctypes.c_void_p
libc.fclose(ctypes.c_void_p(libc.fopen(os.path.join(root, "data/ctypes.bin").encode(), b"r")))  # ctypes fopen
subprocess.run(["cat", os.path.join(root, "data/cat.txt")], stdout=subprocess.DEVNULL, check=True)
subprocess.run([sys.executable, "-I", "-c", f"open({os.path.join(root, 'data/isolated.txt')!r}).read()"], check=True)
open(os.path.join(root, "data/rplus.txt"), "r+").read()                                 # opened to write, only read
open(outside).read()                                                                     # a temporary file of others
open(os.path.join(root, "data/link.txt")).read()                                         # a symlink out of the repo
os.path.exists(os.path.join(root, "models/stage2.pt"))                                   # another stage's out
with open(os.path.join(root, "out/own.txt"), "w") as handle:                             # its own out, read back
    handle.write("x")
open(os.path.join(root, "out/own.txt")).read()
"""


def _probe_files(root: Path, elsewhere: Path) -> tuple[Path, Path]:
    """The files :data:`PROBE_SCRIPT` reaches: in ``root`` (the repository) and ``elsewhere``; (outside, target)."""
    import pandas as pd

    (root / "data/groups").mkdir(parents=True)
    (root / "out").mkdir()
    pd.DataFrame({"a": [1, 2]}).to_parquet(root / "data/groups/train.parquet")
    for name in ("ctypes.bin", "cat.txt", "isolated.txt", "rplus.txt"):
        (root / "data" / name).write_text("x")
    outside = elsewhere / "left-by-another.txt"
    outside.write_text("x")
    target = elsewhere / "linked.txt"
    target.write_text("x")
    (root / "data/link.txt").symlink_to(target)
    return outside, target


@pytest.mark.slow
def test_the_seccomp_filter_leaves_the_os_trace_as_it_is(tmp_path: Path) -> None:
    """strace with its seccomp filter (the default where strace has it) logs the same file events of the probe
    script as strace stopping at every call."""
    filtered = strace_command(tmp_path / "filtered.strace")
    if "--seccomp-bpf" not in filtered:
        pytest.skip("this strace has no --seccomp-bpf")
    unfiltered = [arg for arg in filtered if arg != "--seccomp-bpf"]
    unfiltered[unfiltered.index("-o") + 1] = str(tmp_path / "unfiltered.strace")
    traces = []
    for prefix, name in ((filtered, "a"), (unfiltered, "b")):
        root, elsewhere = tmp_path / name / "repo", tmp_path / name / "elsewhere"
        elsewhere.mkdir(parents=True)
        outside, _ = _probe_files(root, elsewhere)
        subprocess.run([*prefix, sys.executable, "-c", PROBE_SCRIPT, str(root), str(outside)], check=True)
        trace = read_strace(Path(prefix[prefix.index("-o") + 1]), tmp_path)
        base = str(tmp_path / name)
        traces.append({field: sorted(p.replace(base, "", 1) for p in getattr(trace, field) if p.startswith(base))
                       for field in ("reads", "writes", "probed", "tried", "made", "listed", "changed_metadata")})
    assert traces[0]["reads"] and traces[0]["writes"] and traces[0]["probed"]
    assert traces[0] == traces[1]


@pytest.mark.slow
def test_the_os_trace_sees_reads_of_c_libraries_subprocesses_and_probes(tmp_path: Path) -> None:
    root, elsewhere = tmp_path / "repo", Path(tempfile.mkdtemp(prefix="not-the-stages-"))
    outside, target = _probe_files(root, elsewhere)
    log = tmp_path / "probe.strace"
    before = snapshot(root)
    subprocess.run([*strace_command(log), sys.executable, "-c", PROBE_SCRIPT, str(root), str(outside)], check=True)
    trace = read_strace(log, tmp_path)
    stage = {"deps": ["pipeline/x.py"], "outs": ["out"]}
    problems = check_stage("x", stage, trace, changed_files(before, snapshot(root)), root, existed=set(before),
                           others_outs=["models/stage2.pt"])
    text = "\n".join(problems)
    for rel in ("data/groups/train.parquet", "data/ctypes.bin", "data/cat.txt", "data/isolated.txt", "data/rplus.txt"):
        assert f"x reads {rel}, which is not among its deps" in text, (rel, text)
    assert f"x reads {outside}, outside the repository: a file in a temporary folder the stage did not make" in text
    assert f"x reads {target}" in text  # the symlink judged by where it points
    assert "x probes models/stage2.pt (exists / stat), an out of another stage" in text
    assert "out/own.txt" not in text  # its own out, made and read back
    declared_stage = {"deps": ["pipeline/x.py", "data"], "outs": ["out"]}
    remaining = check_stage("x", declared_stage, trace, changed_files(before, snapshot(root)), root,
                            existed=set(before), others_outs=["models/stage2.pt"])
    assert not [p for p in remaining if "data/" in p.split(",")[0]], remaining  # declared: no longer a violation
    shutil.rmtree(elsewhere)


# --------------------------------------------------------------------------- the blind corners, in a clone


@pytest.fixture(scope="module")
def bare_clone(tmp_path_factory: pytest.TempPathFactory) -> TracedClone:
    """A traced clone of the repository (its dvc.yaml: the real graph and every stage's outs) where no stage ran: a
    fresh clone, as DVC's users have one before ``dvc pull``. Each test below runs a script in it as one stage."""
    runtime = tmp_path_factory.mktemp("runtime")
    return TracedClone(tmp_path_factory.mktemp("bare") / "repo", runtime)


def _as_stage(clone: TracedClone, name: str, script: str) -> list[str]:
    """``script`` run by ``python`` as stage ``name`` of ``clone``; its violations against the stage's real entry."""
    clone.trace(name, f"{shlex.quote(sys.executable)} -c {shlex.quote(script)}")
    return clone.check(name, clone.stages[name])


def _found(problems: list[str], start: str, *parts: str) -> bool:
    """Whether a violation starts with ``start`` (before the module that touched the file) and holds ``parts``."""
    return any(p.startswith(start) and all(part in p for part in parts) for p in problems)


OPTIONAL_READ = """
try:
    print(open("reports/metrics/evaluate.json").read())
except FileNotFoundError:
    print("no evaluate metrics")
"""


def test_a_stage_that_reads_another_stages_out_when_it_exists_is_found_on_a_fresh_clone(bare_clone) -> None:
    """linear_probe reads evaluate's metrics if they are there: on a fresh clone the open fails, and that failure is
    as much a read as the open that succeeds after evaluate ran."""
    metrics = bare_clone.root / "reports/metrics/evaluate.json"
    assert not metrics.exists()  # a fresh clone: evaluate never ran
    problems = _as_stage(bare_clone, "linear_probe", OPTIONAL_READ)
    assert _found(problems, "linear_probe tries to open reports/metrics/evaluate.json", "a failed open",
                  "an out of another stage that is not among its deps"), problems
    metrics.parent.mkdir(parents=True, exist_ok=True)
    metrics.write_text("{}")
    try:
        problems = _as_stage(bare_clone, "linear_probe", OPTIONAL_READ)
        assert _found(problems, "linear_probe reads reports/metrics/evaluate.json", "not among its deps"), problems
    finally:
        metrics.unlink()


WRITE_OWN = """
from debias.core.io import save_json
save_json("reports/metrics/evaluate.json", {"a": 1})
"""
GLOB_METRICS = """
import glob
print(glob.glob("reports/metrics/*.json"))
"""


def test_a_listing_of_a_folder_of_its_own_outs_that_shows_other_stages_outs_is_found(bare_clone) -> None:
    """evaluate writes reports/metrics/evaluate.json (the atomic writer lists the folder to sweep its own dead
    temporaries: no violation); a glob of reports/metrics/*.json there shows the other stages' metrics, which it
    does not depend on."""
    metrics = bare_clone.root / "reports/metrics"
    metrics.mkdir(parents=True, exist_ok=True)
    (metrics / "erm.json").write_text("{}")  # train_erm's
    try:
        quiet = _as_stage(bare_clone, "evaluate", WRITE_OWN)
        assert not [p for p in quiet if "lists the folder" in p], quiet
        problems = _as_stage(bare_clone, "evaluate", WRITE_OWN + GLOB_METRICS)
        assert _found(problems, "evaluate lists the folder reports/metrics", "reports/metrics/erm.json",
                      "not among its deps"), problems
    finally:
        for name in ("erm.json", "evaluate.json"):
            (metrics / name).unlink(missing_ok=True)


DVC_FILES = (".dvc/cache/files/md5/ab/cdef0123456789", ".dvc/tmp/exps/run/task/task.out", ".dvc/config")
READ_DVC = f"""
for name in {DVC_FILES!r}:
    print(open(name).read())
"""


def test_dvcs_cache_temporary_files_and_configuration_are_no_stages_environment(bare_clone) -> None:
    """A stage process needs nothing under .dvc/ (DVC reads its configuration and cache itself): a read of its
    cache, of its temporary files (a queued experiment's log) or of its configuration is a read DVC does not
    track."""
    for rel in DVC_FILES[:2]:
        (bare_clone.root / rel).parent.mkdir(parents=True, exist_ok=True)
        (bare_clone.root / rel).write_text("x")
    try:
        problems = _as_stage(bare_clone, "evaluate", READ_DVC)
        for rel in DVC_FILES:
            assert _found(problems, f"evaluate reads {rel}", "not among its deps"), (rel, problems)
    finally:
        shutil.rmtree(bare_clone.root / ".dvc/cache")
        shutil.rmtree(bare_clone.root / ".dvc/tmp")


LINK = """
import os
os.makedirs("data/evaluate", exist_ok=True)
os.link("data/groups/summary.json", "data/evaluate/summary.json")  # a hard link: the same file, read as its own out
print(open("data/evaluate/summary.json").read())
os.symlink("../../README.md", "data/evaluate/readme.md")           # a symlink: the out is README's, never opened
"""


def test_a_non_dep_linked_into_the_stages_own_out_is_read(bare_clone) -> None:
    """evaluate makes infer_groups' summary (a hard link, read back as its own out) and README.md (a symlink,
    never opened) files of its own out folder data/evaluate: what a link points at is read."""
    summary = bare_clone.root / "data/groups/summary.json"
    summary.parent.mkdir(parents=True, exist_ok=True)
    summary.write_text('{"groups": 4}')
    try:
        problems = _as_stage(bare_clone, "evaluate", LINK)
        assert _found(problems, "evaluate reads data/groups/summary.json", "not among its deps"), problems
        assert _found(problems, "evaluate reads README.md", "not among its deps"), problems
    finally:
        shutil.rmtree(summary.parent)
        shutil.rmtree(bare_clone.root / "data/evaluate", ignore_errors=True)


PLANTED_CODE = ("src/debias/_run_by_runpy.py", "src/debias/_run_by_spec.py", "src/debias/_read_as_data.py")
RUN_CODE = f"""
import importlib.util, runpy
runpy.run_path({PLANTED_CODE[0]!r})
spec = importlib.util.spec_from_file_location("planted", {PLANTED_CODE[1]!r})
spec.loader.exec_module(importlib.util.module_from_spec(spec))
print(len(open({PLANTED_CODE[2]!r}).read()))
"""


def test_code_run_by_runpy_or_a_spec_loader_or_read_as_data_is_a_read(bare_clone) -> None:
    """Code under src/ is judged by the imports the hook sees; code run by ``runpy.run_path`` or a spec loader's
    ``exec_module`` (no import the recorder sees) or read as data is a read DVC does not track."""
    for rel in PLANTED_CODE:
        (bare_clone.root / rel).write_text("VALUE = 1\n")
    try:
        problems = _as_stage(bare_clone, "evaluate", RUN_CODE)
        for rel in PLANTED_CODE:
            assert _found(problems, f"evaluate reads {rel}", "code no import of the stage loaded",
                          "not among its deps"), (rel, problems)
        imported = _as_stage(bare_clone, "evaluate", "import debias._run_by_runpy")
        assert not [p for p in imported if "code no import" in p], imported  # imported: judged as an import
    finally:
        for rel in PLANTED_CODE:
            (bare_clone.root / rel).unlink()


GIT_READS = """
import subprocess
print(subprocess.run(["git", "show", "HEAD:README.md"], capture_output=True, check=True).stdout[:10])
print(open(".git/HEAD").read())
"""
GIT_DECLARED = """
import subprocess
for command in (["git", "show", "HEAD:params.yaml"], ["git", "rev-parse", "--short=12", "HEAD"]):
    subprocess.run(command, capture_output=True, check=True)
"""


def test_git_store_reads_are_judged_by_the_git_command_that_makes_them(bare_clone) -> None:
    """git's objects hold every committed file of every commit: a stage's `git show HEAD:README.md` or its own open
    under .git/ is a read DVC does not track; the report's declared `git show HEAD:params.yaml` and `git rev-parse`
    are not."""
    problems = _as_stage(bare_clone, "report", GIT_READS)
    assert _found(problems, "report reads .git/", "by `git show HEAD:README.md`", "GIT_COMMANDS"), problems
    assert _found(problems, "report reads .git/HEAD", "`python -c import subprocess"), problems  # its own open
    declared = _as_stage(bare_clone, "report", GIT_DECLARED)
    assert not [p for p in declared if ".git/" in p], declared
    elsewhere = _as_stage(bare_clone, "evaluate", GIT_DECLARED)  # the report's commands alone
    assert _found(elsewhere, "evaluate reads .git/", "by `git rev-parse --short=12 HEAD`"), elsewhere


BLIND_CORNERS = {
    "an exists() of an undeclared file": (
        "import os\nprint(os.path.exists('README.md'))",
        "linear_probe probes README.md", "not among its deps", "DVC does not track it"),
    "a failed chdir into another stage's out": (
        "import os\ntry:\n    os.chdir('data/groups')\nexcept OSError:\n    print('no groups')",
        "linear_probe tries to open data/groups", "an out of another stage"),
    "a getxattr of another stage's out": (
        "import os\ntry:\n    os.getxattr('data/erm', 'user.kind')\nexcept OSError:\n    print('no erm')",
        "linear_probe probes data/erm", "an out of another stage"),
    "a chmod of an undeclared file": (
        "import os\nos.chmod('dvc.yaml', os.stat('dvc.yaml').st_mode)",
        "linear_probe changes the mode, owner or times of dvc.yaml", "not among its outs"),
    "another stage's out renamed away and back": (
        "import os\nos.rename('reports/metrics/evaluate.json', 'reports/metrics/away.json')\n"
        "os.rename('reports/metrics/away.json', 'reports/metrics/evaluate.json')",
        "linear_probe moves, removes, links over or changes reports/metrics/evaluate.json", "an out of another stage"),
}


@pytest.mark.parametrize("kind", BLIND_CORNERS)
def test_probes_chdir_xattrs_modes_and_renames_are_seen(bare_clone, kind: str) -> None:
    """Whatever a stage learns of a file by its presence (an exists(), a failed chdir, a getxattr) or does to one
    without changing its bytes (a chmod, renaming another stage's out away and back, which leaves it as it was) is
    found: on a fresh clone (evaluate's metrics planted for the rename)."""
    script, start, *parts = BLIND_CORNERS[kind]
    metrics = bare_clone.root / "reports/metrics/evaluate.json"
    metrics.parent.mkdir(parents=True, exist_ok=True)
    metrics.write_text("{}")
    try:
        problems = _as_stage(bare_clone, "linear_probe", script)
        assert _found(problems, start, *parts), problems
    finally:
        metrics.unlink(missing_ok=True)
        (bare_clone.root / "reports/metrics/away.json").unlink(missing_ok=True)


# --------------------------------------------------------------------------- every variant (slow)


def _stage2_methods() -> list[str]:
    from debias.training.methods.registry import discover

    return sorted(discover())


def _group_methods() -> list[str]:
    from debias.groups.registry import discover

    return sorted(discover())


def _probe_methods() -> list[str]:
    from debias.evaluation.variants import PROBES, import_declarations

    import_declarations()  # the registry fills as its declarations are imported
    return sorted(PROBES)


# each variant test: the stage it reruns and the params section whose ``method`` it sets
VARIANT_TESTS = {
    "test_every_stage2_method_reads_its_deps_and_writes_its_outs": ("train_contrastive", "stage2"),
    "test_every_group_method_reads_its_deps_and_writes_its_outs": ("infer_groups", "groups"),
    "test_every_probe_variant_reads_its_deps_and_writes_its_outs": ("linear_probe", "probe"),
}


@pytest.fixture(scope="module")
def variant_problems(request: pytest.FixtureRequest, default_pipeline) -> dict[tuple[str, str], list[str]]:
    """Each selected variant's stage rerun (one epoch) on the default pipeline's upstream outputs, traced; its
    violations by (stage, method). Two at a time, on the clone and a copy of it (one core each), each copy taking
    every other variant in the tests' order."""
    clone, _ = default_pipeline
    jobs = [(*VARIANT_TESTS[item.originalname], item.callspec.params["method"])
            for item in _selected(request, VARIANT_TESTS)]
    copy_root = clone.root.parent / f"{clone.root.name}-copy"
    shutil.copytree(clone.root, copy_root, symlinks=True)
    twin = copy.copy(clone)
    twin.root, twin.runs = copy_root, 0

    def work(worker: TracedClone, share: list[tuple[str, str, str]]) -> dict[tuple[str, str], list[str]]:
        found = {}
        for stage, section, method in share:
            worker.set_params({section: {"method": method}})
            found[(stage, method)] = worker.run(stage)
        return found

    with ThreadPoolExecutor(max_workers=2) as pool:
        halves = [pool.submit(work, worker, jobs[i::2]) for i, worker in enumerate((clone, twin))]
        return {key: problems for half in halves for key, problems in half.result().items()}


@pytest.mark.slow
@pytest.mark.parametrize("method", _stage2_methods())
def test_every_stage2_method_reads_its_deps_and_writes_its_outs(variant_problems, method: str) -> None:
    """train_contrastive with each registered method, on the default pipeline's upstream outputs (one epoch)."""
    problems = variant_problems[("train_contrastive", method)]
    assert not problems, "\n".join(problems)


@pytest.mark.slow
@pytest.mark.parametrize("method", _group_methods())
def test_every_group_method_reads_its_deps_and_writes_its_outs(variant_problems, method: str) -> None:
    problems = variant_problems[("infer_groups", method)]
    assert not problems, "\n".join(problems)


@pytest.mark.slow
@pytest.mark.parametrize("method", _probe_methods())
def test_every_probe_variant_reads_its_deps_and_writes_its_outs(variant_problems, method: str) -> None:
    problems = variant_problems[("linear_probe", method)]
    assert not problems, "\n".join(problems)


@pytest.mark.slow
def test_a_pipeline_on_an_image_folder_without_bias_labels_reads_its_deps_and_writes_its_outs(pipelines) -> None:
    _, problems = pipelines["image_folder"].result()
    assert not problems, "\n".join(problems)


# --------------------------------------------------------------------------- what it says without bias labels


NUMBER = re.compile(r"^-?\d+(\.\d+)?$")


@pytest.mark.slow
def test_a_pipeline_on_an_image_folder_without_bias_labels_says_which_numbers_need_them(pipelines,
                                                                                          tmp_path: Path) -> None:
    """The image-folder pipeline above (a tiny example folder written without its attribute column): every stage
    completed; the report, `debias compare` and the headline metrics say which numbers need bias labels and show
    none of them as a number; per-class accuracy and the inferred groups are there."""
    from debias.core.errors import NEEDS_BIAS_LABELS
    from debias.tools.compare import compare

    traced, _ = pipelines["image_folder"].result()
    clone = traced.root
    assert "[inject_bias] none (bias.protocol = auto)" in traced.output

    metrics = clone / "reports" / "metrics"
    headline = {}
    for stage in ("inject_bias", "train_erm", "infer_groups", "train_contrastive", "linear_probe", "evaluate"):
        headline.update(json.loads((metrics / f"{stage}.json").read_text()))
    for key in ("erm_worst", "erm_unbiased", "s2_worst", "s2_unbiased", "probe_erm_worst", "probe_s2_worst",
                "groups_matched", "groups_recall", "bias_corr", "align_erm", "mi_a_s2"):
        assert headline[key] == NEEDS_BIAS_LABELS, key
    assert 0 <= headline["erm_worst_class"] <= headline["erm_avg"] <= 1 and 0 <= headline["s2_worst_class"] <= 1
    detailed = json.loads((metrics / "stage2_train.json").read_text())["test"]
    assert detailed["worst_group"] == NEEDS_BIAS_LABELS and detailed["unbiased"] == NEEDS_BIAS_LABELS
    for path in metrics.glob("*.json"):  # no worst-group or unbiased key anywhere holds a number
        def walk(value, where):
            if isinstance(value, dict):
                for key, inner in value.items():
                    if re.search(r"worst_group|unbiased|(^|_)worst$", key) and not key.endswith("_n"):
                        assert not isinstance(inner, (int, float)), f"{path.name}: {where}{key} = {inner}"
                    walk(inner, f"{where}{key}.")
        walk(json.loads(path.read_text()), "")
    selected = json.loads((metrics / "stage2_train.json").read_text())["selection"]
    assert selected["rule"] == "best_worst_inferred_group" and "best_worst_group" not in selected["picks"]
    assert set(selected["picks_test"]) == set(selected["picks"])  # every label-free rule's model, tested
    assert all(row["worst_group"] == NEEDS_BIAS_LABELS and 0 <= row["worst_class"] <= row["avg"]
               for row in selected["picks_test"].values())
    assert (clone / "reports" / "figures" / "discovered_groups.png").stat().st_size > 0  # what the groups captured
    groups = json.loads((metrics / "groups.json").read_text())
    assert sum(row["n"] for row in groups["inferred_groups"]) == IMAGE_FOLDER_TRAIN  # each image in one group

    report = (clone / "reports" / "report.md").read_text()
    for row in ("| worst-group % | needs bias labels | needs bias labels |",
                "| unbiased % (mean over groups) | needs bias labels | needs bias labels |"):
        assert row in report
    assert "Accuracy per group (class y, bias attribute a) needs bias labels" in report
    assert "| y | inferred group | training images n |" in report and "worst-class %" in report
    html = (clone / "reports" / "report.html").read_text()
    assert "needs bias labels" in html and not re.search(r">\s*(nan|NaN)\s*<", html)
    worst_rows = [line for line in report.splitlines() if line.startswith(("| worst-group %", "| unbiased %"))]
    assert worst_rows and not any(NUMBER.match(cell.strip()) for line in worst_rows for cell in line.split("|")[2:-1])

    comparison, _, text = compare(clone, out=tmp_path / "page", mlflow=False)
    frame = comparison.frame.set_index("experiment")
    assert frame.loc["workspace", "s2_worst"] == NEEDS_BIAS_LABELS
    assert frame.loc["workspace", "erm_worst"] == NEEDS_BIAS_LABELS
    assert "needs bias labels (the data has no bias attribute; no number): ERM unbiased, ERM worst-group" in " ".join(
        text.split()) and "nan" not in text.lower().replace("nans", "")
    assert any(line.startswith("experiment") and " wc " in line for line in text.splitlines())  # worst-class shown
