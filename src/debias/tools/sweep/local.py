"""The local launcher: DVC's own queue (``dvc exp run --queue``, ``dvc queue start -j N``) and its status."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

from debias.harness.progress import Heartbeat
from debias.tools.sweep.grid import Job, set_args
from debias.tools.sweep.watch import SweepWatch
from debias.tools.sweep.workspace import as_process, finished_experiments, run

# ``dvc queue status`` -> sweep state; a requeued name lists several entries: the first of STATUS_PRIORITY wins.
STATUS_PRIORITY = ("Running", "Queued", "Success", "Failed")
QUEUE_STATES = {"Running": "running", "Queued": "queued", "Success": "done", "Failed": "failed"}
LOST_NOTE = ("DVC's queue says it succeeded, but DVC collected no experiment of its name (experiments ending at once "
             "can race there); `debias sweep --resume` reruns it")
# DVC's record of each queued experiment's process: <rev>/<rev>.json (pid, returncode; dvc-task's ProcessInfo) and
# its output <rev>/<rev>.out.
RUN_RECORDS = Path(".dvc", "tmp", "exps", "run")
# ours: after an experiment's process exits its worker still collects the results (a git ref, the outputs into the
# cache) before DVC lists it done; an entry still listed Running this long after its process exited is orphaned.
ORPHAN_GRACE_S = 120.0


def pid_alive(pid: int) -> bool:
    """Whether a process of that pid exists (one of another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def ended_process(root: Path, task: str, now: float | None = None) -> str | None:
    """Why the process of queue task ``task`` (``dvc queue status``'s 7-character rev) has ended for good, from DVC's
    record of it: exited over :data:`ORPHAN_GRACE_S` ago, or its pid gone without an exit recorded (the wrapper
    that records it died with it); None while it runs, just after it exited, or without a record."""
    now = time.time() if now is None else now
    for record in (root / RUN_RECORDS).glob(f"{task}*/{task}*.json"):
        try:
            info, written = json.loads(record.read_text()), record.stat().st_mtime
        except (OSError, ValueError):
            continue
        code, pid = info.get("returncode"), info.get("pid")
        if code is not None and now - written > ORPHAN_GRACE_S:
            return f"its process exited (code {code}) {now - written:.0f} s ago"
        if code is None and isinstance(pid, int) and not pid_alive(pid):
            return f"its process {pid} is gone"
    return None


def orphaned(root: Path, text: str) -> dict[str, str]:
    """Task -> why, for each entry ``dvc queue status`` (``text``) lists Running whose process ended for good
    (:func:`ended_process`): ``dvc queue kill`` can leave an entry Running in DVC's queue with no worker on it."""
    found = {}
    for line in text.splitlines():
        words = line.split()
        if len(words) > 2 and "Running" in words[2:]:
            why = ended_process(root, words[0])
            if why is not None:
                found[words[0]] = why
    return found


def parse_queue_status(text: str, orphans: Collection[str] = ()) -> dict[str, str]:
    """Experiment name -> DVC status (Queued, Running, Success, Failed) from ``dvc queue status``'s text
    (columns: task, name, created..., status); several entries of one name: the first of STATUS_PRIORITY. A Running
    entry whose task is in ``orphans`` (:func:`orphaned`) counts as Failed."""
    statuses: dict[str, str] = {}
    for line in text.splitlines():
        words = line.split()
        found = [status for status in STATUS_PRIORITY if status in words[2:]]
        if found and found[0] == "Running" and words[0] in orphans:
            found = ["Failed"]
        if found:
            current = statuses.get(words[1])
            if current is None or STATUS_PRIORITY.index(found[0]) < STATUS_PRIORITY.index(current):
                statuses[words[1]] = found[0]
    return statuses


def queue_text(root: Path, attempts: int = 3) -> str:
    """``dvc queue status``'s task lines (task, name, created, status), read in this process through the API the
    command prints (about 0.1 s a poll once DVC is imported, against a 1-2 s process that also asks each worker
    over celery for the line this leaves out). Reading fails now and then while workers write the queue: retried,
    and a queue that cannot be read raises rather than reporting every experiment failed."""
    from dvc.repo import Repo
    from dvc.repo.experiments.show import format_time

    for attempt in range(attempts):
        try:
            with Repo(str(root)) as repo:
                tasks = repo.experiments.celery_queue.status()
            return "".join(f"{task['rev'][:7]}  {task.get('name') or ''}  {format_time(task.get('timestamp'))}  "
                           f"{task['status']}\n" for task in tasks)
        except Exception as exc:  # DVC's own errors, and a queue file caught half-written
            error = exc
            time.sleep(2 * (attempt + 1))
    raise RuntimeError(f"reading DVC's queue failed {attempts} times in {root}: {type(error).__name__}: "
                       f"{str(error)[-500:]}")


def queue_args(job: Job) -> list[str]:
    """The job's command line after ``dvc``: ``exp run --queue -n NAME -S KEY=VALUE ... [TARGETS]``."""
    return ["exp", "run", "--queue", "-n", job.name, *set_args(job.overrides), *job.targets]


def queue_experiment(root: Path, job: Job, env: dict[str, str]) -> None:
    """``dvc exp run --queue ...`` (:func:`queue_args`) as DVC's CLI runs it in ``root`` under ``env`` (its own parser,
    command class and :class:`dvc.repo.Repo`, :func:`as_process`), in this process: the same queue entry without
    starting DVC once per experiment (about 1 s each); a DVC error raises, naming the command."""
    from dvc.cli import parse_args
    from dvc.repo import Repo

    args = parse_args(queue_args(job))
    try:
        with as_process(root, env), Repo(_wait_for_lock=args.wait_for_lock) as repo:  # CmdBase.__init__'s Repo
            command = args.func.__new__(args.func)
            command.repo, command.config, command.args = repo, repo.config, args
            command.run()
    except Exception as exc:  # DVC's own errors: said as the command's failure was
        raise RuntimeError(f"dvc {shlex.join(queue_args(job))} failed: {type(exc).__name__}: {exc}") from exc


def start_workers(root: Path, workers: int, env: dict[str, str]) -> bool:
    """``dvc queue start -j N``: tops the queue up to N workers (running ones are kept; idle ones exit). A failure
    (seen once: exit 255 while 2 workers ran, the next call fine) is reported and retried at the next poll."""
    # The workers outlive the command and inherit its stdout: no pipe, or waiting on it waits for them.
    done = subprocess.run(["dvc", "queue", "start", "-j", str(workers)], cwd=root, env=env,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if done.returncode != 0:
        print(f"[sweep] dvc queue start -j {workers} exited {done.returncode}; retried at the next poll",
              file=sys.stderr, flush=True)
    return done.returncode == 0


def queue_status(root: Path) -> dict[str, str]:
    return parse_queue_status(queue_text(root))


def needs_workers(text: str, workers: int, orphans: Collection[str] = ()) -> bool:
    """Whether to top the queue up (``text``: ``dvc queue status``'s): an experiment is queued and fewer than
    ``workers`` run (an orphaned Running entry, ``orphans``, is no worker). ``dvc queue start -j N`` counts its
    workers by asking them (celery ``inspect``, 1 s); one busy in a stage may not answer and then gets a second
    worker of its name: N + 1 experiments at once (seen: -j 3, 4)."""
    states = list(parse_queue_status(text, orphans).values())
    return "Queued" in states and states.count("Running") < workers


def top_up(root: Path, workers: int, env: dict[str, str], text: str | None = None) -> None:
    """:func:`start_workers` where :func:`needs_workers` says so (``text``: a fresh ``dvc queue status``)."""
    text = queue_text(root) if text is None else text
    if needs_workers(text, workers, orphaned(root, text)):
        start_workers(root, workers, env)


def queue_log(root: Path, name: str, text: str) -> str:
    """Where DVC keeps a queued experiment's output (``.dvc/tmp/exps/run/<task>/<task>.out``; ``text``: ``dvc queue
    status``'s), else the command that prints it."""
    for line in text.splitlines():
        words = line.split()
        if len(words) > 1 and words[1] == name:
            found = list((root / ".dvc" / "tmp" / "exps" / "run").glob(f"{words[0]}*/*.out"))
            if found:
                return str(found[0])
    return f"dvc queue logs {name}"


def running_logs(root: Path, text: str, statuses: dict[str, str], names: Collection[str]) -> dict[str, Path | None]:
    """Each of ``names`` DVC lists Running (``statuses``), with its queue log (None before DVC made one)."""
    logs: dict[str, Path | None] = {}
    for name in sorted(n for n in names if statuses.get(n) == "Running"):
        where = queue_log(root, name, text)
        logs[name] = Path(where) if not where.startswith("dvc queue logs") else None
    return logs


def _print(line: str) -> None:
    print(line, flush=True)


def lost_experiments(root: Path, names: Collection[str], statuses: dict[str, str]) -> list[str]:
    """The ``names`` DVC's queue lists as succeeded (``statuses``) of which no experiment exists: a queue task
    collects its experiment into the repository before it ends, and two tasks ending at once can race there, one
    experiment lost while its task still says Success."""
    done = finished_experiments(root, run(["git", "rev-parse", "HEAD"], root).strip())
    return sorted(n for n in names if statuses.get(n) == "Success" and n not in done)


def run_local(root: Path, jobs: list[Job], workers: int, env: dict[str, str], deadline: float = float("inf"),
              poll_s: float = 10.0, log: str = "sweep", started: float | None = None, watch: SweepWatch | None = None,
              say: Callable[[str], None] | None = None, retry_lost: bool = True) -> list[str]:
    """Queue ``jobs`` (in order) that are not done, queued or running, run them on ``workers`` DVC queue workers
    and wait. Workers start after the first ``workers`` experiments are queued, so queueing overlaps running.
    At ``deadline`` (a ``time.time()``) the queue is stopped and unfinished experiments are left out. An entry DVC
    lists Running whose process ended for good (:func:`orphaned`) is said once and counted as failed. Returns
    the names that did not succeed (failed ones are printed with the end of their log). Progress: a line whenever an
    experiment finishes, the time counted from ``started`` (the sweep's start, its shared upstream included; default:
    now), and between them the heartbeat of ``watch`` (its own when none is given: a line at least every 15 s naming
    each running experiment's stage, epoch and ETA; ``say`` writes the lines). An experiment the queue says succeeded
    but DVC did not collect (:func:`lost_experiments`) is said and queued once more (``retry_lost``), else failed."""
    if watch is None or say is None:
        watch = SweepWatch(log, started)
        with Heartbeat(watch.line) as beat:
            return run_local(root, jobs, workers, env, deadline, poll_s, log, started, watch, beat.say, retry_lost)
    watch.update(doing="reading DVC's queue and experiments")
    present = queue_status(root)
    done = finished_experiments(root, run(["git", "rev-parse", "HEAD"], root).strip())
    todo = [job for job in jobs if job.name not in done and present.get(job.name) not in ("Queued", "Running")]
    started = time.time() if started is None else started
    names = {job.name for job in jobs}
    before = len(names & done)
    watch.phase(f"{len(names) - before} experiments on DVC's queue ({workers} workers)", len(names) - before,
                workers=workers)
    try:
        for count, job in enumerate(todo, 1):
            watch.update(doing=f"queueing experiment {count}/{len(todo)} ({job.name}) on DVC's queue")
            queue_experiment(root, job, env)
            if count % workers == 0:
                top_up(root, workers, env)
            if time.time() > deadline:
                break
        finished, statuses = _wait_for_queue(root, names, done, before, workers, env, deadline, poll_s, log, started,
                                             watch, say)
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM (debias sweep turns it into this): the queue stops with it
        stop_experiments(root, names, say, log)
        raise
    watch.update(logs={})
    if len(finished) < len(names):
        say(f"[{log}] stopping the queue with {len(names) - len(finished)} experiments unfinished")
        stop_experiments(root, [n for n in names if statuses.get(n) in ("Queued", "Running")], say, log)
    for name in sorted(n for n in names if statuses.get(n) == "Failed"):
        print(f"[{log}] experiment {name} FAILED:\n{run(['dvc', 'queue', 'logs', name], root, check=False)[-3000:]}",
              file=sys.stderr)
    lost = lost_experiments(root, names, statuses)
    if lost:
        say(f"[{log}] DVC's queue says {', '.join(lost)} succeeded, but DVC collected no experiment of "
            f"{'that name' if len(lost) == 1 else 'those names'} (experiments ending at once can race there): "
            + ("queueing them again" if retry_lost else "counted as failed; `debias sweep --resume` reruns them"))
        if retry_lost:
            failed = run_local(root, [job for job in jobs if job.name in lost], workers, env, deadline, poll_s, log,
                               started, watch, say, retry_lost=False)
            return sorted({*failed, *(n for n in names if statuses.get(n) != "Success")})
    return sorted({*lost, *(n for n in names if statuses.get(n) != "Success")})


def stop_experiments(root: Path, names: Collection[str], say: Callable[[str], None], log: str = "sweep") -> None:
    """Take ``names`` off DVC's queue: the queued ones removed, the running ones killed (``dvc queue remove`` /
    ``kill`` by name: another sweep's or a user's queued experiments stay); said, with the command that resumes."""
    text = queue_text(root)
    statuses = parse_queue_status(text, orphaned(root, text))
    queued = sorted(n for n in names if statuses.get(n) == "Queued")
    running = sorted(n for n in names if statuses.get(n) == "Running")
    if queued:
        run(["dvc", "queue", "remove", *queued], root, check=False)
    if running:
        run(["dvc", "queue", "kill", *running], root, check=False)
    say(f"[{log}] stopped: {len(running)} running experiment(s) killed, {len(queued)} queued one(s) taken off DVC's "
        "queue; `debias sweep --resume` with the sweep's --name reruns them")


def _wait_for_queue(root: Path, names: set[str], done: set[str], before: int, workers: int, env: dict[str, str],
                    deadline: float, poll_s: float, log: str, started: float, watch: SweepWatch,
                    say: Callable[[str], None]) -> tuple[list[str], dict[str, str]]:
    """Poll DVC's queue until ``names`` finished, nothing of them is left to run, or ``deadline``; the names
    finished and each one's DVC status (an orphaned entry, :func:`orphaned`, is said once, where nothing else of
    its name succeeded or runs: an earlier killed attempt of an experiment that finished since is no failure)."""
    top_up(root, workers, env)
    reported, told = -1, set()
    while True:
        text = queue_text(root)
        orphans = orphaned(root, text)
        statuses = {**parse_queue_status(text, orphans), **{name: "Success" for name in done}}
        for line in text.splitlines():
            words = line.split()
            if (len(words) > 1 and words[0] in orphans and words[0] not in told and words[1] in names
                    and statuses.get(words[1]) == "Failed"):
                told.add(words[0])
                say(f"[{log}] {words[1]}: DVC lists it Running, but {orphans[words[0]]} (stopped by `dvc queue "
                    "kill`?): counted as failed; `debias sweep --resume` reruns it")
        finished = [n for n in names if statuses.get(n) in ("Success", "Failed")]
        running = sum(statuses.get(n) == "Running" for n in names)
        queued = sum(statuses.get(n) == "Queued" for n in names)
        counts = f"{len(finished)}/{len(names)} experiments done, {running} running, {queued} queued"
        watch.update(doing="waiting for DVC's queue", logs=running_logs(root, text, statuses, names), counts=counts,
                     done=len(finished) - before)
        if len(finished) != reported:
            reported = len(finished)
            say(f"[{log}] {counts}, {time.time() - started:.0f} s since the start")
        if len(finished) == len(names) or time.time() > deadline:
            break
        if not any(statuses.get(n) in ("Queued", "Running") for n in names):
            break  # nothing left to run (e.g. experiments not queued before the deadline)
        top_up(root, workers, env, text)  # idle workers exit while queueing is slower than running
        time.sleep(poll_s)
    return finished, statuses


def local_states(root: Path, state: dict[str, Any]) -> dict[str, tuple[str, str]]:
    done = finished_experiments(root, state["commit"])
    text = queue_text(root)
    queued = parse_queue_status(text, orphaned(root, text))
    states = {}
    for job in state["jobs"]:
        name = job["name"]
        status = "done" if name in done else QUEUE_STATES.get(queued.get(name, ""), "failed")
        if name not in done and name not in queued:
            status = "failed" if state.get("launched") else "queued"
        lost = status == "done" and name not in done  # the queue says Success; DVC collected no experiment
        status = "failed" if lost else status
        states[name] = ("failed", LOST_NOTE) if lost else (
            status, queue_log(root, name, text) if status in ("failed", "running") else "")
    return states
