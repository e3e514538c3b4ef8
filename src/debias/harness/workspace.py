"""One DVC run at a time in a workspace: a second ``dvc exp run`` (or ``dvc repro``) started where another one runs is
refused by its first stage command, naming the running one.

DVC does not stop two ``dvc exp run`` that both start from the workspace: each writes its ``-S`` values into
params.yaml and both run stages in the same folders, so neither result can be kept. Every stage command starts
with :func:`claim` (:mod:`debias.harness.launch`, before the stage runs; ``source``, which DVC runs first in every
run, included). The DVC process running the command (the nearest ``dvc`` ancestor, :func:`dvc_ancestor`: one for
all the stages of a run, each stage being a process of its own) claims the workspace in :data:`CLAIM`, with its pid,
start time, command line and the params.yaml text it started with, under an exclusive ``flock`` of :data:`LOCK`, so
two processes never both claim it:

- a claim of the same DVC process (a later stage of the same run) or none: the command goes on;
- a claim of a DVC process that has ended, or whose pid another process now has (another start time): stale,
  replaced by this one's;
- a claim of another DVC process that still runs: the command is refused, naming it, and params.yaml is put back to
  the text the running one started with (this run wrote its ``-S`` values into it before its first stage), so the
  running one, whose stages fail when params.yaml changes under them, finishes. DVC's clean-up of the refused
  ``dvc exp run`` then removes the refs of the workspace's experiment executor (``refs/exps/exec/*``: one set per
  workspace, which the running one commits its experiment from); the claim keeps the running one's
  (:func:`exec_refs`), and a process the refusal leaves behind puts them back once the refused DVC process has ended
  (:func:`restore_when_gone`), so the running one is saved as its experiment.

Queued and ``--temp`` experiments run in a workspace of their own (``.dvc/tmp/exps/...``, with its own ``.dvc``) and
so claim their own. A stage command started outside DVC (by hand, by the tests) claims nothing. The launcher reaches
this module for every stage, so it imports nothing but the standard library: a module of the package here would
become every stage's dependency (:mod:`debias.tools.deps` follows a side channel's imports).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CLAIM = Path(".dvc/tmp/debias-run.json")  # DVC's own .dvc/tmp: git-ignored, never part of an experiment
LOCK = Path(".dvc/tmp/debias-run.lock")
PARAMS = Path("params.yaml")
EXEC_REFS = "refs/exps/exec/"  # DVC 3's workspace experiment executor: EXEC_BASELINE, EXEC_MERGE, EXEC_HEAD, ...


def process_info(pid: int) -> tuple[list[str], int, str] | None:
    """``(argv, parent pid, start time)`` of a process: /proc on Linux, else ``ps``; None when it is gone."""
    proc = Path("/proc") / str(pid)
    if proc.is_dir():
        try:
            argv = [a for a in (proc / "cmdline").read_bytes().decode(errors="replace").split("\0") if a]
            fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
            return argv, int(fields[1]), fields[19]  # fields after the name: state, ppid, ..., starttime (22nd)
        except (OSError, IndexError, ValueError):
            return None
    try:
        out = subprocess.run(["ps", "-o", "ppid=", "-o", "lstart=", "-o", "args=", "-p", str(pid)],
                             capture_output=True, text=True, timeout=5).stdout.split()
    except (OSError, subprocess.TimeoutExpired):
        return None
    if len(out) < 7:
        return None
    return out[6:], int(out[0]), "-".join(out[1:6])


def is_dvc_command(argv: list[str]) -> bool:
    """Whether ``argv`` runs DVC: ``dvc ...``, ``python /path/bin/dvc ...`` or ``python -m dvc ...``."""
    head = argv[:3]
    if any(Path(arg).name == "dvc" for arg in head[:2]):
        return True
    return any(a == "-m" and b == "dvc" for a, b in zip(head, head[1:]))


def dvc_ancestor(pid: int, max_depth: int = 32) -> tuple[int, list[str], str] | None:
    """``(pid, argv, start time)`` of the nearest ``dvc`` process among ``pid`` and its ancestors (the ``dvc repro``,
    ``dvc exp run`` or queued ``dvc exp exec-run`` running a stage), None outside DVC."""
    for _ in range(max_depth):
        if pid <= 1:
            return None
        info = process_info(pid)
        if info is None:
            return None
        argv, parent, started = info
        if is_dvc_command(argv):
            return pid, argv, started
        pid = parent
    return None


def started_when(started: str) -> str:
    """A process start time as local ``YYYY-MM-DD HH:MM:SS``: /proc's clock ticks since boot (``btime`` of
    /proc/stat added), or ``ps``'s own words as they are."""
    if not started.isdigit():
        return started.replace("-", " ")
    try:
        boot = next(int(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                    if line.startswith("btime "))
    except (OSError, StopIteration, ValueError):
        return f"{started} ticks after boot"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(boot + int(started) / os.sysconf("SC_CLK_TCK")))


def _running(record: dict) -> bool:
    """Whether the claim's process still runs: its pid has its start time."""
    info = process_info(int(record.get("pid", 0))) if str(record.get("pid", "")).isdigit() else None
    return info is not None and info[2] == record.get("started")


