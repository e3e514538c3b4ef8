"""The fork server (debias.harness.forkserver): a stage forked from the warm server behaves as ``python SCRIPT ARGS`` would.

A real server is started (its own socket folder, a short idle lifetime) and a probe script run through
``python -m debias.harness.launch --single``: the process it reports must be a fork (a pid other than the launcher's),
with the launcher's arguments, folder, environment, umask, streams, exit codes and signals, and none of the
server's ``debias`` modules. The server and its launchers are pinned to one CPU with ``taskset`` where it exists.

The differential tests (the last part) run the same tiny probe stage with the server on and off under one
condition (``nohup`` and a hang-up, ``cmd &`` in a script and SIGINT/SIGQUIT, Ctrl-Z and ``fg``, the ``taskset``
pin, ``ulimit -v``, a SIGKILL of the launcher) and compare the exit code, what the stage printed and what it
wrote. Linux only, as the server.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from debias.groups import embedding
from debias.harness import forkserver
from debias.harness.forkserver import protocol
from debias.harness.forkserver import server as server_module
from debias.harness.forkserver.server import _serve_one as serve_one
from debias.harness.forkserver.server import remove_stale, why_not_forked

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


# Thread settings that would hide how the pools size themselves
THREAD_SETTINGS = ("DEBIAS_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMBA_NUM_THREADS")


def _pin() -> list[str]:
    """``taskset -c CPU`` (this process's first CPU), or nothing where taskset is missing."""
    taskset = shutil.which("taskset")
    return [taskset, "-c", str(min(os.sched_getaffinity(0)))] if taskset else []


# Every launcher of the module's server is pinned to one CPU, as the server is (so that the pin is under test too)
PIN = _pin()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A folder with the probes, and the environment of a fork server of its own (started pinned, then waited for)."""
    root = tmp_path_factory.mktemp("forkserver")
    runtime = Path(tempfile.mkdtemp(prefix="dfs", dir="/tmp"))  # short: a socket path holds < 108 bytes
    (root / "probe.py").write_text(PROBE)
    (root / "plain_probe.py").write_text(PLAIN_PROBE)
    env = {key: value for key, value in os.environ.items() if key not in THREAD_SETTINGS}
    # idle for long enough to outlast the module's slowest test (stopped at the end)
    env.update(XDG_RUNTIME_DIR=str(runtime), DEBIAS_FORKSERVER_IDLE="900", DEBIAS_FORKSERVER="1", TMPDIR=str(root))
    first = launch(root, env, [])  # no server yet: runs by itself and starts one
    assert first.returncode == 0, first.stderr
    deadline = time.monotonic() + 120
    while not list(runtime.glob("debias/*.sock")):
        assert time.monotonic() < deadline, "the fork server did not start: " + "".join(
            p.read_text() for p in runtime.glob("debias/*.log"))
        time.sleep(0.2)
    yield root, env
    _stop_servers([str(runtime)])  # every server of its folder, a starting one included


def _stop_servers(sockets: list[str]) -> None:
    """SIGTERM the servers of ``sockets`` (a server's command line names its socket)."""
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if any(sock in cmdline.read_text() for sock in sockets):
                os.kill(int(cmdline.parent.name), signal.SIGTERM)
        except (OSError, ValueError):
            continue


def launch(root: Path, env: dict, args: list[str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([*PIN, sys.executable, "-m", "debias.harness.launch", "--single", "probe.py", *args], cwd=root,
                          env=env, capture_output=True, text=True, timeout=120, **kwargs)


def report(done: subprocess.CompletedProcess) -> dict:
    return json.loads(done.stdout.splitlines()[0])


@pytest.mark.slow
def test_a_stage_is_forked_with_the_launcher_s_arguments_folder_environment_and_streams(server) -> None:
    root, env = server
    launcher = subprocess.Popen([*PIN, sys.executable, "-m", "debias.harness.launch", "--single", "probe.py", "a", "b c"],
                                cwd=root, env={**env, "DEBIAS_PROBE": "x y", "SOME_RUNTIME_SETTING": "7"}, text=True,
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


@pytest.mark.slow
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
    launcher = subprocess.Popen([*PIN, sys.executable, "-m", "debias.harness.launch", "--single", "probe.py", "sleep",
                                 str(marker)], cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    stage = _wait_for(marker)
    assert stage != launcher.pid
    return launcher, stage


@pytest.mark.slow
def test_a_signal_to_the_launcher_reaches_the_stage_and_the_launcher_dies_of_it(server, tmp_path) -> None:
    root, env = server
    launcher, stage = _sleeping_stage(root, env, tmp_path / "pid")
    launcher.send_signal(signal.SIGTERM)
    assert launcher.wait(timeout=60) == -signal.SIGTERM
    assert _gone(stage)


@pytest.mark.slow
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


@pytest.mark.slow
def test_a_server_that_gave_up_is_not_started_again(tmp_path) -> None:
    runtime = Path(tempfile.mkdtemp(prefix="dfs", dir="/tmp"))
    (tmp_path / "probe.py").write_text(PROBE)
    env = {**os.environ, "XDG_RUNTIME_DIR": str(runtime), "DEBIAS_FORKSERVER": "1"}
    path = subprocess.run([*PIN, sys.executable, "-m", "debias.harness.forkserver", "--where"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, check=True).stdout.strip()
    Path(f"{path}.failed").write_text("threads after the imports\n")
    assert launch(tmp_path, env, []).returncode == 0  # runs by itself
    time.sleep(3)
    assert not list(runtime.glob("debias/*.sock")) and not list(runtime.glob("debias/*.log"))  # started no server
    Path(f"{path}.failed").unlink()
    assert launch(tmp_path, env, []).returncode == 0  # without the marker, the launcher starts one (its log appears)
    assert Path(f"{path}.log").exists()
    _stop_servers([path])


@pytest.mark.slow
def test_a_launcher_on_other_cpus_is_not_forked_by_this_server(server) -> None:
    """The server's thread pools were sized for its own (pinned) CPUs: a launcher free to run on every CPU runs its
    stage itself (here with its own server marked as failed, so that it starts none) rather than in that fork."""
    if not PIN or len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs taskset and two usable CPUs")
    root, env = server
    unpinned = subprocess.run([sys.executable, "-m", "debias.harness.forkserver", "--where"], cwd=root, env=env,
                              capture_output=True, text=True, check=True).stdout.strip()
    Path(f"{unpinned}.failed").write_text("kept from starting by the test\n")
    try:
        launcher = subprocess.Popen([sys.executable, "-m", "debias.harness.launch", "--single", "probe.py"], cwd=root, env=env,
                                    stdout=subprocess.PIPE, text=True)
        out, _ = launcher.communicate(timeout=120)
    finally:
        Path(f"{unpinned}.failed").unlink()
    assert launcher.returncode == 0 and json.loads(out.splitlines()[0])["pid"] == launcher.pid  # its own process


@pytest.mark.slow
def test_switched_off_the_launcher_runs_the_stage_itself(server) -> None:
    root, env = server
    launcher = subprocess.Popen([*PIN, sys.executable, "-m", "debias.harness.launch", "--single", "probe.py"], cwd=root,
                                env={**env, "DEBIAS_FORKSERVER": "0"}, stdout=subprocess.PIPE, text=True)
    out, _ = launcher.communicate(timeout=120)
    assert json.loads(out.splitlines()[0])["pid"] == launcher.pid  # exec: the same process


def _start_server(cwd: Path, env: dict) -> None:
    """Start the server of ``env`` (a first launch) and wait for its socket."""
    subprocess.run([sys.executable, "-m", "debias.harness.launch", "--single", "pipeline/source.py"], cwd=cwd, env=env,
                   capture_output=True, timeout=120)
    runtime = Path(env["XDG_RUNTIME_DIR"])
    deadline = time.monotonic() + 120
    while not list(runtime.glob("debias/*.sock")):
        assert time.monotonic() < deadline, "the fork server did not start"
        time.sleep(0.2)


@pytest.mark.slow
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
            probe = subprocess.Popen([sys.executable, "-m", "debias.harness.launch", "--single", "probe.py"], cwd=workspace,
                                     env=env, stdout=subprocess.PIPE, text=True)
            assert json.loads(probe.communicate(timeout=120)[0].splitlines()[0])["pid"] != probe.pid  # forked
        for stage in ("source", "download", "inject_bias", "train_erm"):
            single = [] if stage == "train_erm" else ["--single"]
            done = subprocess.run([sys.executable, "-m", "debias.harness.launch", *single, f"pipeline/{stage}.py"],
                                  cwd=workspace, env=env, capture_output=True, text=True, timeout=300)
            assert done.returncode == 0, done.stderr
        outputs[switch] = {str(path.relative_to(workspace)): hashlib.sha256(path.read_bytes()).hexdigest()
                           for folder in ("data", "models", "reports/metrics") for path in (workspace / folder).rglob("*")
                           if path.is_file()}
    _stop_servers([str(path) for path in runtime.glob("debias/*.sock")])
    assert len(outputs["1"]) > 10 and outputs["1"] == outputs["0"]


DISTRIBUTIONS_PROBE = textwrap.dedent("""
    import json, sys
    utils = sys.modules.get("mlflow.utils.requirements_utils")
    held = None if utils is None or utils._MODULES_TO_PACKAGES is None else dict(utils._MODULES_TO_PACKAGES)
    if held is not None:
        utils._MODULES_TO_PACKAGES = None
        utils._init_modules_to_packages_map()
    print(json.dumps({"kept": held is not None, "same": held == (utils and utils._MODULES_TO_PACKAGES)}))
""")


@pytest.mark.slow
def test_a_forked_stage_keeps_the_server_s_map_of_distributions_only_as_it_would_build_it(server) -> None:
    """Once the server is idle it builds MLflow's map of modules to installed distributions; a forked stage starts
    with it, equal to the map the stage builds itself."""
    root, env = server
    (root / "distributions.py").write_text(DISTRIBUTIONS_PROBE)
    deadline = time.monotonic() + 120
    while True:
        done = subprocess.run([*PIN, sys.executable, "-m", "debias.harness.launch", "--single", "distributions.py"],
                              cwd=root, env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        seen = json.loads(done.stdout.splitlines()[0])
        if seen["kept"] or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert seen == {"kept": True, "same": True}


def test_a_stage_drops_the_server_s_map_where_its_path_or_databricks_would_change_it(tmp_path, monkeypatch) -> None:
    """The map is kept where the paths differ only by folders holding no distribution metadata and MLflow's
    Databricks test answers as it did in the server; dropped (rebuilt on first use) otherwise."""
    from mlflow.utils import requirements_utils

    from debias.harness.forkserver import stage

    plain, with_metadata, missing = tmp_path / "src", tmp_path / "site", tmp_path / "nowhere"
    (plain / "debias").mkdir(parents=True)
    (with_metadata / "extra-1.0.dist-info").mkdir(parents=True)
    held, base = {"torch": ["torch"]}, list(sys.path)
    for databricks in ("", "15.4"):
        monkeypatch.delenv("DATABRICKS_ENV_VERSION", raising=False)
        monkeypatch.setenv("DATABRICKS_RUNTIME_VERSION", databricks)
        if not databricks:
            monkeypatch.delenv("DATABRICKS_RUNTIME_VERSION")
        for extra, kept in ((None, True), (plain, True), (missing, True), (with_metadata, False)):
            monkeypatch.setattr(stage, "DISTRIBUTION_MAP", {"path": base, "databricks": False})
            monkeypatch.setattr(requirements_utils, "_MODULES_TO_PACKAGES", dict(held))
            monkeypatch.setattr(sys, "path", [*base, *([str(extra)] if extra else [])])
            expected = kept and not databricks
            assert stage.keep_distribution_map() is expected, (extra, databricks)
            assert requirements_utils._MODULES_TO_PACKAGES == (held if expected else None)
    monkeypatch.setattr(stage, "DISTRIBUTION_MAP", {})  # a server that built none: nothing is kept
    monkeypatch.setattr(requirements_utils, "_MODULES_TO_PACKAGES", dict(held))
    assert stage.keep_distribution_map() is False and requirements_utils._MODULES_TO_PACKAGES == held
    assert stage.holds_distributions(str(with_metadata)) and not stage.holds_distributions(str(plain))


SCHEMA_PROBE = textwrap.dedent("""
    import json, sys
    from alembic.script import ScriptDirectory
    from mlflow.store.db import utils
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    database, artifacts = sys.argv[1], sys.argv[2]
    remembered = hasattr(utils._get_latest_schema_revision, "cache_info")  # the server's, inherited by the fork
    SqlAlchemyStore(f"sqlite:///{database}", artifacts)  # a store made before: its schema checked, not created
    read = []
    real = ScriptDirectory.from_config
    ScriptDirectory.from_config = lambda *a, **k: read.append(1) or real(*a, **k)
    SqlAlchemyStore(f"sqlite:///{database}", artifacts).engine.dispose()
    print(json.dumps({"remembered": remembered, "scripts_read": len(read)}))
""")


@pytest.mark.slow
def test_a_forked_stage_checks_its_mlflow_database_against_the_schema_head_the_server_read(server, tmp_path) -> None:
    """Once the server is idle it reads MLflow's newest schema revision (alembic's ~70 migration scripts); a forked
    stage opening a SQL store checks the database against it without reading the scripts again."""
    root, env = server
    (root / "schema.py").write_text(SCHEMA_PROBE)
    database = tmp_path / "mlflow.db"
    subprocess.run([sys.executable, "-c", "import sys; from mlflow.store.tracking.sqlalchemy_store import "
                    "SqlAlchemyStore; SqlAlchemyStore(f'sqlite:///{sys.argv[1]}', sys.argv[2])", str(database),
                    str(tmp_path)], check=True, capture_output=True, timeout=120)
    deadline = time.monotonic() + 120
    while True:
        done = subprocess.run([*PIN, sys.executable, "-m", "debias.harness.launch", "--single", "schema.py",
                               str(database), str(tmp_path)], cwd=root, env=env, capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, done.stderr
        seen = json.loads(done.stdout.splitlines()[-1])
        if seen["remembered"] or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert seen == {"remembered": True, "scripts_read": 0}


@pytest.mark.slow
def test_the_remembered_schema_head_is_alembic_s_and_an_old_database_is_still_refused(tmp_path) -> None:
    """The server's remembered head (server._remember_schema_head, in a process of its own) is the revision alembic
    reads from MLflow's scripts; a store on a database of an older revision is refused as before."""
    code = textwrap.dedent("""
        import sqlite3, sys
        from mlflow.exceptions import MlflowException
        from mlflow.store.db import utils
        from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore
        from debias.harness.forkserver import server

        database, artifacts = sys.argv[1], sys.argv[2]
        head = utils._get_latest_schema_revision()
        SqlAlchemyStore(f"sqlite:///{database}", artifacts).engine.dispose()
        server._remember_schema_head()
        assert utils._get_latest_schema_revision() == head and utils._get_latest_schema_revision.cache_info().hits
        with sqlite3.connect(database) as db:
            db.execute("UPDATE alembic_version SET version_num = 'an-older-revision'")
        try:
            SqlAlchemyStore(f"sqlite:///{database}", artifacts)
        except MlflowException as exc:
            print("refused:", str(exc).splitlines()[0])
    """)
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "mlflow.db"), str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("refused: Detected out-of-date database schema"), done.stdout


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
    assert forkserver.interpreter_options(["python", "-X", "dev", "-m", "debias.harness.launch", "s.py"]) == ["-X", "dev"]


def test_idle_lifetime_setting_is_checked() -> None:
    assert forkserver.idle_seconds({}) == forkserver.IDLE_SECONDS
    assert forkserver.idle_seconds({"DEBIAS_FORKSERVER_IDLE": "2.5"}) == 2.5
    for bad in ("0", "-1", "soon", "inf", "nan"):
        with pytest.raises(ValueError, match="DEBIAS_FORKSERVER_IDLE"):
            forkserver.idle_seconds({"DEBIAS_FORKSERVER_IDLE": bad})


@pytest.mark.slow
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


# ----------------------------------------------- differential: the same stage, server on and off, one condition

PLAIN_PROBE = textwrap.dedent("""
    import json, os, signal, sys, time
    from pathlib import Path

    action, folder = sys.argv[1], Path(sys.argv[2])
    (folder / "started").write_text(f"{os.getpid()} {os.environ.get('DEBIAS_LAUNCHER_PID', os.getpid())}")
    if action == "wait":  # its signal dispositions, then wait for the test's go before writing its output
        names = ("SIGHUP", "SIGINT", "SIGQUIT", "SIGTERM", "SIGUSR1", "SIGPIPE")
        print(json.dumps({"signals": {name: repr(signal.getsignal(getattr(signal, name))) for name in names},
                          "blocked": sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, []))}), flush=True)
        (folder / "waiting").write_text("")
        deadline = time.monotonic() + 60
        while not (folder / "go").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        (folder / "output.txt").write_text("written after the go")
        print("finished", file=sys.stderr)
    elif action == "memory":  # 200 MiB: nothing for a new process under the test's limit
        import resource
        block = bytearray(200 * 2**20)
        print(json.dumps({"RLIMIT_AS": resource.getrlimit(resource.RLIMIT_AS), "allocated": len(block)}))
    elif action == "cuda":  # a few steps of training on the device
        import torch
        torch.manual_seed(0)
        model = torch.nn.Linear(8, 2).cuda()
        x, y = torch.randn(64, 8, device="cuda"), torch.randint(0, 2, (64,), device="cuda")
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(20):
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
        print(json.dumps({"device": str(next(model.parameters()).device), "loss": loss.item()}))
    elif action == "state":  # thread pools, global random state and names, as a stage would start with them
        import numba, numpy, threadpoolctl, torch
        cmdline = Path("/proc/self/cmdline").read_bytes().rstrip(b"\\0").replace(b"\\0", b" ").decode()
        pools = sorted(f'{pool["internal_api"]} {pool["prefix"]} {pool["num_threads"]}'
                       for pool in threadpoolctl.threadpool_info())
        print(json.dumps({"affinity": sorted(os.sched_getaffinity(0)), "omp": os.environ.get("OMP_NUM_THREADS"),
                          "torch": [torch.get_num_threads(), torch.get_num_interop_threads()],
                          "numba": numba.config.NUMBA_NUM_THREADS, "pools": pools, "cmdline": cmdline,
                          "comm": Path("/proc/self/comm").read_text().strip()}))
        print(json.dumps({"numpy": numpy.random.random(), "torch": torch.rand(3).tolist()}))
""")


@dataclass
class Outcome:
    code: int
    stdout: str
    stderr: str
    files: dict[str, str]
    stage: int
    launcher: int

    def same_as(self, other: "Outcome") -> tuple:
        return (self.code, self.stdout, self.stderr, self.files) == (other.code, other.stdout, other.stderr, other.files)


def _launch_words(action: str, folder: Path) -> list[str]:
    return [*PIN, sys.executable, "-m", "debias.harness.launch", "--single", "plain_probe.py", action, str(folder)]


def _appears(path: Path, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert time.monotonic() < deadline, f"{path.name} never appeared"
        time.sleep(0.02)


def _stat(pid: int) -> list[str]:
    """``/proc/PID/stat``'s fields after the command name: state, parent pid, process group, session, ..."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def _ended(pid: int, seconds: float = 20) -> bool:
    """True once ``pid`` has ended (a zombie counts: it runs nothing)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if _stat(pid)[0] in "ZX":
                return True
        except (OSError, IndexError):
            return True
        time.sleep(0.05)
    return False


def _run(server, switch: str, folder: Path, words: list[str], act=None, **popen) -> Outcome:
    """Start ``words`` (a launcher of the probe, under a condition), call ``act(process, stage pid, launcher pid)``
    once the probe waits (if given), then let the probe go on; the outcome."""
    root, env = server
    folder.mkdir(parents=True)
    process = subprocess.Popen(words, cwd=root, env={**env, "DEBIAS_FORKSERVER": switch}, stdin=subprocess.DEVNULL,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)
    try:
        if act is not None:
            _appears(folder / "waiting")
            stage, launcher = map(int, (folder / "started").read_text().split())
            act(process, stage, launcher)
            (folder / "go").write_text("")
        out, err = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    stage, launcher = map(int, (folder / "started").read_text().split())
    files = {path.name: path.read_text() for path in sorted(folder.iterdir()) if path.name not in ("started", "go")}
    return Outcome(process.returncode, out, err, files, stage, launcher)


def _both(server, tmp_path: Path, words_of, act=None, **popen) -> dict[str, Outcome]:
    outcomes = {}
    for switch in ("1", "0"):
        folder = tmp_path / f"fs{switch}"
        outcomes[switch] = _run(server, switch, folder, words_of(folder), act, **popen)
    assert outcomes["0"].stage == outcomes["0"].launcher  # off: the launcher became the stage
    return outcomes


@pytest.mark.slow
def test_nohup_keeps_a_forked_stage_alive_through_a_hang_up(server, tmp_path) -> None:
    def hang_up(process, _stage, _launcher):
        os.killpg(process.pid, signal.SIGHUP)  # the session's hang-up reaches its whole process group
        time.sleep(0.5)

    block = lambda: signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR2})  # noqa: E731 - and a blocked signal
    outcomes = _both(server, tmp_path, lambda folder: ["nohup", *_launch_words("wait", folder)], hang_up,
                     start_new_session=True, preexec_fn=block)
    assert outcomes["1"].stage != outcomes["1"].launcher  # forked
    assert outcomes["0"].code == 0 and outcomes["0"].files == {"output.txt": "written after the go", "waiting": ""}
    assert "Handlers.SIG_IGN" in json.loads(outcomes["0"].stdout)["signals"]["SIGHUP"]
    assert json.loads(outcomes["0"].stdout)["blocked"] == [signal.SIGUSR2]
    assert outcomes["1"].same_as(outcomes["0"]), (outcomes["1"], outcomes["0"])


@pytest.mark.slow
def test_signals_ignored_by_a_background_job_stay_ignored(server, tmp_path) -> None:
    def interrupt(_process, _stage, launcher):  # a script's `cmd &` runs cmd with SIGINT and SIGQUIT ignored
        os.kill(launcher, signal.SIGINT)
        os.kill(launcher, signal.SIGQUIT)
        time.sleep(0.5)

    outcomes = _both(server, tmp_path, lambda folder: ["bash", "-c", '"$@" & wait $!', "bash",
                                                        *_launch_words("wait", folder)], interrupt)
    assert outcomes["1"].stage != outcomes["1"].launcher
    assert outcomes["0"].code == 0 and "output.txt" in outcomes["0"].files
    seen = json.loads(outcomes["0"].stdout)["signals"]
    assert "SIG_IGN" in seen["SIGINT"] and "SIG_IGN" in seen["SIGQUIT"] and "default_int" not in seen["SIGINT"]
    assert outcomes["1"].same_as(outcomes["0"]), (outcomes["1"], outcomes["0"])


def _state(pid: int) -> str:
    return _stat(pid)[0]


def _parent(pid: int) -> int:
    return int(_stat(pid)[1])


def _until(condition, seconds: float = 10) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def _stop_signals_reach_this_process_group() -> bool:
    """Whether SIGTSTP stops a plain child here: POSIX has the kernel discard it for a process group that is
    orphaned (e.g. the suite run from a background job whose shell has exited), where no process can be stopped."""
    child = subprocess.Popen(["sleep", "30"])
    try:
        os.kill(child.pid, signal.SIGTSTP)
        return _until(lambda: _state(child.pid) == "T", seconds=3)
    finally:
        child.kill()
        child.wait()


@pytest.mark.slow
def test_ctrl_z_stops_the_stage_and_fg_continues_it(server, tmp_path) -> None:
    if not _stop_signals_reach_this_process_group():
        pytest.skip("SIGTSTP stops no process in this orphaned process group (POSIX): no plain process to compare with")

    def stop_and_continue(_process, stage, launcher):
        os.kill(launcher, signal.SIGTSTP)  # what the terminal sends the foreground job on Ctrl-Z
        assert _until(lambda: _state(stage) == "T") and _until(lambda: _state(launcher) == "T")
        os.kill(launcher, signal.SIGCONT)  # `fg`
        assert _until(lambda: _state(stage) != "T") and _until(lambda: _state(launcher) != "T")

    outcomes = _both(server, tmp_path, lambda folder: _launch_words("wait", folder), stop_and_continue)
    assert outcomes["1"].stage != outcomes["1"].launcher
    assert outcomes["0"].code == 0 and "output.txt" in outcomes["0"].files
    assert outcomes["1"].same_as(outcomes["0"]), (outcomes["1"], outcomes["0"])


@pytest.mark.slow
def test_a_stage_killed_with_its_launcher_writes_nothing_more(server, tmp_path) -> None:
    def kill(process, stage, _launcher):
        process.kill()  # SIGKILL: nothing can pass it on
        process.wait(timeout=60)
        assert _ended(stage), "the stage outlived its launcher"

    outcomes = _both(server, tmp_path, lambda folder: _launch_words("wait", folder), kill)
    assert outcomes["1"].stage != outcomes["1"].launcher
    assert outcomes["0"].code == -signal.SIGKILL and "output.txt" not in outcomes["0"].files
    assert outcomes["1"].same_as(outcomes["0"]), (outcomes["1"], outcomes["0"])


@pytest.mark.slow
def test_a_stage_whose_watcher_is_killed_dies_and_its_launcher_says_so(server, tmp_path) -> None:
    seen = {}

    def kill_watcher(_process, stage, launcher):
        assert stage != launcher, "the stage was not forked"
        seen["watcher"] = watcher = _parent(stage)
        assert b"debias.harness.forkserver" in Path(f"/proc/{watcher}/cmdline").read_bytes()  # the server's, nobody else
        os.kill(watcher, signal.SIGKILL)
        assert _ended(stage), "the stage outlived its watcher"

    outcome = _run(server, "1", tmp_path / "fs1", _launch_words("wait", tmp_path / "fs1"), kill_watcher)
    assert outcome.stage != outcome.launcher and seen["watcher"] not in (outcome.stage, outcome.launcher)
    assert outcome.code == 1 and "was killed with it" in outcome.stderr
    assert "output.txt" not in outcome.files  # the go came after its death: nothing written


@pytest.mark.slow
def test_an_address_space_limit_runs_the_stage_as_its_own_process(server, tmp_path) -> None:
    root, env = server
    before = sorted(Path(env["XDG_RUNTIME_DIR"]).glob("debias/*"))
    limit = 1_500_000  # KiB: a new interpreter and 200 MiB fit; a fork of the server's mappings (several GB) does not
    outcomes = _both(server, tmp_path, lambda folder: ["bash", "-c", f'ulimit -v {limit} && exec "$@"', "bash",
                                                        *_launch_words("memory", folder)])
    assert outcomes["0"].code == 0 and json.loads(outcomes["0"].stdout)["RLIMIT_AS"] == [limit * 1024] * 2
    assert outcomes["1"].same_as(outcomes["0"]), (outcomes["1"], outcomes["0"])
    assert outcomes["1"].stage == outcomes["1"].launcher  # not forked
    assert sorted(Path(env["XDG_RUNTIME_DIR"]).glob("debias/*")) == before  # and no server started under the limit


@pytest.mark.slow
def test_thread_pools_random_state_and_names_are_a_new_process_s(server, tmp_path) -> None:
    """Pinned by ``taskset``, the forked stage's torch, OpenMP, OpenBLAS and numba pools are sized as a new process
    sizes them; its command line and name are ``python probe.py ...``; its global random state (NumPy's, torch's)
    is its own, as each new process's is."""
    if not PIN:
        pytest.skip("taskset (util-linux) is not installed: the pinned condition cannot be made")
    outcomes = _both(server, tmp_path, lambda folder: _launch_words("state", folder))
    again = _run(server, "1", tmp_path / "again", _launch_words("state", tmp_path / "again"))
    assert outcomes["1"].stage != outcomes["1"].launcher and again.stage != again.launcher  # forked
    plain = json.loads(outcomes["0"].stdout.splitlines()[0])
    assert plain["affinity"] == [min(os.sched_getaffinity(0))] and plain["torch"] == [1, 1] and plain["numba"] == 1
    assert plain["cmdline"].endswith(f"probe.py state {tmp_path / 'fs0'}")
    for forked, folder in ((outcomes["1"], "fs1"), (again, "again")):
        seen = json.loads(forked.stdout.splitlines()[0])
        assert seen["cmdline"] == plain["cmdline"].replace("fs0", folder)
        assert set(plain["pools"]) <= set(seen["pools"])  # the server loaded more libraries, sized the same way
        assert {**seen, "cmdline": "", "pools": ""} == {**plain, "cmdline": "", "pools": ""}
    for library in ("numpy", "torch"):
        draws = {json.dumps(json.loads(done.stdout.splitlines()[1])[library]) for done in (outcomes["0"], outcomes["1"], again)}
        assert len(draws) == 3, library  # each process its own


def _autogroup(pid: int) -> str | None:
    """The kernel's CPU-sharing group of ``pid`` (``/autogroup-N``), None where the kernel has no autogroup."""
    try:
        return Path(f"/proc/{pid}/autogroup").read_text().split()[0]
    except OSError:
        return None


@pytest.mark.slow
def test_a_forked_stage_has_a_session_and_so_a_cpu_share_of_its_own(server, tmp_path) -> None:
    """A plain stage shares only its launcher's session; a forked one must not share the server's, where the kernel
    shares CPU time by session (autogroup) and every stage the server forked would split one share. Its watcher
    leads the session (so the stage's group is not orphaned: Ctrl-Z stops it, the test above)."""
    seen = {}

    def look(_process, stage, _launcher):
        watcher = _parent(stage)
        main = _parent(watcher)  # the server
        seen.update(watcher=watcher, sessions=[os.getsid(pid) for pid in (stage, watcher, main)],
                    groups=[_autogroup(pid) for pid in (stage, main)], leader=os.getpgid(stage) == stage)

    outcome = _run(server, "1", tmp_path / "fs1", _launch_words("wait", tmp_path / "fs1"), look)
    assert outcome.code == 0 and outcome.stage != outcome.launcher  # forked
    stage, watcher, main = seen["sessions"]
    assert stage == watcher == seen["watcher"] != main  # the watcher's own session, not the server's
    assert seen["leader"]  # and its own process group in it
    assert seen["groups"][0] is None or seen["groups"][0] != seen["groups"][1]


def test_the_server_s_identity_follows_the_launcher_s_pin_and_hard_limits() -> None:
    if not PIN or len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs taskset and two usable CPUs")
    runtime = Path(tempfile.mkdtemp(prefix="dfs", dir="/tmp"))  # short: a socket path holds < 108 bytes (not tmp_path's)
    env = {**os.environ, "XDG_RUNTIME_DIR": str(runtime)}

    def where(*prefix: str) -> str:
        return subprocess.run([*prefix, sys.executable, "-m", "debias.harness.forkserver", "--where"], env=env,
                              capture_output=True, text=True, check=True).stdout.strip()

    plain = where()
    assert where(*PIN) != plain
    assert where("bash", "-c", 'ulimit -n 512 && exec "$@"', "bash") != plain  # soft and hard
    assert where("bash", "-c", 'ulimit -S -n 512 && exec "$@"', "bash") == plain  # a soft limit a fork can set


def test_a_server_forks_only_for_its_own_pin_and_limits() -> None:
    import resource

    limits = {name: list(pair) for name, pair in protocol.resource_limits().items()}
    server = {"affinity": sorted(os.sched_getaffinity(0)), "limits": protocol.resource_limits()}
    assert why_not_forked({"affinity": server["affinity"], "limits": limits}, server) is None
    assert "CPUs" in why_not_forked({"affinity": [-1], "limits": limits}, server)
    finite = {**limits, "RLIMIT_AS": [2**32, resource.RLIM_INFINITY]}
    assert why_not_forked({"affinity": server["affinity"], "limits": finite}, server) == "RLIMIT_AS is finite"
    lower = {**limits, "RLIMIT_NOFILE": [64, 64]}
    assert "RLIMIT_NOFILE" in why_not_forked({"affinity": server["affinity"], "limits": lower}, server)


def test_stale_sockets_locks_and_logs_are_removed_held_and_failed_ones_kept(tmp_path) -> None:
    for name in ("mine", "held", "stale", "failed"):
        for suffix in (".sock.lock", ".sock.log"):
            (tmp_path / f"{name}{suffix}").write_text("")
    (tmp_path / "stale.sock").write_text("")
    (tmp_path / "failed.sock.failed").write_text("threads after the imports\n")
    holder = os.open(tmp_path / "held.sock.lock", os.O_RDWR)
    fcntl.flock(holder, fcntl.LOCK_EX)  # a live server of another identity
    try:
        removed = remove_stale(tmp_path, keep=tmp_path / "mine.sock")
    finally:
        os.close(holder)
    assert sorted(path.name for path in removed) == ["stale.sock", "stale.sock.lock", "stale.sock.log"]
    assert sorted(path.name for path in tmp_path.iterdir()) == [
        "failed.sock.failed", "failed.sock.lock", "failed.sock.log", "held.sock.lock", "held.sock.log",
        "mine.sock.lock", "mine.sock.log"]


def test_the_server_is_off_by_default_where_cuda_is_visible(monkeypatch) -> None:
    monkeypatch.setattr(protocol.glob, "glob", lambda pattern: [])
    monkeypatch.setattr(protocol.os.path, "exists", lambda path: False)
    assert protocol.enabled({}) and protocol.enabled({"CUDA_VISIBLE_DEVICES": ""})
    assert protocol.enabled({"CUDA_VISIBLE_DEVICES": "-1"})
    assert not protocol.enabled({"CUDA_VISIBLE_DEVICES": "0"})
    assert not protocol.enabled({"CUDA_VISIBLE_DEVICES": "GPU-5d0c2f0e,1"})
    assert protocol.enabled({"CUDA_VISIBLE_DEVICES": "0", "DEBIAS_FORKSERVER": "1"})  # switched on by hand
    assert not protocol.enabled({"DEBIAS_FORKSERVER": "0"})
    monkeypatch.setattr(protocol.glob, "glob", lambda pattern: ["/dev/nvidia0"])
    assert not protocol.enabled({}) and protocol.enabled({"CUDA_VISIBLE_DEVICES": ""})


@pytest.mark.slow
def test_a_forked_stage_trains_on_the_cuda_device_as_a_plain_one(server, tmp_path) -> None:
    """The check that would let the server on by default where CUDA is visible (it is off there until it passes)."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device on this machine")
    outcomes = _both(server, tmp_path, lambda folder: _launch_words("cuda", folder))  # DEBIAS_FORKSERVER=1: on
    assert outcomes["1"].stage != outcomes["1"].launcher  # forked
    assert outcomes["0"].code == 0 and json.loads(outcomes["0"].stdout)["device"] == "cuda:0"
    assert outcomes["1"].same_as(outcomes["0"]), (outcomes["1"], outcomes["0"])


def test_stages_of_two_debias_trees_share_a_server_and_each_imports_its_own_tree(tmp_path: Path) -> None:
    """A queued experiment's copy of the tree puts its own ``src`` on PYTHONPATH: the same server as another
    tree's (only debias is re-imported per stage), and the forked stage's ``sys.path`` holds its own ``src`` where the
    server's held the first tree's; any other PYTHONPATH folder is another server."""
    trees = []
    for name in ("a", "b"):
        (tmp_path / name / "src" / "debias").mkdir(parents=True)
        (tmp_path / name / "src" / "debias.egg-info").mkdir()
        trees.append(str(tmp_path / name / "src"))
    other = tmp_path / "other"
    (other / "debias").mkdir(parents=True)
    (other / "numpy").mkdir()  # a folder that shadows a library the server imported: never shared
    base = {"HOME": "/home/a"}
    assert protocol.is_tree_src(trees[0]) and not protocol.is_tree_src(str(other))
    key = forkserver.identity({**base, "PYTHONPATH": trees[0]}, [])
    assert forkserver.identity({**base, "PYTHONPATH": trees[1]}, []) == key
    assert forkserver.identity({**base, "PYTHONPATH": str(other)}, []) != key
    assert forkserver.identity({**base, "PYTHONPATH": os.pathsep.join([trees[1], str(other)])}, []) != key
    server_path = ["/usr/lib/python", trees[0], "/site-packages"]
    assert protocol.stage_path(server_path, trees[0], trees[1]) == ["/usr/lib/python", trees[1], "/site-packages"]
    assert protocol.stage_path(server_path, "", "") == server_path
