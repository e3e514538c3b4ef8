"""The local launcher: DVC's own queue (``dvc exp run --queue``, ``dvc queue start -j N``) and its status."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from debias.tools.sweep.grid import Job, set_args
from debias.tools.sweep.workspace import finished_experiments, run

# ``dvc queue status`` -> sweep state; a requeued name lists several entries: the first of STATUS_PRIORITY wins.
STATUS_PRIORITY = ("Running", "Queued", "Success", "Failed")
QUEUE_STATES = {"Running": "running", "Queued": "queued", "Success": "done", "Failed": "failed"}


def parse_queue_status(text: str) -> dict[str, str]:
    """Experiment name -> DVC status (Queued, Running, Success, Failed) from ``dvc queue status``'s text
    (columns: task, name, created..., status); several entries of one name: the first of STATUS_PRIORITY."""
    statuses: dict[str, str] = {}
    for line in text.splitlines():
        words = line.split()
        found = [status for status in STATUS_PRIORITY if status in words[2:]]
        if found:
            current = statuses.get(words[1])
            if current is None or STATUS_PRIORITY.index(found[0]) < STATUS_PRIORITY.index(current):
                statuses[words[1]] = found[0]
    return statuses


def queue_text(root: Path, attempts: int = 3) -> str:
    """``dvc queue status``'s text; it fails now and then while workers write the queue (retried: a queue that
    cannot be read raises rather than reporting every experiment failed)."""
    for attempt in range(attempts):
        done = subprocess.run(["dvc", "queue", "status"], cwd=root, capture_output=True, text=True)
        if done.returncode == 0:
            return done.stdout
        time.sleep(2 * (attempt + 1))
    raise RuntimeError(f"dvc queue status failed {attempts} times in {root}: {done.stderr.strip()[-500:]}")


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


def needs_workers(text: str, workers: int) -> bool:
    """Whether to top the queue up (``text``: ``dvc queue status``'s): an experiment is queued and fewer than
    ``workers`` run. ``dvc queue start -j N`` counts its workers by asking them (celery ``inspect``, 1 s); one busy
    in a stage may not answer and then gets a second worker of its name: N + 1 experiments at once (seen: -j 3, 4)."""
    states = list(parse_queue_status(text).values())
    return "Queued" in states and states.count("Running") < workers


def top_up(root: Path, workers: int, env: dict[str, str], text: str | None = None) -> None:
    """:func:`start_workers` where :func:`needs_workers` says so (``text``: a fresh ``dvc queue status``)."""
    if needs_workers(queue_text(root) if text is None else text, workers):
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


def run_local(root: Path, jobs: list[Job], workers: int, env: dict[str, str], deadline: float = float("inf"),
              poll_s: float = 10.0, log: str = "sweep") -> list[str]:
    """Queue ``jobs`` (in order) that are not done, queued or running, run them on ``workers`` DVC queue workers
    and wait. Workers start after the first ``workers`` experiments are queued, so queueing overlaps running.
    At ``deadline`` (a ``time.time()``) the queue is stopped and unfinished experiments are left out. Returns
    the names that did not succeed (failed ones are printed with the end of their log)."""
    present = queue_status(root)
    done = finished_experiments(root, run(["git", "rev-parse", "HEAD"], root).strip())
    todo = [job for job in jobs if job.name not in done and present.get(job.name) not in ("Success", "Queued", "Running")]
    started = time.time()
    for count, job in enumerate(todo, 1):
        run(["dvc", "exp", "run", "--queue", "-n", job.name, *set_args(job.overrides), *job.targets], root, env)
        if count % workers == 0:
            top_up(root, workers, env)
        if time.time() > deadline:
            break
    top_up(root, workers, env)
    names = {job.name for job in jobs}
    reported = -1
    while True:
        text = queue_text(root)
        statuses = {**parse_queue_status(text), **{name: "Success" for name in done}}
        finished = [n for n in names if statuses.get(n) in ("Success", "Failed")]
        if len(finished) != reported:
            reported = len(finished)
            print(f"[{log}] {reported}/{len(names)} experiments done after {time.time() - started:.0f} s", flush=True)
        if len(finished) == len(names) or time.time() > deadline:
            break
        if not any(statuses.get(n) in ("Queued", "Running") for n in names):
            break  # nothing left to run (e.g. experiments not queued before the deadline)
        top_up(root, workers, env, text)  # idle workers exit while queueing is slower than running
        time.sleep(poll_s)
    if len(finished) < len(names):
        print(f"[{log}] stopping the queue with {len(names) - len(finished)} experiments unfinished", flush=True)
        run(["dvc", "queue", "remove", "--queued"], root, check=False)
        run(["dvc", "queue", "kill", *[n for n in names if statuses.get(n) == "Running"]], root, check=False)
    for name in sorted(n for n in names if statuses.get(n) == "Failed"):
        print(f"[{log}] experiment {name} FAILED:\n{run(['dvc', 'queue', 'logs', name], root, check=False)[-3000:]}",
              file=sys.stderr)
    return sorted(n for n in names if statuses.get(n) != "Success")


def local_states(root: Path, state: dict[str, Any]) -> dict[str, tuple[str, str]]:
    done = finished_experiments(root, state["commit"])
    text = queue_text(root)
    queued = parse_queue_status(text)
    states = {}
    for job in state["jobs"]:
        name = job["name"]
        status = "done" if name in done else QUEUE_STATES.get(queued.get(name, ""), "failed")
        if name not in done and name not in queued:
            status = "failed" if state.get("launched") else "queued"
        states[name] = (status, queue_log(root, name, text) if status in ("failed", "running") else "")
    return states