def _read(path: Path) -> dict | None:
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def _replace(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` (through a link: the file it points to) via a temporary file renamed over it."""
    target = path.resolve()
    handle, temporary = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            stream.write(text)
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def dvc_command(argv: list[str]) -> str:
    """A DVC command line as its user typed it: ``dvc exp run -S seed=1`` for ``python /venv/bin/dvc exp run -S
    seed=1`` or ``python -m dvc exp run -S seed=1``."""
    for i, word in enumerate(argv[:3]):
        if Path(word).name == "dvc" and (i == 0 or argv[i - 1] != "-m"):
            return " ".join(["dvc", *argv[i + 1:]])
        if word == "-m" and argv[i + 1:i + 2] == ["dvc"]:
            return " ".join(["dvc", *argv[i + 2:]])
    return " ".join(argv)


def refusal(record: dict) -> str:
    """The message refusing a run in a workspace that the running DVC process of ``record`` holds."""
    command = dvc_command([str(word) for word in record.get("argv") or ["dvc"]])
    command = command if len(command) <= 300 else command[:299] + "…"
    return (f"another `{command}` (pid {record.get('pid')}, started {started_when(str(record.get('started')))}) is "
            "running in this workspace: wait for it to end, or give each experiment a workspace of its own "
            "(`dvc exp run --queue ...` then `dvc queue start`, or `dvc exp run --temp ...`). params.yaml is back to "
            "the values the running one started with (this run's -S values are undone), so that it can finish; "
            "nothing else was run or removed")


def _git(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=30, check=False)


def exec_refs(root: Path) -> dict[str, list[str]]:
    """``{ref: [object, symbolic target]}`` of the refs of DVC's workspace experiment executor (:data:`EXEC_REFS`)
    in the repository at ``root``; {} outside git or outside a ``dvc exp run``."""
    try:
        done = _git(root, "for-each-ref", "--format=%(refname)%00%(objectname)%00%(symref)", EXEC_REFS)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    rows = [line.split("\0") for line in done.stdout.splitlines()] if done.returncode == 0 else []
    return {row[0]: row[1:3] for row in rows if len(row) == 3}


def restore_exec_refs(root: Path, refs: dict[str, list[str]]) -> list[str]:
    """Set each ref of ``refs`` (:func:`exec_refs`) back where it differs now; the refs set back."""
    now = exec_refs(root)
    restored = []
    for ref, (target, symbolic) in sorted(refs.items()):
        if now.get(ref) == [target, symbolic]:
            continue
        args = ["symbolic-ref", ref, symbolic] if symbolic else ["update-ref", ref, target]
        if _git(root, *args).returncode == 0:
            restored.append(ref)
    return restored


def restore_when_gone(root: Path, pid: int, started: str, owner: int, owner_started: str,
                      timeout: float = 3600, poll: float = 0.05) -> list[str]:
    """Wait until the refused DVC process (``pid`` started at ``started``) has ended, then, if the claim is still the
    running one's (``owner``) and it still runs, put back the executor refs its claim keeps (:func:`exec_refs`),
    which the refused one's clean-up removed; the refs set back."""
    deadline = time.monotonic() + timeout
    while (info := process_info(pid)) is not None and info[2] == started and time.monotonic() < deadline:
        time.sleep(poll)
    import fcntl

    with open(root / LOCK, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        record = _read(root / CLAIM)
        if record is None or (record.get("pid"), record.get("started")) != (owner, owner_started) or not _running(record):
            return []
        return restore_exec_refs(root, record.get("exec_refs") or {})


def _leave_restorer(root: Path, pid: int, started: str, record: dict) -> None:
    """Start :func:`restore_when_gone` in a process of its own session that outlives this one (DVC waits for this
    command, not for it), its streams closed."""
    code = ("import sys; from pathlib import Path; from debias.harness.workspace import restore_when_gone; "
            "restore_when_gone(Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), sys.argv[5])")
    subprocess.Popen([sys.executable, "-c", code, str(root.resolve()), str(pid), started, str(record["pid"]),
                      str(record["started"])], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True)


def claim(root: Path = Path("."), start: int | None = None) -> str | None:
    """Claim the workspace at ``root`` for the DVC process running this command (found from ``start``, default this
    process's parent); the refusal message (params.yaml put back) when another DVC process that still runs holds
    it, else None (outside DVC, or outside a DVC repository: nothing claimed)."""
    found = dvc_ancestor(os.getppid() if start is None else start)
    if found is None or not (root / ".dvc").is_dir():
        return None
    try:
        import fcntl
    except ImportError:  # no flock on this platform: no claim
        return None
    pid, argv, started = found
    (root / LOCK).parent.mkdir(parents=True, exist_ok=True)
    with open(root / LOCK, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # released when the file is closed
        record = _read(root / CLAIM)
        if record is not None and (record.get("pid"), record.get("started")) == (pid, started):
            return None  # a later stage of the same run
        if record is not None and _running(record):
            text = record.get("params")
            if isinstance(text, str) and (root / PARAMS).is_file() and (root / PARAMS).read_text(encoding="utf-8") != text:
                _replace(root / PARAMS, text)
            if record.get("exec_refs"):
                _leave_restorer(root, pid, started, record)
            return refusal(record)
        params = (root / PARAMS).read_text(encoding="utf-8") if (root / PARAMS).is_file() else None
        _replace(root / CLAIM, json.dumps({"pid": pid, "started": started, "argv": argv, "params": params,
                                           "exec_refs": exec_refs(root), "claimed": time.time()}))
    return None
