"""A stage forked by the fork server behaves as the plain process ``DEBIAS_FORKSERVER=0`` starts, for real.

Each differential test runs the same tiny probe stage through ``python -m debias.launch --single`` with the
server on and off under one condition (``nohup`` and a hang-up, ``cmd &`` in a script and SIGINT/SIGQUIT, a
``taskset`` pin, ``ulimit -v``, a SIGKILL of the launcher) and compares the exit code, what the stage printed and
what it wrote. Every launcher here is pinned to one CPU with ``taskset`` where it exists (so that one server
started under the same pin serves them all, and the pin itself is under test). Linux only, as the server.
"""

from __future__ import annotations

import fcntl
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

from debias.forkserver import protocol
from debias.forkserver.server import remove_stale, why_not_forked

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the fork server runs on Linux only")

PROBE = textwrap.dedent("""
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
# Thread settings that would hide how the pools size themselves
THREAD_SETTINGS = ("DEBIAS_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMBA_NUM_THREADS")


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


def _pin() -> list[str]:
    """``taskset -c CPU`` (this process's first CPU), or nothing where taskset is missing."""
    taskset = shutil.which("taskset")
    return [taskset, "-c", str(min(os.sched_getaffinity(0)))] if taskset else []


def _launch_words(action: str, folder: Path) -> list[str]:
    return [*_pin(), sys.executable, "-m", "debias.launch", "--single", "probe.py", action, str(folder)]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A folder with the probe and the environment of a server of its own, started pinned as the launchers are."""
    root = tmp_path_factory.mktemp("plain")
    runtime = Path(tempfile.mkdtemp(prefix="dfp", dir="/tmp"))  # short: a socket path holds < 108 bytes
    (root / "probe.py").write_text(PROBE)
    env = {key: value for key, value in os.environ.items() if key not in THREAD_SETTINGS}
    env.update(XDG_RUNTIME_DIR=str(runtime), DEBIAS_FORKSERVER_IDLE="120", DEBIAS_FORKSERVER="1", TMPDIR=str(root))
    where = subprocess.run([*_pin(), sys.executable, "-m", "debias.forkserver", "--where"], cwd=root, env=env,
                           capture_output=True, text=True, check=True).stdout.strip()
    first = root / "first"
    first.mkdir()
    subprocess.run(_launch_words("memory", first), cwd=root, env=env, capture_output=True, timeout=120, check=True)
    deadline = time.monotonic() + 150
    while not Path(where).exists():
        assert time.monotonic() < deadline, "the fork server did not start: " + "".join(
            path.read_text() for path in runtime.glob("debias/*.log"))
        time.sleep(0.2)
    yield root, env
    _stop(where)


def _stop(sock: str) -> None:
    """SIGTERM the server of ``sock`` (its command line names its socket)."""
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if sock.encode() in cmdline.read_bytes():
                os.kill(int(cmdline.parent.name), signal.SIGTERM)
        except (OSError, ValueError):
            continue


def _wait_for(path: Path, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert time.monotonic() < deadline, f"{path.name} never appeared"
        time.sleep(0.02)


def _gone(pid: int, seconds: float = 20) -> bool:
    """True once ``pid`` has ended (a zombie counts: it runs nothing)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in "ZX":
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
            _wait_for(folder / "waiting")
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
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def _until(condition, seconds: float = 10) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_ctrl_z_stops_the_stage_and_fg_continues_it(server, tmp_path) -> None:
    def stop_and_continue(_process, stage, launcher):
        os.kill(launcher, signal.SIGTSTP)  # what the terminal sends the foreground job on Ctrl-Z
        assert _until(lambda: _state(stage) == "T") and _until(lambda: _state(launcher) == "T")
        os.kill(launcher, signal.SIGCONT)  # `fg`
        assert _until(lambda: _state(stage) != "T") and _until(lambda: _state(launcher) != "T")

    outcomes = _both(server, tmp_path, lambda folder: _launch_words("wait", folder), stop_and_continue)
    assert outcomes["1"].stage != outcomes["1"].launcher
    assert outcomes["0"].code == 0 and "output.txt" in outcomes["0"].files
    assert outcomes["1"].same_as(outcomes["0"]), (outcomes["1"], outcomes["0"])


def test_a_stage_killed_with_its_launcher_writes_nothing_more(server, tmp_path) -> None:
    def kill(process, stage, _launcher):
        process.kill()  # SIGKILL: nothing can pass it on
        process.wait(timeout=60)
        assert _gone(stage), "the stage outlived its launcher"

    outcomes = _both(server, tmp_path, lambda folder: _launch_words("wait", folder), kill)
    assert outcomes["1"].stage != outcomes["1"].launcher
    assert outcomes["0"].code == -signal.SIGKILL and "output.txt" not in outcomes["0"].files
    assert outcomes["1"].same_as(outcomes["0"]), (outcomes["1"], outcomes["0"])


def test_a_stage_whose_watcher_is_killed_dies_and_its_launcher_says_so(server, tmp_path) -> None:
    seen = {}

    def kill_watcher(_process, stage, _launcher):
        seen["watcher"] = watcher = int(Path(f"/proc/{stage}/stat").read_text().rsplit(")", 1)[1].split()[1])
        os.kill(watcher, signal.SIGKILL)
        assert _gone(stage), "the stage outlived its watcher"

    outcome = _run(server, "1", tmp_path / "fs1", _launch_words("wait", tmp_path / "fs1"), kill_watcher)
    assert outcome.stage != outcome.launcher and seen["watcher"] not in (outcome.stage, outcome.launcher)
    assert outcome.code == 1 and "was killed with it" in outcome.stderr
    assert "output.txt" not in outcome.files  # the go came after its death: nothing written


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


def test_thread_pools_random_state_and_names_are_a_new_process_s(server, tmp_path) -> None:
    """Pinned by ``taskset``, the forked stage's torch, OpenMP, OpenBLAS and numba pools are sized as a new process
    sizes them; its command line and name are ``python probe.py ...``; its global random state (NumPy's, torch's)
    is its own, as each new process's is."""
    if not _pin():
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


def test_the_server_s_identity_follows_the_launcher_s_pin_and_hard_limits(tmp_path) -> None:
    if not _pin() or len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs taskset and two usable CPUs")
    env = {**os.environ, "XDG_RUNTIME_DIR": str(tmp_path)}

    def where(*prefix: str) -> str:
        return subprocess.run([*prefix, sys.executable, "-m", "debias.forkserver", "--where"], env=env,
                              capture_output=True, text=True, check=True).stdout.strip()

    plain = where()
    assert where(*_pin()) != plain
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


def test_a_forked_stage_trains_on_the_cuda_device_as_a_plain_one(server, tmp_path) -> None:
    """The check that would let the server on by default where CUDA is visible (it is off there until it passes)."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device on this machine")
    outcomes = _both(server, tmp_path, lambda folder: _launch_words("cuda", folder))  # DEBIAS_FORKSERVER=1: on
    assert outcomes["1"].stage != outcomes["1"].launcher  # forked
    assert outcomes["0"].code == 0 and json.loads(outcomes["0"].stdout)["device"] == "cuda:0"
    assert outcomes["1"].same_as(outcomes["0"]), (outcomes["1"], outcomes["0"])
