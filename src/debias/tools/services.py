"""``debias services up|down|status``: the shared services of a team (or a team of one), without containers.

- PostgreSQL (the OS's packages: Debian ``apt-get install postgresql``) holding MLflow's runs, listening on
  127.0.0.1 only; a private cluster in ``<dir>/postgres`` (trust authentication on the loopback: nobody else
  on the machine should share it; a team's server gets a password in its URI instead).
- ``mlflow server --backend-store-uri postgresql+psycopg://... --serve-artifacts --artifacts-destination
  <dir>/artifacts`` on 127.0.0.1: every stage of every experiment logs there (``MLFLOW_TRACKING_URI``), and the
  clients upload artifacts through the server, so no node needs the artifact folder mounted. MLflow's job runner
  (huey consumer processes for its GenAI jobs, which debias never submits) is off unless
  ``MLFLOW_SERVER_ENABLE_JOB_EXECUTION`` is set.
- A DVC remote, ``<dir>/dvc-remote``: the run-cache and the experiments' outputs that ``debias sweep``'s SLURM
  tasks share (``--dvc-remote``).

``<dir>/services.json`` records the URIs, process ids and logs, and the identity of the MLflow server's process
(its start time and command line): ``down`` signals a process only when it is still that one
(:func:`process_identity`), so a pid reused after a crash or a reboot is never killed; the same holds for the
PostgreSQL server named by ``postmaster.pid``. ``up`` checks that both ports are free before starting anything.
``debias services status`` checks each service.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

DEFAULT_DIR = ".services"  # at the repository root (git-ignored)
DATABASE = "mlflow"
HEALTH_TIMEOUT_S = 180.0  # mlflow server's first start migrates the database: about 20 s measured on 2 CPUs


class ServicesError(RuntimeError):
    """A service that cannot be started or stopped, with what is missing."""


def postgres_bin() -> Path:
    """The folder of PostgreSQL's server programs (initdb, pg_ctl): Debian's /usr/lib/postgresql/<v>/bin (the
    newest), else the one holding ``initdb`` on PATH."""
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parent.parent.name)
                      if p.parent.parent.name.isdigit() else 0)
    if versions:
        return versions[-1].parent
    found = shutil.which("initdb")
    if found:
        return Path(found).parent
    raise ServicesError("PostgreSQL's server programs (initdb, pg_ctl) are not installed: on Debian/Ubuntu "
                        "`apt-get install postgresql`")


def as_postgres(command: list[str]) -> list[str]:
    """PostgreSQL refuses to run as root: as root, the command runs as the OS user ``postgres``."""
    return ["runuser", "-u", "postgres", "--", *command] if os.geteuid() == 0 else command


def sh(command: list[str], check: bool = True, **kwargs: Any) -> subprocess.CompletedProcess:
    done = subprocess.run(command, capture_output=True, text=True, **kwargs)
    if check and done.returncode != 0:
        raise ServicesError(f"{' '.join(command)} failed ({done.returncode}): {(done.stderr or done.stdout).strip()[-1500:]}")
    return done


def healthy(uri: str, timeout_s: float = 3.0) -> bool:
    try:
        with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=timeout_s) as response:
            return response.status == 200
    except Exception:
        return False


# --------------------------------------------------------------------------- which process is which


def boot_id() -> str | None:
    """This boot's id (Linux); None where unknown. Process start times count from boot, so they only compare
    within one boot."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None


def can_identify() -> bool:
    """Whether processes can be identified here (Linux's /proc)."""
    return Path("/proc/self/stat").is_file()


