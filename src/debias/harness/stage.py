"""The harness every pipeline entrypoint runs in: params, checks, threads, MLflow run, one-line errors.

An entrypoint names its stage and the params it reads (exactly those dvc.yaml declares for
it) and passes a body ``(params, run) -> None``. Before the body starts, the params are
validated, ``DEBIAS_DEVICE`` is checked and every folder the stage writes into is probed for
writability, so none of these fails after minutes of work; each declared param changed since the stage's last run
that this run does not read is printed as an ``unread-param`` warning (:mod:`debias.harness.unread`); code DVC
cannot see is refused (:func:`check_imports`, before and after the body); and a stage whose params changed while it
ran fails, removing what it wrote (:func:`check_params_unchanged`). Failures a user can act on end the process with
one line naming the cause and what to do, and a non-zero exit code, instead of a traceback (``DEBIAS_DEBUG=1``
re-raises):

- a :class:`debias.core.errors.DebiasError` (bad params, data, files, tracking, memory, divergence), or
  ``FileNotFoundError`` / ``ValueError`` from the stage's own checks: exit 2;
- a disk that is full or read-only, a file-size limit, a permission refused (``OSError``): exit 2;
- an out-of-memory error: exit 2 with the params to lower;
- Ctrl-C: exit 130, the MLflow run ended KILLED (as SIGTERM does).
While the body runs, the progress research code reports goes to stderr and its memory checks run (:func:`installed`).
Every message is cut to :data:`MESSAGE_LIMIT` characters: no value is ever echoed unbounded.
Outputs are written atomically, so a stage run by hand (``python pipeline/<stage>.py``) that fails leaves the
previous outputs intact; under DVC (``dvc repro``, ``dvc exp run``: ``$DVC_STAGE`` set) DVC has already removed
the stage's outputs (``persist: true`` ones excepted) before running it, and the message says so and how to get
them back (:func:`outputs_note`); the git-tracked headline metrics, which ``dvc checkout`` cannot restore, are put
back as dvc.lock records them when the stage fails, and the message says so (:func:`restore_headline`).
Under ``torchrun`` every rank runs the body; only rank 0 opens the MLflow run and writes the run
record (:func:`debias.harness.tracking.stage_run`), and the other ranks name themselves in error messages.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from debias.core.errors import DebiasError, ParamsError, ResourceError, StaleInputError, uncommitted_params_hint
from debias.core.paths import RUNS
from debias.core.headline import UNREAD_KEY
from debias.harness.unread import unread_since_last_run
from debias.params import Params, as_dict
from debias.schema import load_params, read_params

if TYPE_CHECKING:  # tracking (MLflow) is imported inside main(), after the params and the device are checked
    from debias.core.headline import Restored
    from debias.harness.tracking import StageRun

MESSAGE_LIMIT = 2000  # characters of an error message printed; the rest is cut with a note

# The params each stage reads; dvc.yaml declares exactly these (tests/test_repo.py checks).
STAGE_PARAMS: dict[str, list[str]] = {
    "source": ["data"],  # pipeline/source.py: a fingerprint of external data files, not a harnessed stage
    "download": ["seed", "data"],
    "inject_bias": ["seed", "bias"],
    "train_erm": ["seed", "model", "erm", "health"],
    "infer_groups": ["seed", "groups"],
    "train_contrastive": ["seed", "model", "stage2", "loss", "health"],
    "linear_probe": ["seed", "probe"],
    "evaluate": ["seed", "evaluate"],
    "report": ["report"],  # plus params.yaml as a file dependency: the report shows every changed param
}

# OSError numbers a user fixes on the machine, with what to do.
OS_ADVICE: dict[int, str] = {
    errno.ENOSPC: "the disk is full: free space (or point TMPDIR / the repository elsewhere) and rerun",
    errno.EDQUOT: "the disk quota is exhausted: free space and rerun",
    errno.EFBIG: "a file-size limit (ulimit -f) stopped the write: raise it and rerun",
    errno.EROFS: "the file system is read-only: make it writable or run from a writable copy",
    errno.EACCES: "permission denied: make the folder writable for this user",
    errno.EPERM: "operation not permitted: make the folder writable for this user",
}


def bounded(message: str, limit: int = MESSAGE_LIMIT) -> str:
    """``message`` cut to ``limit`` characters, saying how much was left out."""
    if len(message) <= limit:
        return message
    return f"{message[:limit]} ... [{len(message) - limit:,} more characters cut]"


@functools.lru_cache(maxsize=4)
def _dvc_yaml_stages(text: str) -> dict:
    """The ``stages`` of a dvc.yaml text, parsed once per distinct text (libyaml where installed: 5 ms against
    85 ms in pure Python, and the stage process reads it four times); callers must not modify it."""
    import yaml

    loaded = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)) or {}
    return loaded.get("stages", {}) or {}


def stage_entry(stage: str, dvc_yaml: Path = Path("dvc.yaml")) -> dict:
    """The stage's entry in dvc.yaml; {} without a dvc.yaml or the stage."""
    if not dvc_yaml.exists():
        return {}
    return _dvc_yaml_stages(dvc_yaml.read_text(encoding="utf-8")).get(stage, {}) or {}


