"""``debias services down`` signals only the processes ``up`` started, and ``up`` names a taken port and its flag.

Real processes and sockets: a foreign ``bash -c 'sleep 60'`` process group whose pid a stale services.json (or
postmaster.pid) names must survive ``down``; a process whose recorded identity still matches is stopped; a port
held by a plain listening socket makes ``up`` refuse before anything starts. No PostgreSQL or MLflow is needed
(tests/test_cluster.py starts the real services where they are installed).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from debias.tools import services

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").is_file(), reason="process identities need Linux's /proc")


def cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    return subprocess.run([sys.executable, "-m", "debias.tools.cli", "services", *args], capture_output=True, text=True,
                          env=env, timeout=120)


@pytest.fixture
def foreign_group():
    """A process group that is none of the services': ``bash -c 'sleep 60'`` in its own session."""
    process = subprocess.Popen(["bash", "-c", "sleep 60; true"], start_new_session=True)
    time.sleep(0.2)
    yield process
    if process.poll() is None:
        os.killpg(process.pid, 9)
        process.wait()


def alive(process: subprocess.Popen) -> bool:
    return process.poll() is None


def write_record(folder: Path, **fields) -> Path:
    record = {"tracking_uri": "http://127.0.0.1:5000", "backend_store_uri": "postgresql+psycopg://x",
              "dvc_remote": str(folder / "dvc-remote"), "postgres_data": str(folder / "postgres"), "logs": [], **fields}
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "services.json"
    path.write_text(json.dumps(record))
    return path


@pytest.mark.slow
def test_down_leaves_a_foreign_group_alive_when_the_recorded_pid_was_reused(tmp_path: Path, foreign_group) -> None:
    # the identity mlflow server had when `up` recorded it; the pid now belongs to the foreign bash
    crashed = {"pid": foreign_group.pid, "start": 1, "boot": services.boot_id(),
               "cmdline": [sys.executable, "-m", "mlflow", "server", "--port", "5000"]}
    path = write_record(tmp_path / "svc", mlflow_pid=foreign_group.pid, mlflow_process=crashed)
    done = cli("down", "--dir", str(tmp_path / "svc"))
    time.sleep(0.5)
    assert done.returncode == 0, done.stderr
    assert alive(foreign_group), "down signalled a process group that is not the mlflow server"
    assert "stopped nothing" in done.stdout
    assert f"mlflow server was not running (pid {foreign_group.pid} is now another process: " in done.stdout
    assert "bash" in done.stdout and "nothing was signalled" in done.stdout
    assert json.loads(path.read_text())["mlflow_pid"] is None  # the stale record is gone


@pytest.mark.slow
def test_down_leaves_it_alive_with_a_record_written_before_identities_were_kept(tmp_path: Path, foreign_group) -> None:
    path = write_record(tmp_path / "svc", mlflow_pid=foreign_group.pid)  # no mlflow_process: an older record
    done = cli("down", "--dir", str(tmp_path / "svc"))
    time.sleep(0.5)
    assert done.returncode == 0, done.stderr
    assert alive(foreign_group)
    assert "was not running" in done.stdout and "bash" in done.stdout
    assert json.loads(path.read_text())["mlflow_pid"] is None


@pytest.mark.slow
def test_down_never_signals_the_pid_of_a_stale_postmaster_pid(tmp_path: Path, foreign_group) -> None:
    folder = tmp_path / "svc"
    (folder / "postgres").mkdir(parents=True)
    (folder / "postgres" / "postmaster.pid").write_text(f"{foreign_group.pid}\n{folder / 'postgres'}\n1700000000\n")
    done = cli("down", "--dir", str(folder))
    time.sleep(0.5)
    assert done.returncode == 0, done.stderr
    assert alive(foreign_group)
    assert f"PostgreSQL was not running (postmaster.pid names pid {foreign_group.pid}, which is another process" \
        in done.stdout