def process_identity(pid: int) -> dict[str, Any] | None:
    """``{"pid", "start", "cmdline", "boot"}`` of a running process: its start time (clock ticks since boot, field 22
    of /proc/<pid>/stat) and command line; None when no such process runs or /proc cannot tell (not Linux, or
    another user's process hidden)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except (OSError, ValueError):
        return None
    fields = stat.rsplit(")", 1)[-1].split()  # after the command name, which may hold spaces and ')'
    if len(fields) < 20 or fields[0] == "Z":  # a zombie runs nothing
        return None
    return {"pid": pid, "start": int(fields[19]), "cmdline": [a for a in argv if a], "boot": boot_id()}


def is_recorded(identity: dict[str, Any] | None) -> tuple[bool, str]:
    """Whether the process recorded as ``identity`` (by :func:`process_identity` when it started) still runs:
    the same pid, boot, start time and command line. Returns (yes?, what runs under that pid instead)."""
    if not identity or not identity.get("pid"):
        return False, "no process recorded"
    now = process_identity(int(identity["pid"]))
    if now is None:
        return False, f"no process with pid {identity['pid']} runs"
    same = (now["start"] == identity.get("start") and now["cmdline"] == identity.get("cmdline")
            and (identity.get("boot") is None or now["boot"] == identity.get("boot")))
    return same, "" if same else f"pid {now['pid']} is now another process: {' '.join(now['cmdline'])[:200]!r}"


def port_problem(port: int, host: str = "127.0.0.1") -> str | None:
    """Why a server could not listen on ``host:port`` (None: it could): a listening socket there (or on every
    address) makes a test bind fail."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a port in TIME_WAIT is free to a server
        try:
            probe.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return "is already in use (another `debias services up`, or another program)"
            return f"cannot be used ({exc.strerror or exc})"
    return None


def check_ports(folder: Path, pg_port: int, mlflow_port: int) -> None:
    """Refuse to start when a port the services need is taken, naming the port and the flag that moves it
    (the PostgreSQL port is checked only when this folder's own cluster is not already running on it)."""
    if pg_port == mlflow_port:
        raise ServicesError(f"--pg-port and --mlflow-port are both {pg_port}; give them different ports")
    wanted = [(mlflow_port, "--mlflow-port", "mlflow server")]
    if not postgres_running(folder):
        wanted.insert(0, (pg_port, "--pg-port", "PostgreSQL"))
    for port, flag, service in wanted:
        problem = port_problem(port)
        if problem:
            raise ServicesError(f"port {port} on 127.0.0.1 {problem}, so {service} cannot listen there; nothing was "
                                f"started: choose a free port with {flag} PORT (the other services' --dir has its own "
                                "ports in its services.json)")


def postmaster_pid(folder: Path) -> int | None:
    """The pid ``<dir>/postgres/postmaster.pid`` names (its first line); None without the file."""
    try:
        first = (folder / "postgres" / "postmaster.pid").read_text().split("\n", 1)[0].strip()
    except OSError:
        return None
    return int(first) if first.isdigit() else None


def postgres_running(folder: Path) -> bool:
    """Whether this folder's PostgreSQL server runs: the pid of postmaster.pid is a ``postgres`` process started
    on this folder's data directory (``-D <dir>/postgres``), not a pid reused by another program."""
    return postgres_process(folder)[0]


def postgres_process(folder: Path) -> tuple[bool, str]:
    """(this folder's postmaster runs?, what runs under postmaster.pid's pid instead, when not). Without /proc:
    what ``pg_ctl status`` says."""
    if not can_identify():
        running = sh(as_postgres([str(postgres_bin() / "pg_ctl"), "-D", str(folder / "postgres"), "status"]),
                     check=False).returncode == 0
        return running, "" if running else "pg_ctl status: not running"
    pid = postmaster_pid(folder)
    if pid is None:
        return False, "no postmaster.pid"
    now = process_identity(pid)
    if now is None:
        return False, f"postmaster.pid names pid {pid}, which no longer runs"
    argv, data = now["cmdline"], str(folder / "postgres")
    ours = bool(argv) and Path(argv[0]).name in ("postgres", "postmaster") and any(
        a == "-D" and b == data for a, b in zip(argv, argv[1:]))
    return ours, "" if ours else f"postmaster.pid names pid {pid}, which is another process: {' '.join(argv)[:200]!r}"