def stage_outputs(stage: str, dvc_yaml: Path = Path("dvc.yaml")) -> list[Path]:
    """The paths dvc.yaml declares as the stage's outputs (outs, metrics, plots); [] without a dvc.yaml."""
    entries = stage_entry(stage, dvc_yaml)
    paths: list[Path] = []
    for kind in ("outs", "metrics", "plots"):
        for entry in entries.get(kind, []) or []:
            paths.append(Path(next(iter(entry)) if isinstance(entry, dict) else entry))
    return paths


def outputs_note() -> str:
    """What is true of the stage's previous outputs after it failed: under DVC (``$DVC_STAGE`` set, as DVC sets it
    for every stage command) DVC removed them before the command ran, and ``dvc checkout <stage>`` restores the
    cached ones dvc.lock records (the git-tracked headline file: :func:`headline_note`); run by hand, the atomic
    writes left them intact."""
    addressing = os.environ.get("DVC_STAGE", "").strip()
    if addressing:
        return (f"DVC removed this stage's previous outputs before running it (persist: true ones excepted); "
                f"`dvc checkout {addressing}` restores the ones dvc.lock records")
    return "the previous outputs are intact"


# What the failure path did with the stage's git-tracked headline file (:func:`restore_headline`), for the message.
_RESTORED: list[str] = []
GIT_TRACKED = "(git-tracked, which `dvc checkout` does not restore)"


def restored_note(done: Restored) -> str:
    """One clause saying what :func:`debias.core.headline.restore_recorded` left and, where the numbers dvc.lock
    records are not there, what brings them back."""
    if done.source is not None:
        return (f"{done.path} {GIT_TRACKED} holds the numbers dvc.lock records"
                + (f", put back from {done.source}" if done.source else ""))
    if done.recorded:
        return (f"{done.path} {GIT_TRACKED} has no copy here that matches dvc.lock: `git checkout` it with dvc.lock, "
                "or `dvc repro` recomputes it")
    return f"{done.path} is absent: dvc.lock records no run of this stage, and `dvc repro` writes it"


def restore_headline(stage: str) -> None:
    """On a failed stage's way out under DVC (``$DVC_STAGE`` set; the harness calls it on the main rank): put back
    its git-tracked headline metrics, which DVC deleted before running it and ``dvc checkout`` (``cache: false``) does
    not restore, as dvc.lock records them (:func:`debias.core.headline.restore_recorded`, from HEAD or DVC's cache),
    and keep what was done for the message (:func:`headline_note`). A successful run reads none of dvc.lock, HEAD or
    DVC's cache (the trace holds it to its deps); a failed one produces no result, so what it reads here while
    cleaning up is an input of none."""
    from debias.core.headline import headline_path, restore_recorded

    _RESTORED.clear()
    if not os.environ.get("DVC_STAGE", "").strip():
        return
    try:
        done = restore_recorded(stage)
    except Exception as exc:  # the clean-up's own failure never hides the stage's error
        _RESTORED.append(f"{headline_path(stage).as_posix()} {GIT_TRACKED} could not be put back as dvc.lock records "
                         f"it ({type(exc).__name__}: {bounded(str(exc), 200)}): `git checkout` it with dvc.lock, or "
                         "`dvc repro` recomputes it")
        return
    if done is not None:
        _RESTORED.append(restored_note(done))


