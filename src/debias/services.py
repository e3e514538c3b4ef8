"""``debias services up|down|status``: the shared services of a team (or a team of one), without containers.

- PostgreSQL (the OS's packages: Debian ``apt-get install postgresql``) holding MLflow's runs, listening on
  127.0.0.1 only; a private cluster in ``<dir>/postgres`` (trust authentication on the loopback: nobody else
  on the machine should share it; a team's server gets a password in its URI instead).
- ``mlflow server --backend-store-uri postgresql+psycopg://... --serve-artifacts --artifacts-destination
  <dir>/artifacts`` on 127.0.0.1: every stage of every experiment logs there (``MLFLOW_TRACKING_URI``), and the
  clients upload artifacts through the server, so no node needs the artifact folder mounted.
- A DVC remote, ``<dir>/dvc-remote``: the run-cache and the experiments' outputs that ``debias sweep``'s SLURM
  tasks share (``--dvc-remote``).

``<dir>/services.json`` records the URIs, process ids and logs; ``debias services status`` checks each service.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
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
    if sh(as_postgres([str(binaries / "pg_ctl"), "-D", str(data), "status"]), check=False).returncode != 0:
        sh(as_postgres([str(binaries / "pg_ctl"), "-D", str(data), "-l", str(socket_dir / "postgres.log"), "-w", "-t", "60",
                        "-o", f"-c listen_addresses=127.0.0.1 -p {port} -k {socket_dir}", "start"]))
    psql = [str(binaries / "psql"), "-h", "127.0.0.1", "-p", str(port), "-U", "postgres", "-d", "postgres", "-tAc"]
    exists = sh(as_postgres([*psql, f"SELECT 1 FROM pg_database WHERE datname = '{DATABASE}'"])).stdout.strip()
    if exists != "1":
        sh(as_postgres([*psql, f"CREATE DATABASE {DATABASE}"]))
    return f"postgresql+psycopg://postgres@127.0.0.1:{port}/{DATABASE}"


def start_mlflow(folder: Path, backend: str, port: int, timeout_s: float = HEALTH_TIMEOUT_S) -> tuple[int, str]:
    """``mlflow server`` on 127.0.0.1:``port`` (one worker) with served artifacts; waits for /health. Returns
    (pid, tracking URI)."""
    try:
        import psycopg  # noqa: F401  (SQLAlchemy's postgresql+psycopg driver)
    except ImportError:
        raise ServicesError("the PostgreSQL driver is missing: pip install -e '.[cluster]' (psycopg[binary])") from None
    uri = f"http://127.0.0.1:{port}"
    if healthy(uri):
        raise ServicesError(f"something already answers on {uri}: `debias services down`, or choose --mlflow-port")
    log = open(folder / "mlflow.log", "ab")
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "true"}
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


def stop_process(pid: int, timeout_s: float = 20.0) -> None:
    """SIGTERM the process group of ``pid`` (mlflow server and its workers), SIGKILL after ``timeout_s``."""
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        try:
            os.killpg(pid, 0)
        except ProcessLookupError:
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
    backend = start_postgres(folder, pg_port)
    remote = folder / "dvc-remote"
    remote.mkdir(exist_ok=True)
    pid, uri = start_mlflow(folder, backend, mlflow_port)
    record = {"tracking_uri": uri, "backend_store_uri": backend, "artifacts": str(folder / "artifacts"),
              "dvc_remote": str(remote), "mlflow_pid": pid, "postgres_data": str(folder / "postgres"),
              "logs": [str(folder / "postgres-run" / "postgres.log"), str(folder / "mlflow.log")]}
    record_path(folder).write_text(json.dumps(record, indent=1))
    return record


def read_record(folder: Path) -> dict[str, Any] | None:
    path = record_path(folder)
    return json.loads(path.read_text()) if path.is_file() else None


def down(folder: Path) -> list[str]:
    """Stop the MLflow server and PostgreSQL of ``folder`` (their data stay); returns what was stopped."""
    folder = folder.resolve()
    record = read_record(folder) or {}
    stopped = []
    if record.get("mlflow_pid"):
        stop_process(int(record["mlflow_pid"]))
        stopped.append(f"mlflow server (pid {record['mlflow_pid']})")
    data = folder / "postgres"
    if (data / "postmaster.pid").exists():
        sh(as_postgres([str(postgres_bin() / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"]))
        stopped.append(f"PostgreSQL ({data})")
    if record:
        record["mlflow_pid"] = None
        record_path(folder).write_text(json.dumps(record, indent=1))
    return stopped


def status(folder: Path) -> list[tuple[str, bool, str]]:
    """(service, up?, detail) of each service of ``folder``."""
    folder = folder.resolve()
    record = read_record(folder) or {}
    data = folder / "postgres"
    pg_up = (data / "postmaster.pid").exists() and sh(
        as_postgres([str(postgres_bin() / "pg_ctl"), "-D", str(data), "status"]), check=False).returncode == 0
    uri = record.get("tracking_uri")
    remote = record.get("dvc_remote")
    return [("postgresql", pg_up, record.get("backend_store_uri") or str(data)),
            ("mlflow", bool(uri) and healthy(uri), uri or "never started"),
            ("dvc-remote", bool(remote) and Path(remote).is_dir(), remote or "never made")]


def main(args: argparse.Namespace) -> int:
    from debias.paths import repo_root

    folder = Path(args.dir) if args.dir else repo_root() / DEFAULT_DIR
    try:
        if args.action == "up":
            record = up(folder, args.pg_port, args.mlflow_port)
            print(f"services of {folder.resolve()} are up:\n"
                  f"  export MLFLOW_TRACKING_URI={record['tracking_uri']}\n"
                  f"  dvc remote add -d shared {record['dvc_remote']}   # or: debias sweep --dvc-remote "
                  f"{record['dvc_remote']}\n  logs: {', '.join(record['logs'])}")
        elif args.action == "down":
            stopped = down(folder)
            print("stopped " + (", ".join(stopped) if stopped else "nothing (no service was running)"))
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