def start_postgres(folder: Path, port: int) -> str:
    """Initialise (once) and start the private PostgreSQL cluster of ``folder``; create the MLflow database.
    Returns the SQLAlchemy URI of the database."""
    binaries = postgres_bin()
    data, socket_dir = folder / "postgres", folder / "postgres-run"  # run: its socket and log
    for path in (data, socket_dir):
        path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0:
        if shutil.which("runuser") is None or sh(["id", "postgres"], check=False).returncode != 0:
            raise ServicesError("running as root, PostgreSQL needs the OS user `postgres` (made by Debian's "
                                "postgresql package) and runuser")
        for path in (data, socket_dir):
            shutil.chown(path, "postgres")
        data.chmod(0o700)
        if sh(as_postgres(["test", "-w", str(data)]), check=False).returncode != 0:
            raise ServicesError(f"the OS user postgres cannot reach {data}: choose a --dir whose parent folders "
                                "others may enter (chmod o+x), e.g. under /srv or /var/tmp")
    if not (data / "PG_VERSION").exists():
        sh(as_postgres([str(binaries / "initdb"), "-D", str(data), "--auth=trust", "-U", "postgres", "-E", "UTF8"]))
    if not postgres_running(folder):
        if can_identify():  # a stale lock file (its pid is gone or another program's) would make postgres refuse
            (data / "postmaster.pid").unlink(missing_ok=True)
        sh(as_postgres([str(binaries / "pg_ctl"), "-D", str(data), "-l", str(socket_dir / "postgres.log"), "-w", "-t", "60",
                        "-o", f"-c listen_addresses=127.0.0.1 -p {port} -k {socket_dir}", "start"]))
    psql = [str(binaries / "psql"), "-h", "127.0.0.1", "-p", str(port), "-U", "postgres", "-d", "postgres", "-tAc"]
    exists = sh(as_postgres([*psql, f"SELECT 1 FROM pg_database WHERE datname = '{DATABASE}'"])).stdout.strip()
    if exists != "1":
        sh(as_postgres([*psql, f"CREATE DATABASE {DATABASE}"]))
    return f"postgresql+psycopg://postgres@127.0.0.1:{port}/{DATABASE}"


def start_mlflow(folder: Path, backend: str, port: int, timeout_s: float = HEALTH_TIMEOUT_S) -> tuple[int, str]:
    """``mlflow server`` on 127.0.0.1:``port`` (one worker, in its own process group) with served artifacts; waits
    for /health. Returns (pid, tracking URI); :func:`process_identity` of the pid is what ``down`` checks."""
    try:
        import psycopg  # noqa: F401  (SQLAlchemy's postgresql+psycopg driver)
    except ImportError:
        raise ServicesError("the PostgreSQL driver is missing: pip install -e '.[cluster]' (psycopg[binary])") from None
    uri = f"http://127.0.0.1:{port}"
    if healthy(uri):
        raise ServicesError(f"something already answers on {uri}: `debias services down`, or choose --mlflow-port PORT")
    log = open(folder / "mlflow.log", "ab")
    env = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", **os.environ, "MLFLOW_DISABLE_TELEMETRY": "true",
           "DO_NOT_TRACK": "true"}
    process = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", backend, "--serve-artifacts",
         "--artifacts-destination", str(folder / "artifacts"), "--host", "127.0.0.1", "--port", str(port),
         "--workers", "1"], stdout=log, stderr=subprocess.STDOUT, env=env, cwd=folder, start_new_session=True)
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if process.poll() is not None:
            tail = (folder / "mlflow.log").read_text(errors="replace")[-2000:]
            raise ServicesError(f"mlflow server exited ({process.returncode}); {folder / 'mlflow.log'} ends:\n{tail}")
        if healthy(uri):
            return process.pid, uri
        time.sleep(1)
    stop_process(process.pid)
    raise ServicesError(f"mlflow server did not answer on {uri} within {timeout_s:.0f} s ({folder / 'mlflow.log'})")


