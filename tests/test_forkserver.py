"""The fork server (debias.forkserver): a stage forked from the warm server behaves as ``python SCRIPT ARGS`` would.

A real server is started (its own socket folder, a short idle lifetime) and a probe script run through
``python -m debias.launch --single``: the process it reports must be a fork (a pid other than the launcher's),
with the launcher's arguments, folder, environment, umask, streams, exit codes and signals, and none of the
server's ``debias`` modules. Linux only, as the server.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from debias import embedding, forkserver
from debias.forkserver import server as server_module
from debias.forkserver.server import _serve_one as serve_one

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the fork server runs on Linux only")

PROBE = textwrap.dedent("""
    import json, os, sys, tempfile, time
    loaded = sorted(name for name in sys.modules if name == "debias" or name.startswith("debias."))
    report = {"pid": os.getpid(), "argv": sys.argv, "cwd": os.getcwd(), "path0": sys.path[0], "loaded": loaded,
              "probe": os.environ.get("DEBIAS_PROBE"), "other": os.environ.get("SOME_RUNTIME_SETTING"),
              "launcher": os.environ.get("DEBIAS_LAUNCHER_PID"), "umask": os.umask(0), "tmp": tempfile.gettempdir(),
              "orig_argv": sys.orig_argv}
    print(json.dumps(report), flush=True)
    print("to stderr", file=sys.stderr)
    action = sys.argv[1] if len(sys.argv) > 1 else ""
    if action == "exit":
        sys.exit(int(sys.argv[2]))
    if action == "message":
        sys.exit("a message for the user")
    if action == "raise":
        raise ValueError("boom")
    if action == "sleep":
        open(sys.argv[2], "w").write(str(os.getpid()))
        time.sleep(120)
""")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A folder with the probe, and the environment of a fork server of its own (started, then waited for)."""
    root = tmp_path_factory.mktemp("forkserver")
    runtime = Path(tempfile.mkdtemp(prefix="dfs", dir="/tmp"))  # short: a socket path holds < 108 bytes
    (root / "probe.py").write_text(PROBE)
    env = {**os.environ, "XDG_RUNTIME_DIR": str(runtime), "DEBIAS_FORKSERVER_IDLE": "120", "DEBIAS_FORKSERVER": "1",
           "TMPDIR": str(root)}
    first = launch(root, env, [])  # no server yet: runs by itself and starts one
    assert first.returncode == 0, first.stderr
    deadline = time.monotonic() + 120
    while not list(runtime.glob("debias/*.sock")):
        assert time.monotonic() < deadline, "the fork server did not start: " + "".join(
            p.read_text() for p in runtime.glob("debias/*.log"))
        time.sleep(0.2)
    yield root, env
    _stop_servers([str(path) for path in runtime.glob("debias/*.sock")])


def _stop_servers(sockets: list[str]) -> None:
    """SIGTERM the servers of ``sockets`` (a server's command line names its socket)."""
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if any(sock in cmdline.read_text() for sock in sockets):
                os.kill(int(cmdline.parent.name), signal.SIGTERM)
        except (OSError, ValueError):
            continue


def launch(root: Path, env: dict, args: list[str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "debias.launch", "--single", "probe.py", *args], cwd=root, env=env,
                          capture_output=True, text=True, timeout=120, **kwargs)


def report(done: subprocess.CompletedProcess) -> dict:
    return json.loads(done.stdout.splitlines()[0])


def test_a_stage_is_forked_with_the_launcher_s_arguments_folder_environment_and_streams(server) -> None:
    root, env = server
    launcher = subprocess.Popen([sys.executable, "-m", "debias.launch", "--single", "probe.py", "a", "b c"], cwd=root,
                                env={**env, "DEBIAS_PROBE": "x y", "SOME_RUNTIME_SETTING": "7"}, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=lambda: os.umask(0o027))
    out, err = launcher.communicate(timeout=120)
    assert launcher.returncode == 0, err
    seen = json.loads(out.splitlines()[0])
    assert seen["pid"] != launcher.pid  # a fork of the server, not the launcher exec'ing python
    assert seen["launcher"] == str(launcher.pid)
    assert seen["argv"] == ["probe.py", "a", "b c"]
    assert seen["orig_argv"][1:] == ["probe.py", "a", "b c"]
    assert seen["cwd"] == str(root) and seen["path0"] == str(root)
    assert (seen["probe"], seen["other"]) == ("x y", "7")
    assert seen["umask"] == 0o027
    assert seen["tmp"] == str(root)
    assert seen["loaded"] == []  # the project's modules are read from disk by each stage
    assert err.strip().endswith("to stderr")


def test_exit_codes_uncaught_errors_and_exit_messages_come_back(server) -> None:
    root, env = server
    assert launch(root, env, ["exit", "3"]).returncode == 3
    raised = launch(root, env, ["raise"])
    assert raised.returncode == 1 and "Traceback" in raised.stderr and "ValueError: boom" in raised.stderr
    message = launch(root, env, ["message"])
    assert message.returncode == 1 and "a message for the user" in message.stderr
    assert report(raised)["pid"] != report(message)["pid"]