@pytest.mark.slow
def test_down_stops_a_process_that_still_is_the_recorded_one(tmp_path: Path) -> None:
    # the positive case with a real process group: its identity recorded as `up` records mlflow server's
    server = subprocess.Popen(["bash", "-c", "sleep 60 & wait"], start_new_session=True)
    time.sleep(0.3)
    try:
        identity = services.process_identity(server.pid)
        assert identity is not None and identity["cmdline"][:2] == ["bash", "-c"]
        write_record(tmp_path / "svc", mlflow_pid=server.pid, mlflow_process=identity)
        done = cli("down", "--dir", str(tmp_path / "svc"))
        assert done.returncode == 0, done.stderr
        assert f"stopped mlflow server (pid {server.pid})" in done.stdout
        server.wait(timeout=10)
        # no process of the group runs, its sleep included (ended: gone, or a zombie its new parent has yet to reap)
        assert not services.group_runs(server.pid)
    finally:
        if server.poll() is None:
            os.killpg(server.pid, 9)
            server.wait()


@pytest.mark.timeout(120)
def test_a_group_whose_process_exited_unreaped_runs_no_more_and_is_stopped_at_once() -> None:
    """A zombie (exited, not yet reaped by its parent, here this process) can still be signalled but runs no more:
    stop_process returns instead of waiting out its timeout, then SIGKILLing nothing."""
    exited = subprocess.Popen(["true"], start_new_session=True)
    running = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        stat = Path(f"/proc/{exited.pid}/stat")
        for _ in range(200):
            if stat.read_text().rsplit(")", 1)[-1].split()[0] == "Z":
                break
            time.sleep(0.05)
        os.killpg(exited.pid, 0)  # the group can still be signalled
        assert not services.group_runs(exited.pid)
        assert services.group_runs(running.pid)
        services.stop_process(exited.pid, timeout_s=600)  # counting the zombie, this would wait 600 s
        services.stop_process(running.pid)
        assert running.wait(timeout=20) == -15  # SIGTERM ended it
    finally:
        for process in (exited, running):
            if process.poll() is None:
                process.kill()
            process.wait()


def test_a_reused_pid_is_told_apart_by_start_time_and_command_line() -> None:
    me = services.process_identity(os.getpid())
    assert me is not None and services.is_recorded(me) == (True, "")
    assert not services.is_recorded({**me, "start": me["start"] + 1})[0]
    assert not services.is_recorded({**me, "cmdline": ["mlflow", "server"]})[0]
    assert not services.is_recorded({**me, "boot": "another-boot"})[0]


def listening_socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(1)
    return sock


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow
@pytest.mark.parametrize("taken, flag", [("pg", "--pg-port"), ("mlflow", "--mlflow-port")])
def test_up_on_a_taken_port_names_the_port_and_its_flag_before_starting_anything(tmp_path: Path, taken: str,
                                                                                  flag: str) -> None:
    holder = listening_socket()  # what a running `services up` of another --dir looks like from here
    try:
        port = holder.getsockname()[1]
        other = free_port()
        pg, mlflow = (port, other) if taken == "pg" else (other, port)
        folder = tmp_path / "second"
        done = cli("up", "--dir", str(folder), "--pg-port", str(pg), "--mlflow-port", str(mlflow))
    finally:
        holder.close()
    assert done.returncode == 2
    message = done.stderr.strip()
    assert len(message.splitlines()) == 1, message
    assert f"port {port} on 127.0.0.1 is already in use" in message and f"{flag} PORT" in message
    assert "nothing was started" in message
    assert not (folder / "postgres").exists() and not (folder / "services.json").exists()


@pytest.mark.slow
def test_up_refuses_one_port_for_both_services(tmp_path: Path) -> None:
    port = free_port()
    done = cli("up", "--dir", str(tmp_path / "svc"), "--pg-port", str(port), "--mlflow-port", str(port))
    assert done.returncode == 2 and "--pg-port and --mlflow-port are both" in done.stderr