def headline_note() -> str:
    """``'; <what the failure path left of the headline file>'`` to follow :func:`outputs_note`; empty where
    :func:`restore_headline` did nothing (run by hand, a stage without a headline file, no failure)."""
    return "".join(f"; {note}" for note in _RESTORED)


def check_writable(outputs: list[Path]) -> None:
    """Create and delete a file in the folder of every output (made if missing): refuse a read-only or full
    disk now, before any work, naming the folder. A real write, not ``os.access``, which ignores read-only
    mounts and says yes to root."""
    folders = sorted({(path if not path.suffix and not path.is_file() else path.parent) for path in outputs})
    for folder in folders:
        try:
            folder.mkdir(parents=True, exist_ok=True)
            handle, probe = tempfile.mkstemp(prefix=".write-probe.", suffix=".tmp", dir=folder)
            os.close(handle)
            os.unlink(probe)
        except OSError as exc:
            advice = OS_ADVICE.get(exc.errno or 0, "fix the folder's permissions or disk")
            raise ResourceError(f"cannot write into {folder}/ ({exc.strerror}): {advice}; nothing was run and "
                                f"{outputs_note()}") from None


def publish(stage: str, run: StageRun) -> None:
    """After a stage's body: its headline file ``reports/metrics/<stage>.json`` (:mod:`debias.core.headline`), logged
    to its MLflow run with its warnings; on the pipeline's parent run, the headline metrics and warnings of this
    stage and those before it (their files are current; later stages' files may be an earlier run's)."""
    from debias.core.headline import local_warnings, read_headlines, upstream_stages, warnings_summary, write_headline

    values = write_headline(stage)
    if values:
        run.log_metrics(values)
    for path in stage_outputs(stage):  # small JSON/CSV outputs, for `debias compare --source mlflow`
        if path.suffix in (".json", ".csv") and path.is_file() and path.parent != RUNS and path.stat().st_size < 5e6:
            run.log_artifact(path, f"outputs/{path.parent.as_posix()}")
    own = local_warnings(stages=(stage,)).get(stage, []) + list(getattr(run, "notes", {}).get(UNREAD_KEY, []))
    if own:
        run.set_tags({"debias.warnings": "\n".join(own)[:5000]})
        run.log_metrics({"warnings": float(len(own))})
    stages = upstream_stages(stage)
    if not stages or not run.parent_id:
        return
    by_stage = local_warnings(stages=stages)
    tags = {f"debias.warnings.{name}": "\n".join(messages)[:5000] for name, messages in by_stage.items()}
    tags["debias.warnings"] = warnings_summary(by_stage)
    metrics = read_headlines(stages=stages)
    metrics["warnings"] = float(sum(len(messages) for messages in by_stage.values()))
    run.log_parent(metrics, tags)