def _wait_for(path: Path) -> int:
    deadline = time.monotonic() + 60
    while not (path.exists() and path.read_text()):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    return int(path.read_text())


def _gone(pid: int, seconds: float = 20) -> bool:
    deadline = time.monotonic() + seconds
    while Path(f"/proc/{pid}").exists():
        status = Path(f"/proc/{pid}/status").read_text() if Path(f"/proc/{pid}/status").exists() else ""
        if "zombie" in status:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def _sleeping_stage(root: Path, env: dict, marker: Path) -> tuple[subprocess.Popen, int]:
    """A launcher whose (forked) stage sleeps, and that stage's pid once it runs."""
    launcher = subprocess.Popen([sys.executable, "-m", "debias.launch", "--single", "probe.py", "sleep", str(marker)],
                                cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    stage = _wait_for(marker)
    assert stage != launcher.pid
    return launcher, stage


def test_a_signal_to_the_launcher_reaches_the_stage_and_the_launcher_dies_of_it(server, tmp_path) -> None:
    root, env = server
    launcher, stage = _sleeping_stage(root, env, tmp_path / "pid")
    launcher.send_signal(signal.SIGTERM)
    assert launcher.wait(timeout=60) == -signal.SIGTERM
    assert _gone(stage)


def test_a_killed_launcher_takes_its_stage_with_it(server, tmp_path) -> None:
    root, env = server
    launcher, stage = _sleeping_stage(root, env, tmp_path / "pid")
    launcher.kill()
    launcher.wait(timeout=60)
    assert _gone(stage)


def test_a_fork_that_cannot_take_over_the_launcher_s_state_reports_that_nothing_ran(tmp_path) -> None:
    import socket

    ours, theirs = socket.socketpair()
    watcher = os.fork()
    if watcher == 0:  # the server's side of one request (a server made under this process's state)
        ours.close()
        server_module.SERVER_STATE.update(affinity=sorted(os.sched_getaffinity(0)),
                                          limits=forkserver.protocol.resource_limits())
        serve_one(theirs, "the log")
    theirs.close()
    state = {**forkserver.process_state(str(tmp_path / "probe.py"), []), "cwd": str(tmp_path / "gone")}
    with open(os.devnull, "w") as null:
        forkserver.send_message(ours, state, [null.fileno()] * 3)
        started, _ = forkserver.receive_message(ours)
        ended, _ = forkserver.receive_message(ours)
    os.waitpid(watcher, 0)
    assert "pid" in started
    assert "could not take over" in ended["error"] and "status" not in ended


def test_a_server_that_gave_up_is_not_started_again(tmp_path) -> None:
    runtime = Path(tempfile.mkdtemp(prefix="dfs", dir="/tmp"))
    (tmp_path / "probe.py").write_text(PROBE)
    env = {**os.environ, "XDG_RUNTIME_DIR": str(runtime), "DEBIAS_FORKSERVER": "1"}
    path = subprocess.run([sys.executable, "-m", "debias.forkserver", "--where"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, check=True).stdout.strip()
    Path(f"{path}.failed").write_text("threads after the imports\n")
    assert launch(tmp_path, env, []).returncode == 0  # runs by itself
    time.sleep(3)
    assert not list(runtime.glob("debias/*.sock")) and not list(runtime.glob("debias/*.log"))  # started no server
    Path(f"{path}.failed").unlink()
    assert launch(tmp_path, env, []).returncode == 0  # without the marker, the launcher starts one (its log appears)
    assert Path(f"{path}.log").exists()
    _stop_servers([path])


def test_a_launcher_pinned_to_other_cpus_is_not_forked_by_this_server(server) -> None:
    """The server's thread pools were sized for its own CPUs: a ``taskset`` launcher runs its stage itself (here
    with its own server marked as failed, so that it starts none) rather than in a fork sized for more cores."""
    import shutil

    taskset = shutil.which("taskset")
    if taskset is None or len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs taskset and two usable CPUs")
    root, env = server
    pin = [taskset, "-c", str(min(os.sched_getaffinity(0)))]
    pinned = subprocess.run([*pin, sys.executable, "-m", "debias.forkserver", "--where"], cwd=root, env=env,
                            capture_output=True, text=True, check=True).stdout.strip()
    Path(f"{pinned}.failed").write_text("kept from starting by the test\n")
    try:
        launcher = subprocess.Popen([*pin, sys.executable, "-m", "debias.launch", "--single", "probe.py"], cwd=root,
                                    env=env, stdout=subprocess.PIPE, text=True)
        out, _ = launcher.communicate(timeout=120)
    finally:
        Path(f"{pinned}.failed").unlink()
    assert launcher.returncode == 0 and json.loads(out.splitlines()[0])["pid"] == launcher.pid  # its own process


def test_switched_off_the_launcher_runs_the_stage_itself(server) -> None:
    root, env = server
    launcher = subprocess.Popen([sys.executable, "-m", "debias.launch", "--single", "probe.py"], cwd=root,
                                env={**env, "DEBIAS_FORKSERVER": "0"}, stdout=subprocess.PIPE, text=True)
    out, _ = launcher.communicate(timeout=120)
    assert json.loads(out.splitlines()[0])["pid"] == launcher.pid  # exec: the same process


def _start_server(cwd: Path, env: dict) -> None:
    """Start the server of ``env`` (a first launch) and wait for its socket."""
    subprocess.run([sys.executable, "-m", "debias.launch", "--single", "pipeline/source.py"], cwd=cwd, env=env,
                   capture_output=True, timeout=120)
    runtime = Path(env["XDG_RUNTIME_DIR"])
    deadline = time.monotonic() + 120
    while not list(runtime.glob("debias/*.sock")):
        assert time.monotonic() < deadline, "the fork server did not start"
        time.sleep(0.2)


def test_stage_outputs_are_the_same_bytes_with_and_without_the_fork_server(server, tmp_path) -> None:
    from tests.faults.conftest import make_workspace, stage_env

    runtime = Path(tempfile.mkdtemp(prefix="dfs", dir="/tmp"))
    outputs = {}
    for switch in ("1", "0"):
        workspace = make_workspace(tmp_path / f"forkserver-{switch}")
        env = {**stage_env(DEBIAS_FORKSERVER=switch), "XDG_RUNTIME_DIR": str(runtime)}
        if switch == "1":
            _start_server(workspace, env)
            (workspace / "probe.py").write_text(PROBE)
            probe = subprocess.Popen([sys.executable, "-m", "debias.launch", "--single", "probe.py"], cwd=workspace,
                                     env=env, stdout=subprocess.PIPE, text=True)
            assert json.loads(probe.communicate(timeout=120)[0].splitlines()[0])["pid"] != probe.pid  # forked
        for stage in ("source", "download", "inject_bias", "train_erm"):
            single = [] if stage == "train_erm" else ["--single"]
            done = subprocess.run([sys.executable, "-m", "debias.launch", *single, f"pipeline/{stage}.py"],
                                  cwd=workspace, env=env, capture_output=True, text=True, timeout=300)
            assert done.returncode == 0, done.stderr
        outputs[switch] = {str(path.relative_to(workspace)): hashlib.sha256(path.read_bytes()).hexdigest()
                           for folder in ("data", "models", "reports/metrics") for path in (workspace / folder).rglob("*")
                           if path.is_file()}
    _stop_servers([str(path) for path in runtime.glob("debias/*.sock")])
    assert len(outputs["1"]) > 10 and outputs["1"] == outputs["0"]


def test_the_server_s_identity_follows_what_imports_read_not_run_time_settings() -> None:
    base = {"HOME": "/home/a", "PATH": "/bin", "OMP_NUM_THREADS": "2"}
    key = forkserver.identity(base, [])
    for runtime_only in ({"DVC_EXP_NAME": "e1"}, {"PYTEST_CURRENT_TEST": "t"}, {"MLFLOW_TRACKING_URI": "sqlite:///x"},
                         {"DEBIAS_THREADS": "1"}, {"CELERY_LOG_LEVEL": "20"}):
        assert forkserver.identity({**base, **runtime_only}, []) == key, runtime_only
    for import_time in ({"OMP_NUM_THREADS": "1"}, {"PYTHONPATH": "/x"}, {"NUMBA_CACHE_DIR": "/c"}, {"LD_PRELOAD": "x"},
                        {"LANG": "C"}, {"MLFLOW_LOGGING_LEVEL": "DEBUG"}):
        assert forkserver.identity({**base, **import_time}, []) != key, import_time
    assert forkserver.identity(base, ["-X", "dev"]) != key
    assert forkserver.interpreter_options(["python", "-X", "dev", "-m", "debias.launch", "s.py"]) == ["-X", "dev"]


def test_idle_lifetime_setting_is_checked() -> None:
    assert forkserver.idle_seconds({}) == forkserver.IDLE_SECONDS
    assert forkserver.idle_seconds({"DEBIAS_FORKSERVER_IDLE": "2.5"}) == 2.5
    for bad in ("0", "-1", "soon", "inf", "nan"):
        with pytest.raises(ValueError, match="DEBIAS_FORKSERVER_IDLE"):
            forkserver.idle_seconds({"DEBIAS_FORKSERVER_IDLE": bad})


def test_a_bad_idle_lifetime_stops_the_launcher_with_one_message(server) -> None:
    root, env = server
    done = launch(root, {**env, "DEBIAS_FORKSERVER_IDLE": "soon"}, [])
    assert done.returncode == 2 and "DEBIAS_FORKSERVER_IDLE = 'soon'" in done.stderr and "Traceback" not in done.stderr
    assert done.stdout == ""  # nothing ran


def test_a_stage_waits_for_numba_s_warm_up_and_no_longer(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))
    assert embedding.wait_for_warming(timeout=5) == 0.0  # nothing under way
    fd = os.open(tmp_path / embedding.WARMING_LOCK, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)  # a warm-up under way
    try:
        assert embedding.wait_for_warming(timeout=0.5) >= 0.5
    finally:
        os.close(fd)
    assert embedding.wait_for_warming(timeout=5) < 0.5
    assert embedding.warm_marker().parent == tmp_path and "umap-" in embedding.warm_marker().name