def group_runs(pgid: int) -> bool:
    """Whether a process of group ``pgid`` still runs. A member that exited and waits for its parent to reap it (a
    zombie: state ``Z`` in /proc/<pid>/stat) runs no more, though the group can still be signalled; without /proc,
    whether it can be signalled."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return not can_identify() or bool(group_members(pgid))


def group_members(pgid: int) -> list[int]:
    """The pids of the processes of group ``pgid`` that run (zombies left out), from /proc."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            state, _, group = stat.read_text().rsplit(")", 1)[-1].split()[:3]  # after the command name
        except (OSError, ValueError):
            continue  # ended while listed
        if int(group) == pgid and state != "Z":
            members.append(int(stat.parent.name))
    return members


def stop_process(pid: int, timeout_s: float = 20.0) -> None:
    """SIGTERM the process group of ``pid`` (mlflow server and its workers), SIGKILL after ``timeout_s``; done once
    no process of the group runs (:func:`group_runs`)."""
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if not group_runs(pid):
            return
        time.sleep(0.3)
    os.killpg(pid, signal.SIGKILL)


def record_path(folder: Path) -> Path:
    return folder / "services.json"


def up(folder: Path, pg_port: int, mlflow_port: int) -> dict[str, Any]:
    """Start PostgreSQL, the MLflow server and make the DVC remote folder; returns (and saves) the record."""
    folder = folder.resolve()
    folder.mkdir(parents=True, exist_ok=True)
    old = read_record(folder)
    if old and old.get("mlflow_pid") and healthy(old["tracking_uri"]):
        raise ServicesError(f"the services of {folder} already run ({old['tracking_uri']}); `debias services status`")
    check_ports(folder, pg_port, mlflow_port)
    backend = start_postgres(folder, pg_port)
    remote = folder / "dvc-remote"
    remote.mkdir(exist_ok=True)
    pid, uri = start_mlflow(folder, backend, mlflow_port)
    record = {"tracking_uri": uri, "backend_store_uri": backend, "artifacts": str(folder / "artifacts"),
              "dvc_remote": str(remote), "mlflow_pid": pid, "mlflow_process": process_identity(pid),
              "postgres_data": str(folder / "postgres"),
              "logs": [str(folder / "postgres-run" / "postgres.log"), str(folder / "mlflow.log")]}
    record_path(folder).write_text(json.dumps(record, indent=1))
    return record


def read_record(folder: Path) -> dict[str, Any] | None:
    path = record_path(folder)
    return json.loads(path.read_text()) if path.is_file() else None


def recorded_mlflow(record: dict[str, Any], folder: Path) -> tuple[bool, str]:
    """Whether the record's mlflow pid is still the server ``up`` started: its recorded identity (start time and
    command line), or, in a record written before identities were kept, a command line naming this folder's
    artifacts and the record's port. Returns (yes?, why not)."""
    pid = int(record["mlflow_pid"])
    if record.get("mlflow_process"):
        return is_recorded({**record["mlflow_process"], "pid": pid})
    now = process_identity(pid)
    if now is None:
        return False, f"no process with pid {pid} runs"
    argv = now["cmdline"]
    port = str(record.get("tracking_uri", "")).rsplit(":", 1)[-1]
    ours = "mlflow" in " ".join(argv) and str(folder / "artifacts") in argv and port in argv
    return ours, "" if ours else f"pid {pid} is now another process: {' '.join(argv)[:200]!r}"


