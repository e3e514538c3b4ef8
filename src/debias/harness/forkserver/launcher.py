"""The launcher's side: ask the server for a forked stage process and stand in for it, or start the server."""

from __future__ import annotations

import os
import signal
import socket
import sys
from pathlib import Path

from debias.harness.forkserver.protocol import (ANSWER_SECONDS, SWITCH_VARIABLE, enabled, idle_seconds, interpreter_options,
                                        receive_message, resource_limits, send_message, socket_path, unforkable)

# Signals the launcher passes on to the stage (a signal sent to a plain stage's pid reaches the stage), unless the
# launcher inherited it ignored; SIGTSTP (Ctrl-Z) stops the stage, then the launcher; SIGCONT continues both.
FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2,
                     signal.SIGALRM, signal.SIGWINCH, signal.SIGTSTP, signal.SIGCONT)
# Ours: how long the launcher waits for a stage it killed (its watcher lost) to end before it exits.
KILL_WAIT_SECONDS = 10.0


# ----------------------------------------------------------------------------------------------- launcher side

def process_state(script: str, args: list[str]) -> dict:
    """What the forked process takes over from the launcher (read before the launcher installs its own handlers)."""
    umask = os.umask(0)
    os.umask(umask)
    ignored = [int(signum) for signum in signal.valid_signals() if _ignored(signum)]
    blocked = sorted(int(signum) for signum in signal.pthread_sigmask(signal.SIG_BLOCK, []))
    return {"script": script, "args": args, "pid": os.getpid(), "cwd": os.getcwd(), "environ": dict(os.environ),
            "umask": umask, "limits": resource_limits(), "affinity": sorted(os.sched_getaffinity(0)),
            "ignored": ignored, "blocked": blocked,
            "orig_argv": [sys.executable, *interpreter_options(list(getattr(sys, "orig_argv", []))), script, *args]}


def _ignored(signum: int) -> bool:
    try:
        return signal.getsignal(signum) == signal.SIG_IGN
    except (OSError, ValueError):
        return False


def start_server(path: Path, options: list[str]) -> None:
    """Start the server for ``path`` in the background (detached: its own session, no inherited streams)."""
    pid = os.fork()
    if pid:  # the launcher goes on with the stage at once; the first child exits right away
        os.waitpid(pid, 0)
        return
    try:
        os.setsid()
        if os.fork():
            os._exit(0)
        log = os.open(f"{path}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)  # emptied by the lock's holder
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.execv(sys.executable, [sys.executable, *options, "-m", "debias.harness.forkserver", str(path), *options])
    finally:
        os._exit(1)


def _server_starting(path: Path) -> bool:
    """True while a server for ``path`` holds its lock (starting up or serving)."""
    import fcntl

    try:
        fd = os.open(f"{path}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        return True  # cannot tell: do not start another
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)  # closing drops a lock taken here
    return False


def run_stage(script: str, args: list[str]) -> int | None:
    """Run ``python SCRIPT ARGS`` in a process forked by the server; its exit code (128 + N for signal N, after
    this process has passed the signal on), or None where the caller should run the stage itself. ``ValueError``
    naming the setting for a bad ``DEBIAS_FORKSERVER_IDLE``."""
    environ = dict(os.environ)
    if not enabled(environ):
        return None
    idle_seconds(environ)
    if unforkable(resource_limits()) is not None:  # e.g. `ulimit -v`: the stage runs as its own process
        return None
    options = interpreter_options(list(getattr(sys, "orig_argv", [])))
    path = socket_path(environ, options)
    if path is None:
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(str(path))
    except OSError:
        sock.close()
        if not _server_starting(path) and not Path(f"{path}.failed").exists():  # a server that gave up: its log says why
            start_server(path, options)
        return None
    with sock:
        try:
            state = process_state(script, args)
        except OSError:  # e.g. the working folder is gone: the stage itself says so
            return None
        return _stand_in(sock, state)


def _stand_in(sock: socket.socket, state: dict) -> int | None:
    pending: list[int] = []
    stage: list[int] = []  # its pid, then a pidfd of it

    def forward(signum: int, _frame: object) -> None:
        if not stage:
            pending.append(signum)
            return
        _signal_stage(stage, signum)
        if signum == signal.SIGTSTP:  # then stop here too, as a plain stage's launcher (itself) would
            os.kill(os.getpid(), signal.SIGSTOP)

    previous = {signum: signal.signal(signum, forward) for signum in FORWARDED_SIGNALS if signum not in state["ignored"]}
    try:
        try:
            sock.settimeout(ANSWER_SECONDS)
            send_message(sock, state, [0, 1, 2])
            started, _ = receive_message(sock)
            sock.settimeout(None)
        except (OSError, EOFError, ValueError):  # (a timeout too) closing the socket kills a stage forked late
            return None  # nothing ran: the caller runs the stage itself
        if "plain" in started:  # a fork would not be the process the launcher would start
            return None
        if "error" in started:
            print(f"[debias.harness.forkserver] {started['error']}; running the stage in its own process", file=sys.stderr)
            return None
        stage.extend(_open_stage(int(started["pid"])))
        for signum in pending:
            forward(signum, None)
        try:
            ended, _ = receive_message(sock)
        except (OSError, EOFError, ValueError) as exc:
            _kill_stage(stage)
            print(f"[debias.harness.forkserver] lost the fork server while it ran {state['script']} ({exc}): the stage was "
                  f"killed with it (it writes nothing more; its outcome is unknown); rerun it, with "
                  f"{SWITCH_VARIABLE}=0 to run it in its own process", file=sys.stderr)
            return 1
        if "error" in ended:  # nothing of the stage ran
            print(f"[debias.harness.forkserver] {ended['error']}; running the stage in its own process", file=sys.stderr)
            return None
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if len(stage) > 1:
            os.close(stage[1])
        if not stage:  # no fork took them: they are this process's own again, as for the stage it may become
            for signum in pending:
                signal.raise_signal(signum)
    status = int(ended["status"])
    if os.WIFSIGNALED(status):
        signum = os.WTERMSIG(status)
        sys.stdout.flush()
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)  # die of the same signal, as the stage did
        return 128 + signum
    return os.WEXITSTATUS(status)


def _open_stage(pid: int) -> list[int]:
    """``[pid, pidfd]`` of the stage (a pidfd names that process even once its pid is reused), ``[pid]`` where
    none can be had."""
    try:
        return [pid, os.pidfd_open(pid)]
    except (OSError, AttributeError):
        return [pid]


def _signal_stage(stage: list[int], signum: int) -> None:
    try:
        if len(stage) > 1:
            signal.pidfd_send_signal(stage[1], signum)
        else:
            os.kill(stage[0], signum)
    except ProcessLookupError:
        pass


def _kill_stage(stage: list[int]) -> bool:
    """SIGKILL the stage and its process group (its watcher is gone: the stage's death signal has fired, this
    covers its children) and wait for it to end, up to :data:`KILL_WAIT_SECONDS`; True if it had already ended."""
    import select

    if len(stage) < 2:
        _signal_stage(stage, signal.SIGKILL)
        return False
    if select.select([stage[1]], [], [], 0)[0]:
        return True
    _signal_stage(stage, signal.SIGKILL)
    try:
        os.killpg(stage[0], signal.SIGKILL)  # its children (the group outlives its leader while they live)
    except (ProcessLookupError, PermissionError):
        pass
    select.select([stage[1]], [], [], KILL_WAIT_SECONDS)
    return False