def check_params_unchanged(stage: str, params: Params, read: bytes | None = None) -> None:
    """Fail the stage, removing the outputs it wrote, when params.yaml no longer holds the declared params it read as
    it started: another run in the same workspace (a second ``dvc exp run -S``) wrote its values while this one ran,
    and DVC would record those beside outputs computed from these (``dvc status`` clean, the model another run's).
    ``read``: the bytes ``params`` were read from (:func:`debias.schema.read_params`); a file that still holds them
    holds the same params and is not validated again."""
    from debias.core.trees import flatten

    if read is not None and _bytes_or_none(Path("params.yaml")) == read:
        return
    keys = STAGE_PARAMS[stage]
    before = flatten(as_dict(params, keys))
    try:
        after = flatten(as_dict(load_params(), keys))
    except ParamsError as exc:
        after, invalid = {}, f"; params.yaml is now invalid: {str(exc).splitlines()[0]}"
    else:
        invalid = ""
    changed = [key for key in sorted(set(before) | set(after)) if before.get(key) != after.get(key)]
    if not changed:
        return
    removed = []
    from debias.core.headline import headline_path

    for path in stage_outputs(stage):
        if path == headline_path(stage):  # not written yet: by hand the previous run's; under DVC the failure path
            continue  # puts back the one dvc.lock records (restore_headline)
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        elif path.exists() or path.is_symlink():
            path.unlink()
        else:
            continue
        removed.append(str(path))
    shown = ", ".join(f"{key} {before.get(key)!r} -> {after.get(key, '(missing)')!r}" for key in changed[:5])
    raise StaleInputError(
        f"params.yaml changed while {stage} ran ({shown}{', ...' if len(changed) > 5 else ''}{invalid}): another run "
        f"in this workspace (a second `dvc exp run -S`?) wrote it. The outputs computed with the values read at the "
        f"start are removed ({len(removed)}: {', '.join(removed[:4])}{', ...' if len(removed) > 4 else ''}), so none "
        "stands under params it was not computed with; run one experiment at a time in a workspace, or queue them "
        "(`dvc exp run --queue`), then rerun")