def down(folder: Path) -> tuple[list[str], list[str]]:
    """Stop the MLflow server and PostgreSQL of ``folder`` (their data stay). A process is signalled only when it
    is still the one started (:func:`recorded_mlflow`, :func:`postgres_process`); a stale pid (the service crashed
    or the machine rebooted, and the pid may now be another program's) is dropped from the record, never
    signalled. Returns (what was stopped, what was found not running and why)."""
    folder = folder.resolve()
    record = read_record(folder) or {}
    stopped, stale = [], []
    if record.get("mlflow_pid"):
        ours, why = recorded_mlflow(record, folder)
        if ours:
            stop_process(int(record["mlflow_pid"]))
            stopped.append(f"mlflow server (pid {record['mlflow_pid']})")
        else:
            stale.append(f"mlflow server was not running ({why}); its stale pid {record['mlflow_pid']} was removed "
                         "from services.json and nothing was signalled")
    data = folder / "postgres"
    if (data / "postmaster.pid").exists():
        ours, why = postgres_process(folder)
        if ours:
            sh(as_postgres([str(postgres_bin() / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"]))
            stopped.append(f"PostgreSQL ({data})")
        else:
            stale.append(f"PostgreSQL was not running ({why}); nothing was signalled (the next `up` replaces the "
                         "stale postmaster.pid)")
    if record:
        record["mlflow_pid"] = None
        record["mlflow_process"] = None
        record_path(folder).write_text(json.dumps(record, indent=1))
    return stopped, stale


def status(folder: Path) -> list[tuple[str, bool, str]]:
    """(service, up?, detail) of each service of ``folder``."""
    folder = folder.resolve()
    record = read_record(folder) or {}
    data = folder / "postgres"
    pg_up = postgres_running(folder) and sh(
        as_postgres([str(postgres_bin() / "pg_ctl"), "-D", str(data), "status"]), check=False).returncode == 0
    uri = record.get("tracking_uri")
    remote = record.get("dvc_remote")
    return [("postgresql", pg_up, record.get("backend_store_uri") or str(data)),
            ("mlflow", bool(uri) and healthy(uri), uri or "never started"),
            ("dvc-remote", bool(remote) and Path(remote).is_dir(), remote or "never made")]


def main(args: argparse.Namespace) -> int:
    from debias.core.paths import repo_root

    folder = Path(args.dir) if args.dir else repo_root() / DEFAULT_DIR
    try:
        if args.action == "up":
            record = up(folder, args.pg_port, args.mlflow_port)
            print(f"services of {folder.resolve()} are up:\n"
                  f"  export MLFLOW_TRACKING_URI={record['tracking_uri']}\n"
                  f"  dvc remote add -d shared {record['dvc_remote']}   # or: debias sweep --dvc-remote "
                  f"{record['dvc_remote']}\n  logs: {', '.join(record['logs'])}")
        elif args.action == "down":
            stopped, stale = down(folder)
            print("stopped " + (", ".join(stopped) if stopped else "nothing (no service was running)"))
            for line in stale:
                print(line)
        else:
            found = status(folder)
            for name, running, detail in found:
                print(f"{name:<11} {'up' if running else 'DOWN':<5} {detail}")
            return 0 if all(running for _, running, _ in found) else 1
    except ServicesError as exc:
        print(f"debias services {args.action}: {exc}", file=sys.stderr)
        return 2
    return 0


def add_parser(commands: Any) -> None:
    """The ``services`` subcommand (its handler is ``args.handler``)."""
    p = commands.add_parser("services", help="start/stop PostgreSQL + an MLflow server + a DVC remote folder",
                            description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("action", choices=("up", "down", "status"))
    p.add_argument("--dir", help=f"where their data live (default: {DEFAULT_DIR} at the repository root)")
    p.add_argument("--pg-port", type=int, default=5433, help="PostgreSQL's port on 127.0.0.1 (default 5433: the standard 5432 + 1, "
                   "so a system PostgreSQL keeps its port)")
    p.add_argument("--mlflow-port", type=int, default=5000, help="mlflow server's port on 127.0.0.1 (default 5000: mlflow "
                   "server's own)")
    p.set_defaults(handler=main)
