"""``debias sweep --launcher slurm`` for real: a single-node SLURM cluster (munged, slurmctld and slurmd started
here from a minimal slurm.conf in a temporary folder) and ``debias services up`` (PostgreSQL from the OS packages
+ ``mlflow server --serve-artifacts`` on 127.0.0.1 + a DVC remote folder).

A sweep of 2 tiny experiments (one loss.epsilon x 2 seeds, each seed's upstream computed once in phase 1 and pushed
to the DVC remote) runs as a job array; one task is cancelled (``scancel``) while it runs, reported failed with its
log, and ``--resume`` finishes it. Checked: 2 DVC experiments, 2 finished MLflow parent runs with their stage runs on
the server, ERM trained once per seed (phase 1) and never in the experiments (restored from the remote's run-cache),
``debias compare --source mlflow`` reading every experiment back. Without the services (not root, packages
missing) the tests skip naming what is missing; ``.ci/run`` installs them.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from debias.tools import services
from debias.tools.sweep import slurm as sweep_slurm
from debias.tools.sweep import workspace

pytestmark = pytest.mark.slow

PROGRAMS = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scancel", "scontrol", "sinfo")
# One epsilon: a grid of several values and an upstream shared by two experiments are tests/test_sweep.py's (the
# local launcher); here each task costs a tiny stage 2 on a busy machine.
EPSILONS = (0.25,)
SEEDS = (0, 1)
NAME = "tiny"
EXPERIMENTS = sorted(f"{NAME}-seed{seed}" for seed in SEEDS)  # one epsilon: an override of each job, not in names
EXPERIMENT = "cluster-test"  # the MLflow experiment of the sweep (phase 1: EXPERIMENT-upstream)


def missing_services() -> list[str]:
    """What this machine lacks to run the cluster tests (empty: everything is there)."""
    missing = [p for p in PROGRAMS if shutil.which(p) is None]
    try:
        services.postgres_bin()
    except services.ServicesError:
        missing.append("postgresql (initdb, pg_ctl)")
    for module, package in (("submitit", "submitit"), ("psycopg", "psycopg[binary]")):
        if importlib.util.find_spec(module) is None:
            missing.append(f"python package {package}")
    if os.geteuid() != 0:
        missing.append("root (slurmd launches the jobs; PostgreSQL runs as the OS user postgres)")
    return missing


def free_port() -> int:
    with socket.socket() as handle:
        handle.bind(("127.0.0.1", 0))
        return handle.getsockname()[1]


def shared_folder(prefix: str) -> Path:
    """A temporary folder the OS user postgres can enter (pytest's tmp_path is private to its user)."""
    folder = Path(tempfile.mkdtemp(prefix=prefix, dir="/var/tmp" if Path("/var/tmp").is_dir() else None))
    folder.chmod(0o755)
    return folder


SLURM_CONF = """\
ClusterName=debiastest
SlurmctldHost={host}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
AuthType=auth/munge
AuthInfo=socket={dir}/munge/munge.sock
CredType=cred/munge
StateSaveLocation={dir}/state
SlurmdSpoolDir={dir}/spool
SlurmctldPidFile={dir}/slurmctld.pid
SlurmdPidFile={dir}/slurmd.pid
SlurmctldLogFile={dir}/slurmctld.log
SlurmdLogFile={dir}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
KillWait=5
MpiDefault=none
NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


def stop_pidfile(path: Path) -> None:
    """SIGTERM the daemon whose pid file this test wrote (never a process found by name)."""
    try:
        pid = int(path.read_text().strip())
        os.kill(pid, 15)
    except (OSError, ValueError):
        return
    deadline = time.time() + 10
    while time.time() < deadline:  # munged writes its seed file as it exits: wait before removing the folder
        try:
            os.kill(pid, 0)
        except OSError:
            return
        time.sleep(0.2)


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory):
    missing = missing_services()
    if missing:
        pytest.skip("SLURM/PostgreSQL cluster test needs: " + ", ".join(missing))
    folder = shared_folder("debias-slurm-")
    for sub in ("munge", "state", "spool"):
        (folder / sub).mkdir()
    (folder / "munge").chmod(0o700)
    key = folder / "munge" / "munge.key"
    key.write_bytes(os.urandom(128))
    key.chmod(0o600)
    started = subprocess.run(["munged", "--force", f"--socket={folder}/munge/munge.sock", f"--key-file={key}",
                              f"--pid-file={folder}/munge/munged.pid", f"--log-file={folder}/munge/munged.log",
                              f"--seed-file={folder}/munge/seed"], capture_output=True, text=True)
    if started.returncode != 0:
        shutil.rmtree(folder, ignore_errors=True)
        pytest.skip(f"munged cannot start here: {(started.stderr or started.stdout).strip()[-500:]}")
    conf = folder / "slurm.conf"
    conf.write_text(SLURM_CONF.format(host=socket.gethostname().split(".")[0], dir=folder, ctld_port=free_port(),
                                      d_port=free_port(), cpus=os.cpu_count() or 1))
    env = {**os.environ, "SLURM_CONF": str(conf)}
    previous = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(conf)  # this process's squeue calls (sweep_slurm.squeue_states) too
    try:
        for daemon in ("slurmctld", "slurmd"):
            started = subprocess.run([daemon, "-f", str(conf)], env=env, capture_output=True, text=True)
            if started.returncode != 0:
                log = folder / f"{daemon}.log"
                tail = log.read_text(errors="replace")[-800:] if log.exists() else started.stderr[-800:]
                pytest.skip(f"{daemon} cannot start here (exit {started.returncode}): {tail}")
        deadline = time.time() + 60
        while time.time() < deadline:
            state = subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True, env=env).stdout.strip()
            if state == "idle":
                break
            time.sleep(1)
        else:
            log = (folder / "slurmd.log").read_text(errors="replace")[-1500:] if (folder / "slurmd.log").exists() else ""
            pytest.skip(f"the SLURM node did not become idle here (sinfo: {state!r}); slurmd.log ends:\n{log}")
        yield env
    finally:
        subprocess.run(["scontrol", "shutdown"], env=env, capture_output=True)
        time.sleep(1)
        for pidfile in (folder / "slurmd.pid", folder / "slurmctld.pid", folder / "munge" / "munged.pid"):
            stop_pidfile(pidfile)
        shutil.rmtree(folder, ignore_errors=True)
        if previous is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = previous


@pytest.fixture(scope="module")
def shared_services(slurm):
    folder = shared_folder("debias-services-")
    try:
        try:
            record = services.up(folder, free_port(), free_port())
        except services.ServicesError as exc:
            pytest.skip(f"PostgreSQL + mlflow server cannot start here: {exc}")
        yield record
    finally:
        services.down(folder)
        shutil.rmtree(folder, ignore_errors=True)


def debias(repo: Path, env: dict[str, str], *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "debias.tools.cli", *args], cwd=repo, env=env, capture_output=True,
                          text=True, timeout=timeout)


def wait_for(what: str, check, timeout_s: float, poll_s: float = 3.0):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        found = check()
        if found:
            return found
        time.sleep(poll_s)
    pytest.fail(f"timed out after {timeout_s:.0f} s waiting for {what}")


@pytest.fixture(scope="module")
def swept(slurm, shared_services, tmp_path_factory: pytest.TempPathFactory):
    """The sweep submitted, one running task cancelled, the rest finished, then resumed to the end."""
    from tests.test_pipeline import make_clone

    repo = make_clone(tmp_path_factory.mktemp("cluster") / "repo")
    env = {k: v for k, v in slurm.items() if not k.startswith(("DVC_", "MLFLOW_"))}
    env.update(MLFLOW_TRACKING_URI=shared_services["tracking_uri"], MLFLOW_EXPERIMENT_NAME=EXPERIMENT,
               DEBIAS_TRACKING="required", DEBIAS_THREADS="1", PYTHONPATH=str(repo / "src"),
               GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@t")
    started = time.time()
    launched = debias(repo, env, "sweep", "--name", NAME, "--launcher", "slurm", "--dvc-remote",
                      shared_services["dvc_remote"], "-S", "loss.epsilon=" + ",".join(map(str, EPSILONS)),
                      "--seeds", *map(str, SEEDS), "--upstream", "infer_groups", "--targets", "train_contrastive",
                      "--time", "20")
    assert launched.returncode == 0, launched.stdout + launched.stderr
    state = workspace.load_state(repo, NAME)

    def running_task() -> str | None:
        listed = sweep_slurm.squeue_states([entry["job_id"] for entry in state["slurm"].values()])
        if not listed:  # every task ended before one was seen running: phase 1 failed, or the tasks did
            shown = debias(repo, env, "sweep", "--name", NAME, "--status").stdout
            logs = [entry["log"].replace("_log.out", "_log.err") for entry in state["upstream"].values()]
            ends = "\n".join(Path(log).read_text(errors="replace")[-1500:] for log in logs if Path(log).exists())
            pytest.fail(f"no experiment task ran:\n{shown}\nphase 1 logs end:\n{ends}")
        return next((name for name, entry in state["slurm"].items() if listed.get(entry["job_id"]) == "RUNNING"),
                    None)

    victim = wait_for("an experiment task to run", running_task, 600)
    time.sleep(10)  # mid-run: its clone made, dvc exp run under way (a task takes about a minute)
    subprocess.run(["scancel", state["slurm"][victim]["job_id"]], env=env, check=True)
    def reported_failed():
        shown = debias(repo, env, "sweep", "--name", NAME, "--status")
        return shown if _failed(shown.stdout, victim) else None

    status = wait_for(f"{victim} to be reported failed", reported_failed, 120)
    resumed = debias(repo, env, "sweep", "--name", NAME, "--resume", "--wait", "--poll", "5")
    return {"repo": repo, "env": env, "victim": victim, "status_after_kill": status.stdout, "resumed": resumed,
            "seconds": time.time() - started}


def _failed(text: str, name: str) -> bool:
    return any(line.split()[:2] == [name, "failed"] for line in text.splitlines())


def parent_runs(tracking_uri: str, experiment: str) -> list:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    found = client.get_experiment_by_name(experiment)
    assert found is not None, f"no MLflow experiment {experiment} on {tracking_uri}"
    return client.search_runs([found.experiment_id], max_results=1000)


def group_commands(pgid: int) -> list[str]:
    """The command lines of the running processes of process group ``pgid``."""
    found = []
    for pid in services.group_members(pgid):
        try:
            found.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
        except OSError:
            continue  # ended since
    return found


def test_the_mlflow_server_runs_without_mlflow_s_job_runner(shared_services) -> None:
    """`services up` leaves MLflow's job runner off (huey consumer processes for GenAI jobs debias never submits)."""
    pid = int(shared_services["mlflow_pid"])
    time.sleep(3)  # MLflow starts its job runner from a thread right after the server process
    commands = group_commands(os.getpgid(pid))
    assert any("mlflow" in command and "server" in command for command in commands), commands
    assert not any("huey" in command for command in commands), commands


def test_a_cancelled_task_is_reported_with_its_log_and_resume_finishes_it(swept) -> None:
    text = swept["status_after_kill"]
    line = next(line for line in text.splitlines() if line.split()[:1] == [swept["victim"]])
    # killed: no result, or its dvc exp run stopped by the SIGTERM (the error, not a stray warning)
    assert line.split()[1] == "failed" and "_log.out" in line and ("no result" in line or "Error:" in line), line
    assert swept["resumed"].returncode == 0, swept["resumed"].stdout + swept["resumed"].stderr
    assert f"resuming 1 experiment(s): {swept['victim']}" in swept["resumed"].stdout
    final = debias(swept["repo"], swept["env"], "sweep", "--name", NAME, "--status").stdout
    assert f"0 queued, 0 running, {len(EXPERIMENTS)} done, 0 failed" in final
    print(f"[cluster test] sweep with one cancelled and resumed task: {swept['seconds']:.0f} s")


def test_every_dvc_experiment_exists_in_the_repository(swept) -> None:
    repo = swept["repo"]
    state = workspace.load_state(repo, NAME)
    names = set(EXPERIMENTS)
    assert {job["name"] for job in state["jobs"]} == names
    assert workspace.finished_experiments(repo, state["commit"]) == names
    shown = subprocess.run(["dvc", "exp", "show", "--json"], cwd=repo, capture_output=True, text=True,
                           env=swept["env"], check=True).stdout
    listed = {rev.get("name") for entry in json.loads(shown) for exp in entry.get("experiments") or []
              for rev in exp.get("revs") or []}
    assert names <= listed
    assert not (repo / workspace.SWEEPS / NAME / workspace.CLONES).exists() or not any((repo / workspace.SWEEPS / NAME / workspace.CLONES).iterdir())


def test_every_experiment_has_one_finished_parent_run_with_its_stages_and_upstream_ran_once(swept) -> None:
    uri = swept["env"]["MLFLOW_TRACKING_URI"]
    runs = parent_runs(uri, EXPERIMENT)
    parents = [r for r in runs if r.data.tags.get("debias.kind") == "pipeline"]
    finished = [r for r in parents if r.info.status == "FINISHED"]
    names = sorted(r.data.tags["debias.dvc_experiment"] for r in finished)
    assert names == EXPERIMENTS
    # the cancelled attempt is not passed off as finished: its parent run ended KILLED or FAILED (or never began);
    # one killed between two stages was left FINISHED by the stage before and --resume marked it
    assert all(r.info.status in ("KILLED", "FAILED") for r in parents if r not in finished)
    assert all(r.data.tags["debias.dvc_experiment"] == swept["victim"] for r in parents if r not in finished)
    for parent in finished:
        stages = {r.data.tags.get("debias.stage") for r in runs
                  if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id and r.info.status == "FINISHED"
                  and "debias.restored_from" not in r.data.tags}  # the stages that ran, not those DVC restored
        assert "train_contrastive" in stages, (parent.data.tags["debias.dvc_experiment"], stages)
        assert "train_erm" not in stages  # restored from the run-cache that phase 1 pushed to the DVC remote
        assert parent.data.metrics.get("s2_worst") is not None
    upstream = parent_runs(uri, f"{EXPERIMENT}-upstream")
    erm = [r for r in upstream if r.data.tags.get("debias.stage") == "train_erm"]
    assert len(erm) == len(SEEDS) and all(r.info.status == "FINISHED" for r in erm)  # once per seed, not per experiment
    assert sorted(r.data.params["seed"] for r in erm) == sorted(map(str, SEEDS))


def test_compare_reads_the_sweep_back_from_the_server_with_each_seed_s_results(swept, tmp_path: Path) -> None:
    """Every experiment of the sweep, read from the tracking server, with its seed and its numbers (grouping over
    seeds is tests/test_compare.py's, on synthetic experiments)."""
    env = {**swept["env"], "DEBIAS_TRACKING": "off"}
    done = debias(swept["repo"], env, "compare", "--source", "mlflow", "--no-mlflow", "--out", str(tmp_path / "cmp"),
                  "--width", "200")
    assert done.returncode == 0, done.stdout + done.stderr
    text = done.stdout
    assert f"{len(EXPERIMENTS)} experiments (mlflow); params that differ: seed" in text, text
    rows = {words[0]: words[1:] for words in map(str.split, text.splitlines()) if words and words[0] in EXPERIMENTS}
    assert sorted(rows) == EXPERIMENTS, text
    for name, cells in rows.items():
        assert cells[0] == name.rsplit("seed", 1)[1] and all(float(cell) >= 0 for cell in cells[1:5]), text
    assert (tmp_path / "cmp" / "index.html").is_file()


def test_a_tracking_server_restart_mid_stage_is_retried_and_an_outage_fails_naming_the_server(
        swept, shared_services, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stage logging while the server restarts waits (MLflow's client retries, MLFLOW_HTTP_REQUEST_MAX_RETRIES)
    and loses nothing; a server that stays down fails the stage with a TrackingError naming it, never a gap."""
    import threading

    from mlflow.tracking import MlflowClient

    from debias.core.errors import TrackingError
    from debias.harness.tracking import stage_run

    folder = Path(shared_services["dvc_remote"]).parent
    uri = shared_services["tracking_uri"]
    port = int(uri.rsplit(":", 1)[1])
    for name, value in (("MLFLOW_TRACKING_URI", uri), ("DEBIAS_TRACKING", "required"),
                        ("MLFLOW_EXPERIMENT_NAME", "restart-test")):
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(tmp_path)
    record = services.read_record(folder)

    def restart() -> None:
        time.sleep(2)
        record["mlflow_pid"], _ = services.start_mlflow(folder, record["backend_store_uri"], port)
        record["mlflow_process"] = services.process_identity(record["mlflow_pid"])  # what `down` checks

    with stage_run("restart_probe", {"seed": 0}, record_path=tmp_path / "run.json") as run:
        services.stop_process(int(record["mlflow_pid"]))
        assert not services.healthy(uri)
        thread = threading.Thread(target=restart)
        thread.start()
        run.log_metrics({"after_restart": 1.0})  # retried until the server is back
        thread.join()
    (folder / "services.json").write_text(json.dumps(record))  # the new pid, for `services down`
    logged = MlflowClient(uri).get_run(json.loads((tmp_path / "run.json").read_text())["run_id"])
    assert logged.data.metrics["after_restart"] == 1.0 and logged.info.status == "FINISHED"

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    with pytest.raises(TrackingError, match=uri.replace(".", r"\.")):
        with stage_run("outage_probe", {"seed": 0}) as run:
            services.stop_process(int(record["mlflow_pid"]))
            run.log_metrics({"lost": 1.0})
    record["mlflow_pid"], _ = services.start_mlflow(folder, record["backend_store_uri"], port)
    record["mlflow_process"] = services.process_identity(record["mlflow_pid"])
    (folder / "services.json").write_text(json.dumps(record))