def _bytes_or_none(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:
        return None


def _fail(who: str, message: str, code: int = 2) -> None:
    text = bounded(message)
    if os.environ.get("DVC_STAGE", "").strip():  # under DVC: the outputs are gone, the headline file put back
        if "DVC removed" not in text:
            text += f"\n({outputs_note()}{headline_note()})"
        elif headline_note():  # a message that already said what DVC removed (before the failure path ran)
            text += f"\n({headline_note().removeprefix('; ')})"
    print(f"[{who}] error: {text}\n(set DEBIAS_DEBUG=1 for the traceback)", file=sys.stderr)
    sys.exit(code)


def is_stage_process(stage: str) -> bool:
    """Whether this process is ``python [-u ...] pipeline/<stage>.py`` itself (the script the interpreter was started
    with, sys.orig_argv: runpy and pytest rewrite sys.argv[0], not this), not a test or script running stages
    in-process."""
    script = getattr(sys.modules.get("__main__"), "__file__", None)
    words = [word for word in getattr(sys, "orig_argv", [])[1:] if not word.startswith("-")]
    return not (script is None or Path(script).name != f"{stage}.py" or not words
                or Path(words[0]).resolve() != Path(script).resolve())


def stage_deps(stage: str, dvc_yaml: Path = Path("dvc.yaml")) -> list[str]:
    """The paths dvc.yaml declares as the stage's deps, its code files (``meta: code``) included; [] without one."""
    from debias.core.fingerprint import stage_code_files

    return [*(str(dep) for dep in stage_entry(stage, dvc_yaml).get("deps") or []),
            *stage_code_files({stage: stage_entry(stage, dvc_yaml)}, stage)]


def check_code_fingerprint(stage: str, root: Path = Path(".")) -> None:
    """Under DVC, refuse a stage whose code changed since ``source`` fingerprinted it: DVC compares the stage's
    ``data/code/<stage>.json`` (its one code dep), so it would record this run against the code it did not run.
    ``dvc repro -s`` (``--single-item``) skips ``source``; a plain ``dvc repro`` runs it first."""
    from debias.core.fingerprint import code_fingerprint, stale_code, stage_code_files
    from debias.core.io import load_json
    from debias.core.paths import code_fingerprint_path

    recorded = root / code_fingerprint_path(stage)
    files = stage_code_files({stage: stage_entry(stage, root / "dvc.yaml")}, stage)
    if not os.environ.get("DVC_STAGE") or not files or not recorded.is_file():
        return
    try:
        changed = stale_code(load_json(recorded), code_fingerprint(files, root))
    except FileNotFoundError as exc:
        changed = [str(exc)]
    if changed:
        raise StaleInputError(
            f"{stage}'s code changed since the `source` stage fingerprinted it into {code_fingerprint_path(stage)} "
            f"({', '.join(changed[:4])}{', ...' if len(changed) > 4 else ''}): DVC would record this run against "
            f"code it did not run. `dvc repro -s` skips `source`; run `dvc repro {stage}` (it runs `source` first), "
            "or `dvc repro source` and then your command")


def installation_folders() -> tuple[str, ...]:
    """The interpreter's own folders, each resolved and ending in a separator: its prefixes, the standard library
    and its site-packages (the user's included), where installed packages live."""
    import site
    import sysconfig

    return tuple(sorted({os.path.join(os.path.realpath(folder), "") for folder in (
        sys.prefix, sys.base_prefix, sys.exec_prefix, *sysconfig.get_paths().values(), *site.getsitepackages(),
        site.getusersitepackages()) if folder}))


# The modules the interpreter's ``site`` imports at start-up from anywhere on the path, before any stage code runs
# (the code of a ``.pth`` file is run from site-packages, part of the installation).
INTERPRETER_HOOKS = ("sitecustomize", "usercustomize")
SIDE_CHANNEL_MARK = "DEBIAS_SIDE_CHANNEL"  # a hook's module-level declaration that it changes no result, and why


def unseen_hooks() -> list[str]:
    """The interpreter hooks (:data:`INTERPRETER_HOOKS`) this process ran from outside the interpreter's installation
    (:func:`installation_folders`: a ``src/sitecustomize.py`` on the path of an editable install, a folder on
    PYTHONPATH), each as ``'name (path)'``; a hook that declares ``DEBIAS_SIDE_CHANNEL = "<why it changes no result>"``
    (a profiler, an import recorder) is left out. Such a hook can change what every stage computes (a default dtype, a
    patched function), and no stage's deps name it: DVC would rerun nothing when it changes."""
    installed = installation_folders()
    found = []
    for name in INTERPRETER_HOOKS:
        module = sys.modules.get(name)
        file = getattr(module, "__file__", None)
        if module is None or not isinstance(file, str) or isinstance(getattr(module, SIDE_CHANNEL_MARK, None), str):
            continue
        paths = (os.path.abspath(file), os.path.realpath(file))  # Debian links its own into /etc
        if not any(path.startswith(installed) for path in paths):
            found.append(f"{name} ({paths[0]})")
    return found


# Module files' resolved paths, kept for the process (its imports are checked before and after the body).
_RESOLVED: dict[str, str] = {}


def resolved(path: str) -> str:
    """``os.path.realpath(path)`` of an absolute path, each folder resolved once per process and every answer kept:
    the same path, without a system call for every component of each of a stage's thousands of module files."""
    found = _RESOLVED.get(path)
    if found is None:
        folder, name = os.path.split(path)
        real_folder = _RESOLVED.get(folder)
        if real_folder is None:
            real_folder = _RESOLVED[folder] = os.path.realpath(folder)
        joined = os.path.join(real_folder, name)
        found = _RESOLVED[path] = os.path.realpath(joined) if os.path.islink(joined) else joined
    return found


def unseen_modules(stage: str, root: Path = Path(".")) -> list[str]:
    """Code this stage process imported that DVC cannot see, each as ``'module (path)'``: a module outside the
    ``debias`` package (which the code deps and the trace cover) whose file lies in the repository but under none of
    the stage's deps (a helper beside the entrypoints, a plugin folder on PYTHONPATH), or outside the repository and
    neither under the interpreter's folders nor of an installed distribution (editable installs included). Editing
    either would rerun nothing. Interpreter hooks (``sitecustomize``) are :func:`unseen_hooks`'s."""
    installed = installation_folders()
    candidates = []
    for name, module in sorted(sys.modules.items()):
        file = getattr(module, "__file__", None)
        if (not isinstance(file, str) or not os.path.isabs(file) or name.startswith(("__", "code_model_"))
                or name in INTERPRETER_HOOKS or name.split(".")[0] == "debias"):
            continue  # no file of its own (torch.ops' is a bare name), the scripts run as __main__ (the fork server's
            # as __mp_main__ too), MLflow loading the harness's model code (and its copy) as code_model_<id>, a
            # hook, or the package (derived and traced)
        real = resolved(file)
        if not real.startswith(installed):
            candidates.append((name, real))
    if not candidates:
        return []
    from importlib.metadata import packages_distributions  # a scan of every distribution: only when needed

    distributed = set(packages_distributions())  # top-level names installed distributions provide (editable too)
    base = os.path.realpath(root)
    deps = [dep.rstrip("/") for dep in stage_deps(stage, root / "dvc.yaml")]
    found = []
    for name, real in candidates:
        if name.split(".")[0] in distributed:
            continue
        if real.startswith(base + os.sep):
            rel = os.path.relpath(real, base)
            if any(rel == dep or rel.startswith(dep + "/") for dep in deps):
                continue
            found.append(f"{name} ({rel}, in the repository but not among {stage}'s deps in dvc.yaml)")
        else:
            found.append(f"{name} ({real}, outside the repository and the installed packages)")
    return found


def check_imports(stage: str) -> None:
    """Refuse a stage process that ran an interpreter hook DVC cannot see (:func:`unseen_hooks`) or imported code DVC
    cannot see (:func:`unseen_modules`), before its body (the entrypoint's own imports) and after it (what the body
    imported); only in a stage process of its own."""
    if not is_stage_process(stage):
        return
    hooks = unseen_hooks()
    if hooks:
        raise DebiasError(
            f"the interpreter ran {'; '.join(hooks)} at start-up, a hook outside its installation: it can change what "
            f"{stage} computes (a default dtype, a patched function), and no stage's deps name it, so editing it would "
            "rerun nothing. Take it off the path (PYTHONPATH, src/) or move what it does into src/debias; a hook that "
            f"changes no result (a profiler, an import recorder) says so with a module-level {SIDE_CHANNEL_MARK} = "
            '"<why>"')
    found = unseen_modules(stage)
    if found:
        raise DebiasError(
            f"{stage} imports code DVC does not track, so editing it would rerun nothing: {'; '.join(found[:5])}"
            f"{'; ...' if len(found) > 5 else ''}. Move it into src/debias (its imports become deps: "
            "`debias deps --write`), list its file or folder among the stage's deps in dvc.yaml, or install it as "
            "a package (a plugin's entry point: docs/extending.md)")


def end_stage_process(stage: str) -> None:
    """End a stage process that finished its work, skipping the interpreter's own finalization.

    Tearing down the modules of torch, MLflow, scikit-learn and pandas (garbage collection, module
    dictionaries, destructors) took 1.0-1.7 CPU s after every stage on a 2-core machine, after the
    outputs were already on disk. Only where this process is ``python pipeline/<stage>.py`` itself (not a
    test or script running stages in-process), no non-daemon thread is still running, and ``DEBIAS_FAST_EXIT``
    is not ``0`` (set it for profilers that write their results at exit): the ``atexit`` handlers run (the
    logging shutdown, the process group's), standard streams are flushed, and the process exits 0 with
    ``os._exit``. Every output is written atomically and closed before this point; MLflow's SQLite
    transactions are committed as each call returns.
    """
    import threading

    if os.environ.get("DEBIAS_FAST_EXIT", "1").strip() == "0":
        return
    if not is_stage_process(stage):
        return
    if any(thread.is_alive() and not thread.daemon and thread is not threading.main_thread()
           for thread in threading.enumerate()):
        return
    import atexit

    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(0)


@contextlib.contextmanager
def installed(activity: object = None) -> Iterator[None]:
    """The harness's side of what research code reports into and asks of it (:mod:`debias.core.progress`,
    :mod:`debias.core.resources`): progress to stderr (kept in ``activity`` for the stage's heartbeat) and the memory
    check, for the block; cleared afterwards."""
    from debias.core.progress import reporting
    from debias.core.resources import checking
    from debias.harness.memory import CHECK
    from debias.harness.progress import TerminalReporter

    reporter = TerminalReporter(activity)
    try:
        with reporting(reporter), checking(CHECK):
            yield
    finally:
        reporter.close()


def main(stage: str, body: Callable[[Params, "StageRun"], None]) -> None:  # noqa: F821 (StageRun: lazy import)
    """Validate params, check device and outputs, open the stage's MLflow run and run ``body``; from the start to
    the end a line on stderr at least every 15 s (:func:`debias.harness.progress.stage_heartbeat`)."""
    from debias.harness.progress import stage_heartbeat

    with stage_heartbeat(stage) as activity:
        try:
            _run(stage, body, activity)
        except SystemExit:
            raise  # its message said what the failure path left (_fail, Ctrl-C)
        except BaseException:  # a traceback follows: what was left of the headline file first
            if headline_note():
                print(f"[{stage}] {headline_note().removeprefix('; ')}", file=sys.stderr, flush=True)
            raise


def _run(stage: str, body: Callable[[Params, "StageRun"], None], activity: object) -> None:  # noqa: F821
    from debias.core import distributed
    from debias.core.runtime import configure_threads, pick_device

    params, params_read = None, None
    who = ", ".join(filter(None, [stage, "" if distributed.is_main() else distributed.describe()]))
    debug = bool(os.environ.get("DEBIAS_DEBUG"))
    _RESTORED.clear()  # one stage per process under DVC; several when a test or script runs stages in one process
    try:
        try:
            params, params_read = read_params()
            pick_device()  # a DEBIAS_DEVICE this machine lacks fails here, not after data loading
            configure_threads()
            unread: list[str] = []
            check_imports(stage)
            check_code_fingerprint(stage)
            if distributed.is_main():
                check_writable(stage_outputs(stage))
                unread = unread_since_last_run(stage, params, STAGE_PARAMS[stage])
                for message in unread:  # said before the body loads data or trains
                    print(f"[{stage}] WARNING {bounded(message)}", file=sys.stderr, flush=True)
            from debias.harness.tracking import stage_run

            with stage_run(stage, as_dict(params, STAGE_PARAMS[stage]), record_path=RUNS / f"{stage}.json") as run, \
                    installed(activity):
                if unread:
                    run.note(UNREAD_KEY, unread)
                body(params, run)
                check_imports(stage)
                if distributed.is_main():
                    check_params_unchanged(stage, params, params_read)
                    publish(stage, run)
            end_stage_process(stage)
        except BaseException as exc:  # failed or interrupted: the recorded headline file back, before any message
            if distributed.is_main() and not (isinstance(exc, SystemExit) and not exc.code):
                restore_headline(stage)
            raise
    except KeyboardInterrupt:
        if debug:
            raise
        print(f"[{who}] interrupted (Ctrl-C); {outputs_note()}{headline_note()}", file=sys.stderr)
        sys.exit(130)
    except (DebiasError, FileNotFoundError, ValueError) as exc:
        if debug:
            raise
        _fail(who, str(exc) + (uncommitted_params_hint() if isinstance(exc, ParamsError) else ""))
    except OSError as exc:  # disk full, read-only, size limit, permission: the machine, not the code
        if debug or exc.errno not in OS_ADVICE:
            raise
        where = f" writing {exc.filename}" if exc.filename else ""
        _fail(who, f"{exc.strerror}{where}: {OS_ADVICE[exc.errno]}; {outputs_note()}")
    except (MemoryError, RuntimeError) as exc:  # a real out-of-memory error: say what to lower
        from debias.harness.memory import is_out_of_memory, out_of_memory_advice

        if debug or not is_out_of_memory(exc):
            raise
        first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        _fail(who, f"out of memory ({type(exc).__name__}: {first_line}); to reduce it, "
                   f"{out_of_memory_advice(stage, params)}")
