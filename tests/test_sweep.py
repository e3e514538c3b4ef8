"""``debias sweep`` offline: the grid, its names, the checks before any launch, the shared-upstream plan, the DVC
queue's status parsing and the SLURM result reading. The real runs (SLURM, PostgreSQL, MLflow server) are in
tests/test_cluster.py."""

from __future__ import annotations

import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from debias.tools.cli import main as cli
from debias.tools.sweep import grid, local, slurm, status, workspace
from tests.conftest import committed_text


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A git repository holding the committed params.yaml and dvc.yaml (never the workspace's)."""
    root = tmp_path / "repo"
    root.mkdir()
    (root / "params.yaml").write_text(committed_text("params.yaml"))
    (root / "dvc.yaml").write_text(committed_text("dvc.yaml"))
    for command in (["git", "init", "-q"], ["git", "add", "-A"],
                    ["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "base"]):
        subprocess.run(command, cwd=root, check=True)
    return root


def test_values_split_on_top_level_commas_and_parse_as_yaml_1_2() -> None:
    assert grid.parse_axis("loss.epsilon=0,0.25, 1e-3") == ("loss.epsilon", [0, 0.25, 0.001])
    assert grid.parse_axis("probe.c_grid=[0.1, 1],[1]") == ("probe.c_grid", [[0.1, 1], [1]])
    assert grid.parse_axis("groups.method=true,'a,b'") == ("groups.method", [True, "a,b"])
    for bad in ("loss.epsilon", "=1", "loss.epsilon="):
        with pytest.raises(grid.SweepError, match="expected KEY=VALUE"):
            grid.parse_axis(bad)


def test_the_grid_is_every_combination_with_seeds_innermost_and_readable_unique_names() -> None:
    jobs = grid.grid("eps", {"loss.epsilon": [0, 0.25], "stage2.method": ["cnc", "supcon"]}, [0, 1],
                      {"erm.epochs": 2}, ["train_contrastive"])
    assert len(jobs) == 8 and len({j.name for j in jobs}) == 8
    assert jobs[0].name == "eps-epsilon0-methodcnc-seed0" and jobs[1].overrides["seed"] == 1
    assert all(j.overrides["erm.epochs"] == 2 and j.targets == ["train_contrastive"] for j in jobs)
    assert [j.overrides["loss.epsilon"] for j in jobs] == [0, 0, 0, 0, 0.25, 0.25, 0.25, 0.25]
    with pytest.raises(grid.SweepError, match="seeds once"):
        grid.grid("x", {"seed": [0]}, [1])
    clash = grid.grid("x", {"a.v": ["p/q", "p q"]})  # both become p_q: numbered instead
    assert [j.name for j in clash] == ["x-0", "x-1"]


def test_set_args_round_trip_through_dvcs_yaml_reading() -> None:
    args = grid.set_args({"probe.c_grid": [0.01, 1.0], "groups.method": "true", "loss.epsilon": 0.25})
    assert args[::2] == ["-S"] * 3
    parsed = dict(grid.parse_axis(a) for a in args[1::2])  # the grammar of `dvc exp run -S`
    parsed = {key: values[0] for key, values in parsed.items()}
    assert parsed == {"probe.c_grid": [0.01, 1.0], "groups.method": "true", "loss.epsilon": 0.25}


def test_the_whole_grid_is_checked_before_anything_runs_naming_each_bad_experiment(repo: Path) -> None:
    good = grid.grid("ok", {"loss.epsilon": [0.1, 0.25]}, [0, 1])
    assert len(grid.check_grid(repo, good)) == 4
    bad = grid.grid("bad", {"loss.epsilon": [0.1, "lots"]}) + [grid.Job("typo", {"loss.epsilonn": 1}, ["nope"])]
    with pytest.raises(grid.SweepError) as caught:
        grid.check_grid(repo, bad, upstream="infer_groupz")
    message = str(caught.value)
    assert "bad-epsilonlots" in message and "loss.epsilon" in message
    assert "typo" in message and "epsilonn" in message
    assert "stage 'nope' is not in dvc.yaml" in message and "stage 'infer_groupz'" in message
    assert "bad-epsilon0.1:" not in message
    with pytest.raises(grid.SweepError, match="empty"):
        grid.check_grid(repo, [])


def test_the_same_experiment_twice_is_refused_and_unread_keys_are_said_before_anything_runs(repo: Path) -> None:
    twice = grid.grid("dup", {"stage2.lr": [0.001, 0.001]}, [0])
    with pytest.raises(grid.SweepError, match=r"experiments dup-0 and dup-1 have the same params \(stage2.lr=0.001, "
                                              r"seed=0\): give each value once"):
        grid.check_grid(repo, twice)
    jobs = grid.grid("u", {"stage2.batch_size": [64, 128], "loss.epsilon": [0.25]}, [0],
                     {"stage2.method": "cnc"})
    found = grid.unread_in_grid(jobs, grid.check_grid(repo, jobs))
    assert [m.split(":")[1].strip() for m in found] == ["stage2.batch_size = 64", "stage2.batch_size = 128"]
    assert all("not read under stage2.method cnc" in m for m in found)


def test_an_invalid_grid_launches_nothing(repo: Path, capsys, monkeypatch) -> None:
    code = cli(["sweep", "--repo", str(repo), "--name", "n", "-S", "loss.epsilon=0.1,oops", "--seeds", "0"])
    assert code == 2
    assert "was not launched" in capsys.readouterr().err
    assert not (repo / workspace.SWEEPS / "n").exists()
    assert cli(["sweep", "--repo", str(repo), "--name", "n", "--launcher", "slurm", "-S", "loss.epsilon=0.1"]) == 2
    err = capsys.readouterr().err
    assert "--dvc-remote" in err or "sbatch is not on PATH" in err
    if shutil.which("sbatch"):  # a task's own MLflow store would go with its clone: a server is required
        monkeypatch.setenv("DEBIAS_TRACKING", "required")
        assert cli(["sweep", "--repo", str(repo), "--name", "n", "--launcher", "slurm", "--dvc-remote", "r",
                    "-S", "loss.epsilon=0.1"]) == 2
        assert "MLFLOW_TRACKING_URI" in capsys.readouterr().err
    assert cli(["sweep", "--repo", str(repo), "--name", "missing", "--status"]) == 2
    assert "no sweep named 'missing'" in capsys.readouterr().err


def sweep_cli(repo: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """``debias sweep`` as a user runs it (a process of its own, in ``repo``)."""
    import os
    import sys

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    return subprocess.run([sys.executable, "-m", "debias.tools.cli", "sweep", "--repo", str(repo), *args], cwd=repo,
                          env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["..", ".", "../elsewhere", "a/b", "-rf", ".hidden", "a..b"])
def test_a_sweep_name_that_is_not_one_safe_path_component_writes_nothing(repo: Path, name: str) -> None:
    before = sorted(p.relative_to(repo.parent) for p in repo.parent.rglob("*") if ".git" not in p.parts)
    done = sweep_cli(repo, f"--name={name}", "-S", "loss.epsilon=0.1,0.25", "--seeds", "0")
    assert done.returncode == 2
    assert f"sweep name {name!r}" in done.stderr and "starting with a letter or digit" in done.stderr
    assert sorted(p.relative_to(repo.parent) for p in repo.parent.rglob("*") if ".git" not in p.parts) == before
    assert not (repo / "sweep.json").exists() and not (repo.parent / "sweep.json").exists()
    status = sweep_cli(repo, f"--name={name}", "--status")
    assert status.returncode == 2 and f"sweep name {name!r}" in status.stderr


@pytest.mark.slow
def test_a_huge_range_is_counted_and_refused_at_once_unless_max_points_raises_the_cap(repo: Path) -> None:
    import time

    started = time.monotonic()
    done = sweep_cli(repo, "--name", "big", "-S", "seed=range(0,1000000)")
    assert done.returncode == 2
    assert f"has 1000000 points, more than --max-points = {grid.MAX_POINTS}" in done.stderr
    assert "nothing was validated or queued" in done.stderr
    assert time.monotonic() - started < 60  # counted, not listed or validated (it took hours)
    assert not (repo / workspace.SWEEPS).exists()
    # the product of the axes is what counts: 3 x 2 seeds = 6 against a cap of 5
    done = sweep_cli(repo, "--name", "grid", "--max-points", "5", "-S", "loss.epsilon=0,0.25,0.5", "--seeds", "0", "1")
    assert done.returncode == 2 and "the grid (3 loss.epsilon x 2 seed) has 6 points" in done.stderr
    done = sweep_cli(repo, "--name", "zero", "--max-points", "0", "-S", "loss.epsilon=0,0.25")
    assert done.returncode == 2 and "--max-points = 0; allowed: a whole number >= 1" in done.stderr
    with pytest.raises(grid.SweepError, match="has 3 points, more than --max-points = 2"):
        grid.grid("g", {"loss.epsilon": [0, 1, 2]}, max_points=2)


@pytest.mark.slow
def test_the_number_of_experiments_is_printed_before_they_are_validated(repo: Path) -> None:
    done = sweep_cli(repo, "--name", "count", "--max-points", "4", "-S", "loss.epsilon=0.1,oops", "--seeds", "0", "1")
    assert done.returncode == 2 and "was not launched" in done.stderr  # an invalid value: stops at validation
    assert "[sweep] count: 4 experiments; validating them against the params schema" in done.stdout


def test_upstream_runs_once_per_distinct_value_of_the_params_its_stages_read(repo: Path) -> None:
    graph = grid.stage_graph(repo / "dvc.yaml")
    above = grid.ancestors(graph, "infer_groups")
    assert {"download", "inject_bias", "train_erm", "infer_groups"} <= set(above)
    assert "train_contrastive" not in above
    jobs = grid.grid("g", {"loss.epsilon": [0.1, 0.25, 0.5]}, [0, 1])
    merged = grid.check_grid(repo, jobs, "infer_groups")
    runs = grid.upstream_runs(repo, jobs, merged, "infer_groups")
    assert len(runs) == 2  # seeds change the upstream; loss.epsilon (stage 2) does not
    assert sorted(r["overrides"]["seed"] for r in runs) == [0, 1]
    assert grid.upstream_runs(repo, jobs, merged, None) == []


def test_a_sweep_file_gives_a_grid_or_explicit_experiments(tmp_path: Path) -> None:
    path = tmp_path / "g.yaml"
    path.write_text(yaml.safe_dump({"params": {"loss": {"epsilon": [0.1, 0.25]}}, "seeds": [0, 1, 2],
                                    "set": {"erm": {"epochs": 1}}, "upstream": "infer_groups"}))
    name, jobs, upstream = grid.jobs_from_file(path, "g")
    assert (name, upstream, len(jobs)) == ("g", "infer_groups", 6)
    assert all(j.overrides["erm.epochs"] == 1 for j in jobs)
    path.write_text(yaml.safe_dump({"name": "q", "experiments": [{"name": "a", "set": {"seed": 3},
                                                                   "targets": ["train_erm"]}]}))
    assert grid.jobs_from_file(path, "g")[1] == [grid.Job("a", {"seed": 3}, ["train_erm"])]
    path.write_text(yaml.safe_dump({"parms": {}}))
    with pytest.raises(grid.SweepError, match="parms"):
        grid.jobs_from_file(path, "g")


def test_queue_status_prefers_a_requeued_experiment_over_its_earlier_failure() -> None:
    # a resumed run requeues a failed experiment under its name; the old Failed entry must not end the wait for it
    text = """Task     Name                     Created       Status
4227bcb  adult-s4-cnc             12:49 AM      Failed
6a53e68  adult-s2-cnc             Nov 23, 2026  Failed
614cd0d  adult-s4-cnc             01:41 AM      Running
23c1372  adult-s3-cnc             01:41 AM      Success
d83e00d  adult-s3-cnc             12:49 AM      Failed
9b1e2f0  adult-s0-wcl             01:42 AM      Queued

Worker status: 1 active, 0 idle"""
    assert local.parse_queue_status(text) == {"adult-s4-cnc": "Running", "adult-s2-cnc": "Failed",
                                              "adult-s3-cnc": "Success", "adult-s0-wcl": "Queued"}


def test_a_failed_queue_start_is_reported_not_fatal(monkeypatch, tmp_path, capsys) -> None:
    """Workers already running keep going when one ``dvc queue start`` fails; the next poll retries it."""
    calls = []

    def fake_run(args, **kwargs):
        calls.append(args)
        return subprocess.CompletedProcess(args, 255 if len(calls) == 1 else 0)

    monkeypatch.setattr(local.subprocess, "run", fake_run)
    assert local.start_workers(tmp_path, 2, {}) is False
    assert "dvc queue start -j 2 exited 255" in capsys.readouterr().err
    assert local.start_workers(tmp_path, 2, {}) is True and calls[1] == ["dvc", "queue", "start", "-j", "2"]


QUEUE_HEADER = "Task     Name                     Created       Status\n"


@pytest.mark.slow
def test_the_queue_read_in_process_lists_what_dvc_queue_status_prints(tmp_path: Path) -> None:
    """Two experiments queued in a real DVC repository: the in-process read names each with DVC's status and task,
    as the lines of `dvc queue status` do (its worker line aside), and parses to the same states."""
    root = tmp_path / "tiny"
    root.mkdir()
    (root / "params.yaml").write_text("x: 1\n")
    (root / "dvc.yaml").write_text("stages:\n  s:\n    cmd: echo ${x} > out.txt\n    params: [x]\n    outs: [out.txt]\n")
    env = {**os.environ, "DVC_NO_ANALYTICS": "1"}
    for command in (["git", "init", "-q"], ["dvc", "init", "-q"], ["git", "add", "-A"],
                    ["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "base"],
                    ["dvc", "exp", "run", "--queue", "-n", "first", "-S", "x=2"],
                    ["dvc", "exp", "run", "--queue", "-n", "second", "-S", "x=3"]):
        subprocess.run(command, cwd=root, check=True, capture_output=True, env=env)
    printed = subprocess.run(["dvc", "queue", "status"], cwd=root, check=True, capture_output=True, text=True,
                             env=env).stdout
    read = local.queue_text(root)
    assert local.parse_queue_status(read) == local.parse_queue_status(printed) == {"first": "Queued",
                                                                                   "second": "Queued"}
    tasks = {line.split()[1]: line.split()[0] for line in read.splitlines()}
    assert tasks == {line.split()[1]: line.split()[0] for line in printed.splitlines()[1:] if "Queued" in line}
    assert "Worker" not in read


def _stash_entry(root: Path) -> dict[str, Any]:
    """The newest entry of DVC's queue in ``root``: its commit's files (DVC's repro arguments, .dvc/tmp/repro.dat,
    unpickled with the repository's path as ROOT; every other file's blob), its first parent (the commit it runs),
    message, author and committer (names and emails)."""
    rev = workspace.run(["git", "rev-parse", "refs/exps/celery/stash"], root).strip()
    lines = workspace.run(["git", "cat-file", "-p", rev], root).splitlines()
    header = [line.split(" ", 1) for line in lines[:lines.index("")]]
    people = {key: value.rsplit(" ", 2)[0] for key, value in header if key in ("author", "committer")}  # no dates
    files = {line.split("\t")[1]: line.split()[2] for line in workspace.run(["git", "ls-tree", "-r", rev], root)
             .splitlines()}
    del files[".dvc/tmp/repro.dat"]  # read below: it holds the repository's path
    packed = subprocess.run(["git", "show", f"{rev}:.dvc/tmp/repro.dat"], cwd=root, capture_output=True, check=True)
    repro = pickle.loads(packed.stdout)
    repro["kwargs"]["run_env"]["DVC_ROOT"] = repro["kwargs"]["run_env"]["DVC_ROOT"].replace(str(root), "ROOT")
    return {"files": files, "repro": repro, "parent": [value for key, value in header if key == "parent"][0],
            "message": lines[lines.index("") + 1:], **people}


@pytest.mark.slow
def test_an_experiment_queued_in_process_is_the_entry_dvcs_command_queues(tmp_path: Path, monkeypatch) -> None:
    """local.queue_experiment beside `dvc exp run --queue` with the same arguments, each in its copy of one repository,
    on a machine with no git identity of its own (the sweep's environment gives one): the same queue entry (tree,
    parent, message, author and committer, DVC's repro arguments); an unknown target fails naming the command."""
    for key in [k for k in os.environ if k.startswith(("GIT_", "DVC_"))]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no ~/.gitconfig: no user.name or user.email
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    (tmp_path / "home").mkdir()
    first = tmp_path / "cli"
    first.mkdir()
    (first / "params.yaml").write_text("x: 1\ny: [1, 2]\n")
    (first / "dvc.yaml").write_text("stages:\n  s:\n    cmd: echo ${x} > out.txt\n    params: [x, y]\n"
                                    "    outs: [out.txt]\n  t:\n    cmd: cat out.txt > t.txt\n    deps: [out.txt]\n"
                                    "    outs: [t.txt]\n")
    for command in (["git", "init", "-q"], ["dvc", "init", "-q"], ["dvc", "config", "core.analytics", "false"],
                    ["git", "add", "-A"], ["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "base"]):
        subprocess.run(command, cwd=first, check=True, capture_output=True)
    second = tmp_path / "in-process"
    shutil.copytree(first, second, symlinks=True)
    env = workspace.task_env(1, None, None)
    job = grid.Job("x3", {"x": 3, "y": [4, 5]}, ["s"])
    workspace.run(["dvc", *local.queue_args(job)], first, env)
    local.queue_experiment(second, job, env)
    assert _stash_entry(second) == _stash_entry(first)
    assert _stash_entry(second)["author"] == "debias-sweep <sweep@debias.invalid>"
    assert "GIT_AUTHOR_NAME" not in os.environ  # the sweep's environment was the call's only
    with pytest.raises(RuntimeError, match=r"dvc exp run --queue -n bad .*nowhere.* failed: "):
        local.queue_experiment(second, grid.Job("bad", {"x": 4}, ["nowhere"]), env)


@pytest.mark.slow
def test_a_clones_dvc_settings_are_the_file_dvc_s_commands_write(tmp_path: Path) -> None:
    """A clone's settings (workspace.CLONE_CONFIG) and phase 1's shared cache, written in this process: .dvc/config.local
    byte for byte as `dvc config --local` and `dvc cache dir --local` write it."""
    cache = str(tmp_path / "shared-cache")
    for name in ("cli", "in-process"):
        (tmp_path / name).mkdir()
        for command in (["git", "init", "-q"], ["dvc", "init", "-q"]):
            workspace.run(command, tmp_path / name)
    for section, option, value in workspace.CLONE_CONFIG:
        workspace.run(["dvc", "config", "--local", f"{section}.{option}", value], tmp_path / "cli")
    workspace.run(["dvc", "cache", "dir", "--local", cache], tmp_path / "cli")
    workspace.set_local_config(tmp_path / "in-process", workspace.CLONE_CONFIG)
    workspace.set_local_config(tmp_path / "in-process", [("cache", "dir", cache)])
    written = (tmp_path / "in-process" / ".dvc" / "config.local").read_text()
    assert written == (tmp_path / "cli" / ".dvc" / "config.local").read_text()
    assert "check_update = false" in written and f"dir = {cache}" in written


@pytest.mark.slow
def test_the_cache_folder_read_in_process_is_what_dvc_cache_dir_prints(tmp_path: Path) -> None:
    """workspace.cache_dir beside `dvc cache dir`: the default .dvc/cache, a folder set relative to the repository's
    config file, and one set in .dvc/config.local over it."""
    repo = tmp_path / "repo"
    repo.mkdir()
    for command in (["git", "init", "-q"], ["dvc", "init", "-q"]):
        workspace.run(command, repo)
    printed = lambda: workspace.run(["dvc", "cache", "dir"], repo).strip()  # noqa: E731
    assert workspace.cache_dir(repo) == printed() == str(repo / ".dvc" / "cache")
    workspace.run(["dvc", "cache", "dir", "../shared"], repo)  # stored relative to .dvc/config
    assert workspace.cache_dir(repo) == printed() == str(tmp_path / "shared")
    workspace.run(["dvc", "cache", "dir", "--local", str(tmp_path / "local")], repo)
    assert workspace.cache_dir(repo) == printed() == str(tmp_path / "local")


def queue_lines(*states: str) -> str:
    return QUEUE_HEADER + "".join(f"{i:07x}  e{i}  01:16 AM  {s}\n" for i, s in enumerate(states)) + \
        "\nWorker status: 2 active, 0 idle"


def collected_as_listed(monkeypatch, texts) -> None:
    """``local.queue_text`` answers the next of ``texts``; ``local.finished_experiments`` holds the names the last
    answer lists as Success (DVC collects an experiment before its queue task ends)."""
    last = {"text": ""}

    def answer(root):
        last["text"] = next(texts)
        return last["text"]

    monkeypatch.setattr(local, "queue_text", answer)
    monkeypatch.setattr(local, "finished_experiments", lambda root, commit: {
        name for name, status in local.parse_queue_status(last["text"]).items() if status == "Success"})


def test_the_queue_is_topped_up_only_below_its_workers_with_work_queued() -> None:
    # asking DVC while N experiments run can start an (N+1)-th worker: a busy worker may not answer its inspect
    assert local.needs_workers(queue_lines("Running", "Running", "Queued"), 3)
    assert not local.needs_workers(queue_lines("Running", "Running", "Running", "Queued"), 3)
    assert not local.needs_workers(queue_lines("Running", "Success", "Failed"), 3)  # nothing left to start
    assert local.needs_workers(queue_lines("Success", "Queued"), 1)


def test_run_local_never_asks_dvc_for_workers_while_all_of_them_run(monkeypatch, tmp_path) -> None:
    """Three jobs on 2 workers: DVC is asked at the start and when a worker frees up, never while 2 run."""
    texts = iter([queue_lines(),  # nothing queued yet
                  queue_lines("Queued", "Queued"),  # 2 queued, no worker: start
                  queue_lines("Running", "Running", "Queued"),  # after queueing: full
                  queue_lines("Running", "Running", "Queued"),  # first poll: full
                  queue_lines("Success", "Running", "Queued"),  # a worker freed, one queued: top up
                  queue_lines("Success", "Running", "Running"),
                  queue_lines("Success", "Success", "Success")])
    starts = []
    collected_as_listed(monkeypatch, texts)
    monkeypatch.setattr(local, "start_workers", lambda root, workers, env: starts.append(workers) or True)
    monkeypatch.setattr(local, "run", lambda args, root, env=None, check=True: "0" * 40)
    monkeypatch.setattr(local, "queue_experiment", lambda root, job, env: None)
    jobs = [grid.Job(f"e{i}", {}, []) for i in range(3)]
    assert local.run_local(tmp_path, jobs, 2, {}, poll_s=0) == []
    assert starts == [2, 2]  # once when the first 2 were queued, once when e0 finished


def test_an_experiment_the_queue_says_succeeded_but_dvc_did_not_collect_is_queued_once_more(
        monkeypatch, tmp_path) -> None:
    """Two experiments end at once and DVC collects one (its queue entry still says Success): the sweep says so and
    queues the lost one again; lost twice, it is counted as failed, and a later status says why."""
    entries: dict[str, str] = {}  # DVC's queue: each poll moves Queued -> Running -> Success
    collected: set[str] = set()
    losses: list[str] = []  # the names DVC will fail to collect, once per entry

    def queue_text(root):
        text = QUEUE_HEADER + "".join(f"{i:07x}  {n}  01:16 AM  {s}\n" for i, (n, s) in enumerate(entries.items()))
        for name, status in entries.items():
            entries[name] = {"Queued": "Running", "Running": "Success"}.get(status, status)
            if status == "Running":
                if name in losses:
                    losses.remove(name)
                else:
                    collected.add(name)
        return text + "\nWorker status: 2 active, 0 idle"

    def queue_experiment(root, job, env):
        entries.pop(job.name, None)
        entries[job.name] = "Queued"

    monkeypatch.setattr(local, "queue_text", queue_text)
    monkeypatch.setattr(local, "finished_experiments", lambda root, commit: set(collected))
    monkeypatch.setattr(local, "start_workers", lambda root, workers, env: True)
    monkeypatch.setattr(local, "run", lambda args, root, env=None, check=True: "0" * 40)
    monkeypatch.setattr(local, "queue_experiment", queue_experiment)
    jobs = [grid.Job(f"e{i}", {}, []) for i in range(2)]
    said: list[str] = []
    losses.append("e1")
    assert local.run_local(tmp_path, jobs, 2, {}, poll_s=0, watch=local.SweepWatch("sweep", None), say=said.append) == []
    assert collected == {"e0", "e1"}
    assert any("says e1 succeeded, but DVC collected no experiment" in line and "queueing them again" in line
               for line in said), said

    entries.clear(), collected.clear(), said.clear()
    losses.extend(["e1", "e1"])  # lost again on its second attempt
    assert local.run_local(tmp_path, jobs, 2, {}, poll_s=0, watch=local.SweepWatch("sweep", None),
                           say=said.append) == ["e1"]
    assert "counted as failed; `debias sweep --resume` reruns them" in said[-1]
    state = {"commit": "0" * 40, "launched": True, "jobs": [{"name": "e0"}, {"name": "e1"}]}
    assert local.local_states(tmp_path, state) == {"e0": ("done", ""), "e1": ("failed", local.LOST_NOTE)}


class TimedLines:
    """A stdout that keeps each line with the time it was written."""

    def __init__(self) -> None:
        import time

        self.clock, self.lines, self.partial = time.monotonic, [], ""

    def write(self, text: str) -> int:
        self.partial += text
        while "\n" in self.partial:
            line, self.partial = self.partial.split("\n", 1)
            self.lines.append((self.clock(), line))
        return len(text)

    def flush(self) -> None:
        pass


@pytest.mark.slow
def test_run_local_says_where_each_running_experiment_is_while_dvc_is_slow(monkeypatch, tmp_path) -> None:
    """A line when an experiment finishes, and while none does (each `dvc queue status` slow, as on a loaded
    machine) the heartbeat: at least one line per interval, naming the running experiment's stage, epoch and ETA
    from its queue log."""
    import sys
    import time

    from debias.harness import progress

    log = tmp_path / local.RUN_RECORDS / ("0000000" + "a" * 33) / ("0000000" + "a" * 33 + ".out")
    log.parent.mkdir(parents=True)
    log.write_text("Stage 'train_erm' is cached - skipping run, checking out outputs\n"
                   "Running stage 'train_contrastive':\n> python -m debias.harness.launch pipeline/train_contrastive.py\n"
                   "[train_contrastive] epoch 1 (2/5): loss 0.5000, val avg 0.700 (1.0 s; ETA 3 min 00 s)\n")
    texts = iter([queue_lines()] + [queue_lines("Running", "Queued")] * 6 + [queue_lines("Success", "Success")])

    def slow_queue(root):
        time.sleep(0.5)
        return next(texts)

    collected_as_listed(monkeypatch, (slow_queue(None) for _ in iter(int, 1)))
    monkeypatch.setattr(local, "start_workers", lambda root, workers, env: True)
    monkeypatch.setattr(local, "run", lambda args, root, env=None, check=True: "0" * 40)
    monkeypatch.setattr(local, "queue_experiment", lambda root, job, env: None)
    monkeypatch.setattr(progress, "HEARTBEAT_S", 0.3)
    out = TimedLines()
    monkeypatch.setattr(sys, "stdout", out)
    started = time.monotonic()
    jobs = [grid.Job(f"e{i}", {}, []) for i in range(2)]
    assert local.run_local(tmp_path, jobs, 1, {}, poll_s=0, started=time.time() - 100) == []
    stamps = [started, *(t for t, _ in out.lines)]
    lines = [line for _, line in out.lines]
    assert max(b - a for a, b in zip(stamps, stamps[1:])) < 1.5, out.lines  # 4 s in all, never silent for long
    assert lines[-1].startswith("[sweep] 2/2 experiments done, 0 running, 0 queued, 10")
    assert lines[0].startswith("[sweep] reading DVC's queue and experiments; 1 min 4")  # dvc is slow
    counted = [line for line in lines if line.startswith("[sweep] 0/2 experiments done")]
    assert counted[0].startswith("[sweep] 0/2 experiments done, 1 running, 1 queued, 10") and "since the start" in counted[0]
    assert any(line.startswith("[sweep] queueing experiment 2/2 (e1) on DVC's queue; ") for line in lines)
    beats = [line for line in lines if "running e0: " in line]
    assert beats and "e0: train_contrastive epoch 2/5 (ETA 2 min 5" in beats[0], lines
    assert beats[0].startswith("[sweep] 0/2 experiments done, 1 running, 1 queued; running e0: ")


def test_a_slurm_tasks_outcome_is_read_from_its_submitit_result(tmp_path: Path) -> None:
    assert slurm.result_of(str(tmp_path / "none.pkl")) is None  # killed before it wrote one
    (tmp_path / "ok.pkl").write_bytes(pickle.dumps(("success", "out")))
    assert slurm.result_of(str(tmp_path / "ok.pkl")) == "success"
    (tmp_path / "err.pkl").write_bytes(pickle.dumps(("error", "Traceback ...\nRuntimeError: dvc exp run failed\n"
                                                              "output\nWARNING: something is empty.")))
    assert slurm.result_of(str(tmp_path / "err.pkl")) == "error: RuntimeError: dvc exp run failed"


def test_status_counts_every_state_and_lists_logs() -> None:
    state = {"name": "s", "launcher": "slurm", "commit": "0123456789"}
    text = status.status_text(state, {"a": ("done", "/l/a.out"), "b": ("failed", "/l/b.out (no result)"),
                                     "c": ("queued", "")})
    assert text.splitlines()[0] == "sweep s (slurm, commit 0123456): 1 queued, 0 running, 1 done, 1 failed"
    assert "b  failed   /l/b.out (no result)" in text


def timed_run(command: list[str], cwd: Path, env: dict[str, str], timeout: float) -> tuple[int, list[tuple[float, str]]]:
    """Run ``command`` (stderr into stdout); its exit code and each line with when it arrived (from the start)."""
    import threading
    import time

    started = time.monotonic()
    process = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    timer = threading.Timer(timeout, process.kill)
    timer.start()
    lines = [(time.monotonic() - started, line.rstrip("\n")) for line in process.stdout]
    code = process.wait()
    timer.cancel()
    return code, [(0.0, ""), *lines, (time.monotonic() - started, "")]


def longest_silence(lines: list[tuple[float, str]]) -> tuple[float, str]:
    """The longest time between two lines, and the line before it."""
    return max(((b - a, before) for (a, before), (b, _) in zip(lines, lines[1:])), default=(0.0, ""))


def mlflow_stages(uri: str) -> dict[str, list]:
    """MLflow experiment -> its stage runs (tag debias.stage)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    return {e.name: [r for r in client.search_runs([e.experiment_id], max_results=5000) if r.data.tags.get("debias.stage")]
            for e in client.search_experiments()}


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_a_finished_sweep_gets_more_seeds_without_rerunning_anything_and_every_experiment_its_mlflow_run(
        tmp_path: Path, mlflow_template: Path) -> None:
    """``--launcher local`` end to end on DVC's queue: 1 seed x 2 values sharing one upstream run (computed once in a
    clone on this repository's cache), then ``--resume --seeds 0-1``: exactly 2 new experiments train their stage 2
    (1 seed x 2 values), the new seed's upstream runs once, no finished experiment or
    upstream run is rerun, and no line of the sweep's output is more than 15 s after the one before. Then a sweep
    whose every stage DVC restores from its run-cache: each experiment still gets its MLflow run, its restored stage
    runs naming the runs that computed them."""
    import os
    import sys

    from mlflow.tracking import MlflowClient

    from tests.conftest import fresh_store
    from tests.test_pipeline import make_clone

    repo = make_clone(tmp_path / "repo")
    fresh_store(mlflow_template, repo)
    uri = f"sqlite:///{repo / 'mlflow.db'}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DVC_", "MLFLOW_TRACKING"))}
    env.update(DEBIAS_TRACKING="required", PYTHONPATH=str(repo / "src"), GIT_AUTHOR_NAME="t",
               GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@t")

    def text(lines: list[tuple[float, str]]) -> str:
        return "\n".join(f"{t:7.1f} {line}" for t, line in lines)

    def debias(*args: str, name: str = "loc") -> tuple[int, list[tuple[float, str]]]:
        code, lines = timed_run([sys.executable, "-m", "debias.tools.cli", "sweep", "--name", name, *args], repo, env,
                                1800)
        print(f"$ debias sweep --name {name} {' '.join(args)}\n{text(lines)}")  # whole, where a test fails
        return code, lines

    grid_args = ("-S", "loss.epsilon=0.1,0.25", "--upstream", "infer_groups", "--targets", "train_contrastive",
                 "--jobs", "2", "--poll", "5")  # each poll is a `dvc queue status`: ~1.3 s of CPU
    code, first = debias("--seeds", "0", *grid_args)
    assert code == 0, text(first)
    assert longest_silence(first)[0] <= 15, (longest_silence(first), text(first))
    state = workspace.load_state(repo, "loc")
    old = {f"loc-epsilon{e}-seed0" for e in ("0.1", "0.25")}
    assert workspace.finished_experiments(repo, state["commit"]) == old
    refs = subprocess.run(["git", "for-each-ref", "--format=%(refname) %(objectname)", "refs/exps/"], cwd=repo,
                          capture_output=True, text=True, check=True).stdout
    before = mlflow_stages(uri)
    ran_here = lambda runs, stage: [r for r in runs if r.data.tags["debias.stage"] == stage  # noqa: E731
                                    and "debias.restored_from" not in r.data.tags]
    assert len(ran_here(before["debias-upstream"], "train_erm")) == 1  # once for both values
    assert len(ran_here(before["debias"], "train_contrastive")) == 2 and not ran_here(before["debias"], "train_erm")
    names = {r.info.run_name for r in before["debias-upstream"]}
    assert "train_erm-loc-upstream-0" in names, names  # named after the sweep: two sweeps' upstream runs stay apart

    code, extended = debias("--resume", "--seeds", "0-1")
    assert code == 0, text(extended)
    assert longest_silence(extended)[0] <= 15, (longest_silence(extended), text(extended))
    out = text(extended)
    assert "2 new experiments (1 seed(s) x 2 setting(s)), 1 new shared upstream run(s)" in out
    new = {f"loc-epsilon{e}-seed1" for e in ("0.1", "0.25")}
    assert workspace.finished_experiments(repo, state["commit"]) == old | new
    assert all(line in subprocess.run(["git", "for-each-ref", "--format=%(refname) %(objectname)", "refs/exps/"],
                                      cwd=repo, capture_output=True, text=True).stdout
               for line in refs.splitlines())  # the finished experiments are the same commits: none reran
    after = mlflow_stages(uri)
    assert len(ran_here(after["debias"], "train_contrastive")) == 4  # exactly 2 new stage-2 trainings
    assert not ran_here(after["debias"], "train_erm")  # no experiment ran an upstream stage
    erm = ran_here(after["debias-upstream"], "train_erm")
    assert sorted(r.data.params["seed"] for r in erm) == [str(s) for s in range(2)]  # each seed's upstream once
    client = MlflowClient(uri)
    parents = [r for r in client.search_runs([client.get_experiment_by_name("debias").experiment_id],
                                             filter_string="tags.`debias.kind` = 'pipeline'")]
    assert sorted(r.data.tags["debias.dvc_experiment"] for r in parents) == sorted(old | new)  # one each
    for parent in parents:  # the upstream stages DVC restored are recorded with the run that computed them
        restored = [r for r in after["debias"] if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id
                    and "debias.restored_from" in r.data.tags]
        assert {r.data.tags["debias.stage"] for r in restored} >= {"train_erm", "infer_groups"}
        sources = {r.data.tags["debias.restored_from"] for r in restored if r.data.tags["debias.stage"] == "train_erm"}
        assert sources <= {r.info.run_id for r in erm}
    assert "nothing to resume" in text(debias("--resume")[1])

    # the same params again under another sweep: DVC restores every stage but download (a persist: true output is in
    # no run-cache), so no stage with results runs
    code, again = debias("--seeds", "0", *grid_args, name="again")
    assert code == 0, text(again)
    trained = {r.data.tags["debias.dvc_experiment"]: r.info.run_id for r in ran_here(after["debias"], "train_contrastive")}
    assert len(ran_here(mlflow_stages(uri)["debias"], "train_contrastive")) == 4  # nothing trained
    for name in ("again-epsilon0.1-seed0", "again-epsilon0.25-seed0"):
        (parent,) = client.search_runs([client.get_experiment_by_name("debias").experiment_id], filter_string=(
            f"tags.`debias.kind` = 'pipeline' and tags.`debias.dvc_experiment` = '{name}'"))
        assert parent.info.status == "FINISHED" and parent.data.metrics.get("s2_avg") is not None
        children = {r.data.tags["debias.stage"]: r for r in client.search_runs(
            [parent.info.experiment_id], filter_string=f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")}
        assert children["train_contrastive"].data.tags["debias.restored_from"] == trained[name.replace("again", "loc")]
        assert {"download", "train_erm", "infer_groups", "train_contrastive"} <= set(children)


def test_a_sweep_ignores_the_workspaces_run_records_but_not_changed_params(tmp_path: Path) -> None:
    """`dvc repro` and `dvc exp run` rewrite dvc.lock and the git-tracked headline metrics (records of outputs): after
    README's `git checkout params.yaml` a sweep of the committed tree may start; params.yaml changed by a `dvc exp run
    -S`, or any other tracked file, is an input the clones would not see: refused."""
    from debias.core.headline import headline_path
    from debias.tools.sweep.workspace import dirty_files

    metrics = headline_path("train_contrastive")
    (tmp_path / metrics).parent.mkdir(parents=True)
    for name in ("dvc.lock", "params.yaml", str(metrics), "reports/other.json"):
        (tmp_path / name).write_text("a: 1\n")
    for command in (["git", "init", "-q"], ["git", "add", "-A"],
                    ["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "c"]):
        subprocess.run(command, cwd=tmp_path, check=True)
    (tmp_path / "dvc.lock").write_text("a: 2\n")
    (tmp_path / metrics).write_text("a: 2\n")
    assert dirty_files(tmp_path) == []
    (tmp_path / "params.yaml").write_text("a: 2\n")
    (tmp_path / "reports/other.json").write_text("a: 2\n")
    assert dirty_files(tmp_path) == ["params.yaml", "reports/other.json"]


@pytest.mark.slow
def test_a_name_too_long_for_a_file_name_is_refused_before_anything_is_written(repo: Path) -> None:
    """A 300-character --name (the folder sweeps/<name>/, the prefix of each experiment's git ref) is one line and
    exit 2, never an OSError; so is an experiment name the values make longer than a file name may be."""
    before = sorted(p.relative_to(repo.parent) for p in repo.parent.rglob("*") if ".git" not in p.parts)
    done = sweep_cli(repo, "--name", "a" * 300, "-S", "loss.epsilon=0,0.25", "--seeds", "0")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert f"sweep name '{'a' * 20}" in done.stderr and f"is 300 characters; allowed: at most {grid.MAX_NAME}" in done.stderr
    with pytest.raises(grid.SweepError, match=f"experiment name '{'b' * 20}.*' is 2[0-9][0-9] characters; allowed: at most "
                                              f"{grid.MAX_NAME}"):
        grid.check_job_names([grid.Job("b" * 250 + "-epsilon0.25", {})])
    assert sorted(p.relative_to(repo.parent) for p in repo.parent.rglob("*") if ".git" not in p.parts) == before


def _process_record(root: Path, task: str, pid: int, returncode: int | None, age_s: float = 0.0) -> None:
    """DVC's record of a queued experiment's process (.dvc/tmp/exps/run/<rev>/<rev>.json), written ``age_s`` ago."""
    import json
    import os
    import time

    rev = task + "0" * 33
    record = root / local.RUN_RECORDS / rev / f"{rev}.json"
    record.parent.mkdir(parents=True)
    record.write_text(json.dumps({"pid": pid, "stdin": None, "stdout": None, "stderr": None, "returncode": returncode}))
    os.utime(record, (time.time() - age_s, time.time() - age_s))


def test_a_running_entry_whose_process_ended_is_no_worker_and_does_not_hold_the_wait(tmp_path, monkeypatch,
                                                                                    capsys) -> None:
    """`dvc queue kill` can leave an entry Running in DVC's queue after its process ended: it is not counted as a
    live worker (the queue is topped up) and, once DVC had time to collect it, the sweep stops waiting for it and
    says why, instead of waiting silently."""
    import os
    import time

    gone = subprocess.Popen(["true"])
    gone.wait()
    _process_record(tmp_path, "aaaaaaa", 4242, -1, age_s=3 * local.ORPHAN_GRACE_S)  # killed long ago
    _process_record(tmp_path, "bbbbbbb", os.getpid(), None)  # runs
    _process_record(tmp_path, "ccccccc", 4243, 0)  # just exited: DVC is collecting it
    _process_record(tmp_path, "ddddddd", gone.pid, None)  # its process and the wrapper that records its end: gone
    text = QUEUE_HEADER + "".join(f"{t * 7}  e{i}  01:16 AM  Running\n" for i, t in enumerate("abcd")) + \
        "eeeeeee  e4  01:16 AM  Queued\n"
    orphans = local.orphaned(tmp_path, text)
    assert sorted(orphans) == ["aaaaaaa", "ddddddd"]
    assert orphans["aaaaaaa"].startswith("its process exited (code -1) ")
    assert orphans["ddddddd"] == f"its process {gone.pid} is gone"
    assert local.parse_queue_status(text, orphans) == {"e0": "Failed", "e1": "Running", "e2": "Running",
                                                       "e3": "Failed", "e4": "Queued"}
    assert local.needs_workers(text, 3, orphans) and not local.needs_workers(text, 2, orphans)
    # the wait ends with e0 counted as not done, and says so once
    monkeypatch.setattr(local, "queue_text", lambda root: QUEUE_HEADER + "aaaaaaa  e0  01:16 AM  Running\n"
                        "bbbbbbb  e1  01:16 AM  Success\n")
    monkeypatch.setattr(local, "start_workers", lambda root, workers, env: True)
    monkeypatch.setattr(local, "finished_experiments", lambda root, commit: {"e1"})  # collected, as it succeeded
    monkeypatch.setattr(local, "run", lambda args, root, env=None, check=True: "0" * 40)
    monkeypatch.setattr(local, "queue_experiment", lambda root, job, env: None)
    started = time.monotonic()
    assert local.run_local(tmp_path, [grid.Job("e0", {}), grid.Job("e1", {})], 2, {}, poll_s=0,
                           deadline=time.time() + 30) == ["e0"]
    assert time.monotonic() - started < 10
    out = capsys.readouterr().out
    assert out.count("[sweep] e0: DVC lists it Running, but its process exited (code -1)") == 1
    assert "(stopped by `dvc queue kill`?): counted as failed; `debias sweep --resume` reruns it" in out


def test_a_runs_stage_epoch_and_eta_are_read_from_its_log() -> None:
    from debias.tools.sweep import watch

    log = ("Stage 'download' didn't change, skipping\n"
           "Running stage 'train_erm':\n> python -m debias.harness.launch pipeline/train_erm.py\n"
           "[train_erm] epoch 4 (5/5): loss 0.1000 (1.0 s)\n"
           "Running stage 'train_contrastive':\n"
           "[train_contrastive] epoch 0 (1/3): loss 0.5000 (2.0 s; ETA 2 h 05 min)\n"
           "[train_contrastive] still working: epoch 1/3 done, training the next; ETA 3 min 41 s; 9.0 s since ...\n")
    found = watch.parse_progress(log)
    assert (found.stage, found.done, found.total, found.eta_s) == ("train_contrastive", 1, 3, 221.0)
    assert found.text(21) == "train_contrastive epoch 1/3 (ETA 3 min 20 s)" and found.text(500).endswith("(ETA 0.0 s)")
    assert watch.parse_progress(log + "Running stage 'linear_probe':\n").text() == "linear_probe"
    assert watch.parse_progress("Stage 'train_erm' is cached - skipping run, checking out outputs\n").text() == "starting"
    assert [watch.seconds(t) for t in ("0.4 s", "12 s", "3 min 41 s", "2 h 05 min")] == [0.4, 12.0, 221.0, 7500.0]
    assert watch.sweep_eta([], [10.0], 6, 2) is None and watch.sweep_eta([9.0], [], 0, 2) == 0
    # 6 runs of 600 s on 2 workers, the first done and the second 10 s from done: 2 rounds of 2 are left
    assert watch.sweep_eta([600.0], [590.0], 5, 2) == (4 * 600 + 10) / 2
    assert watch.sweep_eta([600.0], [100.0], 1, 2) == 500  # the last run's rest, not half of it
    assert watch.sweep_eta([100.0, 300.0], [], 4, 1) == 800  # the mean duration, one at a time


def test_the_sweeps_line_names_its_phase_counts_runs_and_eta(tmp_path: Path) -> None:
    import time

    from debias.tools.sweep.watch import SweepWatch

    log = tmp_path / "upstream-1.log"
    log.write_text("Running stage 'train_erm':\n[train_erm] epoch 2 (3/5): loss 1.0 (1.0 s; ETA 20 s)\n")
    shown = SweepWatch("sweep", started=time.time() - 70)
    shown.phase("shared upstream 0/3 done", 3, "the shared upstream", workers=2)
    assert shown.line().startswith("[sweep] shared upstream 0/3 done; 1 min 10 s since the start")
    shown.started_run("upstream-0", None)
    shown.run_started["upstream-0"] -= 60
    shown.started_run("upstream-1", log)
    shown.started_run("upstream-2", None)
    shown.ended_run("upstream-0")  # ran 60 s
    shown.update(counts="shared upstream 1/3 done", done=1)
    line = shown.line()
    assert line.startswith("[sweep] shared upstream 1/3 done; running upstream-1: train_erm epoch 3/5 (ETA 2"), line
    assert "upstream-2: starting; 1 min 10 s since the start, ETA of the shared upstream 1 min 00 s" in line


def test_a_sweep_s_plan_is_checked_against_its_commit_s_params_not_the_workspace_s(repo: Path) -> None:
    """After README's "Your own data" step params.yaml holds that run's `-S` values: a sweep's new seeds are planned
    on the params committed at the sweep's commit, never on them."""
    commit = workspace.run(["git", "rev-parse", "HEAD"], repo).strip()
    committed = workspace.committed_params(repo, commit)
    changed = yaml.safe_load((repo / "params.yaml").read_text())
    changed["data"]["source"] = "imagefolder"  # data.imagefolder.root left empty: invalid on its own
    (repo / "params.yaml").write_text(yaml.safe_dump(changed, sort_keys=False))
    assert workspace.committed_params(repo, commit)["data"]["source"] == committed["data"]["source"] != "imagefolder"
    jobs = grid.grid("g", {"loss.epsilon": [0.1, 0.25]}, [3])
    merged = grid.check_grid(repo, jobs, "infer_groups", committed)
    assert all(params["data"]["source"] == committed["data"]["source"] for params in merged)
    with pytest.raises(grid.SweepError, match="imagefolder"):
        grid.check_grid(repo, jobs, "infer_groups")  # the workspace's own base: what a new sweep would refuse


def test_resume_refuses_a_changed_params_yaml_naming_the_undo_and_leaves_the_plan_as_it_was(
        repo: Path, capsys) -> None:
    commit = workspace.run(["git", "rev-parse", "HEAD"], repo).strip()
    jobs = grid.grid("r", {"loss.epsilon": [0.1, 0.25]}, [0])
    state = {"name": "r", "launcher": "local", "commit": commit, "upstream_stage": None, "phase1": [],
             "jobs": [{"name": j.name, "overrides": j.overrides, "targets": j.targets} for j in jobs],
             "options": {"jobs": 1, "threads": 1, "cpus_per_task": 1, "tracking_uri": None, "mlflow_experiment": None}}
    path = workspace.save_state(repo, state)
    before = path.read_text()
    (repo / "params.yaml").write_text((repo / "params.yaml").read_text().replace("source: ", "source:  ", 1))
    assert cli(["sweep", "--repo", str(repo), "--name", "r", "--resume", "--seeds", "0-3"]) == 2
    err = capsys.readouterr().err
    assert "before resuming sweep 'r'" in err and "params.yaml" in err and "git checkout params.yaml" in err, err
    assert path.read_text() == before  # no seed added, nothing queued


@pytest.mark.slow
def test_two_sweep_commands_on_one_sweep_are_one_at_a_time(repo: Path) -> None:
    """A second ``debias sweep`` on a sweep another one is launching or resuming is refused, naming it (both would
    rewrite its plan: one's new seeds vanished); the lock goes with its holder."""
    with workspace.sweep_lock(repo, "s"):
        with pytest.raises(grid.SweepError, match=rf"being launched or resumed by `debias sweep` pid {os.getpid()}"):
            with workspace.sweep_lock(repo, "s"):
                pass
        with workspace.sweep_lock(repo, "other"):  # another sweep is not held
            pass
        held = subprocess.run([sys.executable, "-c", "import sys; from pathlib import Path; "
                               "from debias.tools.sweep.workspace import sweep_lock; "
                               "sweep_lock(Path(sys.argv[1]), 's').__enter__()", str(repo)],
                              capture_output=True, text=True, timeout=60)
        assert held.returncode == 1 and "being launched or resumed" in held.stderr  # another process too
    with workspace.sweep_lock(repo, "s"):  # released
        pass


def _e2e_env(repo: Path) -> dict[str, str]:
    """A user's shell in ``repo`` without tracking; PYTHONPATH the workspace's ``src`` (as a sweep used to give its
    queue workers): a queued experiment's stages must run their own copy's code even so."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DVC_", "MLFLOW_TRACKING"))}
    env.update(DEBIAS_TRACKING="off", DEBIAS_THREADS="1", PYTHONPATH=str(repo / "src"), GIT_AUTHOR_NAME="t",
               GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@t")
    return env


def _code_fingerprint_md5(repo: Path, stage: str, scratch: Path) -> str:
    """The md5 of the code fingerprint ``source`` would write for ``stage`` from ``repo``'s files now."""
    import hashlib

    from debias.core.fingerprint import code_fingerprints
    from debias.core.io import save_json

    save_json(scratch, code_fingerprints(yaml.safe_load((repo / "dvc.yaml").read_text())["stages"], repo)[stage])
    return hashlib.md5(scratch.read_bytes()).hexdigest()


def _locked_md5(repo: Path, ref: str, stage: str, path: str) -> str:
    lock = yaml.safe_load(workspace.run(["git", "show", f"{ref}:dvc.lock"], repo))
    return next(dep["md5"] for dep in lock["stages"][stage]["deps"] if dep["path"] == path)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_queued_experiment_runs_the_committed_code_when_the_workspace_s_changes_after_it_was_queued(
        tmp_path: Path, monkeypatch) -> None:
    """An edit of src/ saved while a sweep's experiment waits on DVC's queue must not reach it: the experiment's
    stages run its own copy of the commit, the code its dvc.lock records (here the edit would fail the stage)."""
    from tests.test_pipeline import make_clone

    repo = make_clone(tmp_path / "repo")
    env = _e2e_env(repo)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    job = grid.Job("live-seed1", {"seed": 1}, ["download"])
    workspace.run(["dvc", "exp", "run", "--queue", "-n", job.name, *grid.set_args(job.overrides), *job.targets], repo,
                  workspace.task_env(1, None, None))
    module = repo / "src" / "debias" / "data" / "raw.py"  # imported by `source` and `download`
    committed = module.read_bytes()
    module.write_text(module.read_text() + "\nraise RuntimeError('the workspace changed after the queueing ran')\n")
    failed = local.run_local(repo, [job], 1, workspace.task_env(1, None, None), poll_s=2)
    assert failed == [], workspace.run(["dvc", "queue", "logs", job.name], repo, check=False)[-3000:]
    commit = workspace.run(["git", "rev-parse", "HEAD"], repo).strip()
    assert job.name in workspace.finished_experiments(repo, commit)
    ref = f"refs/exps/{commit[:2]}/{commit[2:]}/{job.name}"
    edited = _code_fingerprint_md5(repo, "download", tmp_path / "edited.json")
    module.write_bytes(committed)
    assert _locked_md5(repo, ref, "download", "data/code/download.json") == _code_fingerprint_md5(
        repo, "download", tmp_path / "committed.json") != edited


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_resume_after_your_own_data_queues_nothing_on_that_data_and_reruns_nothing_done(tmp_path: Path) -> None:
    """README's order: a sweep, then "Your own data" (`dvc exp run -S data.source=imagefolder ...` leaves its values
    in params.yaml), then `--resume --seeds`: refused, naming params.yaml and `git checkout params.yaml`, with the
    plan unchanged; after the checkout the new seed runs on the sweep's committed data and no finished experiment
    is redone."""
    import sys

    from tests.test_pipeline import make_clone

    repo = make_clone(tmp_path / "repo")
    env = _e2e_env(repo)

    def command(*args: str) -> subprocess.CompletedProcess:
        done = subprocess.run(list(args), cwd=repo, env=env, capture_output=True, text=True, timeout=900)
        print(f"$ {' '.join(args)}\n{done.stdout}\n{done.stderr}")
        return done

    def sweep(*args: str) -> subprocess.CompletedProcess:
        return command(sys.executable, "-m", "debias.tools.cli", "sweep", "--name", "own", *args)

    first = sweep("--seeds", "0", "--targets", "download", "--jobs", "1", "--poll", "2")
    assert first.returncode == 0, first.stderr
    commit = workspace.run(["git", "rev-parse", "HEAD"], repo).strip()
    refs = {name: workspace.run(["git", "rev-parse", f"refs/exps/{commit[:2]}/{commit[2:]}/{name}"], repo).strip()
            for name in ("own-seed0",)}
    assert command(sys.executable, "-m", "debias.tools.cli", "example-folder", "data/external/shapes").returncode == 0
    own = ["-S", "data.source=imagefolder", "-S", "data.imagefolder.root=data/external/shapes",
           "-S", "data.imagefolder.metadata=metadata.csv", "-S", "data.imagefolder.path_column=img_filename",
           "-S", "data.imagefolder.label_column=y", "-S", "data.imagefolder.attribute_column=place",
           "-S", "data.imagefolder.split_column=split"]
    assert command("dvc", "exp", "run", *own, "download").returncode == 0
    plan = (repo / "sweeps" / "own" / "sweep.json").read_text()
    refused = sweep("--resume", "--seeds", "0-1")
    assert refused.returncode == 2
    assert "params.yaml" in refused.stderr and "git checkout params.yaml" in refused.stderr, refused.stderr
    assert (repo / "sweeps" / "own" / "sweep.json").read_text() == plan
    assert "own-seed1" not in command("dvc", "queue", "status").stdout
    assert command("git", "checkout", "params.yaml").returncode == 0
    resumed = sweep("--resume", "--seeds", "0-1", "--poll", "2")
    assert resumed.returncode == 0, resumed.stderr
    assert "1 new experiments (1 seed(s) x 1 setting(s))" in resumed.stdout
    for name, sha in refs.items():  # the finished experiments are the same commits: none was redone
        assert workspace.run(["git", "rev-parse", f"refs/exps/{commit[:2]}/{commit[2:]}/{name}"], repo).strip() == sha
    params = yaml.safe_load(workspace.run(["git", "show", f"refs/exps/{commit[:2]}/{commit[2:]}/own-seed1:params.yaml"],
                                          repo))
    committed = workspace.committed_params(repo, commit)
    assert params["data"] == committed["data"] and params["seed"] == 1


def _resume_args(**given) -> "argparse.Namespace":
    import argparse

    parser = argparse.ArgumentParser()
    commands = parser.add_subparsers()
    from debias.tools.sweep import command

    command.add_parser(commands)
    args = parser.parse_args(["sweep", "--name", "r", "--resume"])
    for key, value in given.items():
        setattr(args, key, value)
    return args


def test_resume_refuses_what_would_change_the_plan_and_takes_new_workers() -> None:
    """`--resume` once ignored -S, --jobs and --threads without a word: what shapes the experiments is refused
    (naming the option and what works); --jobs, which changes no result, is taken."""
    from debias.tools.sweep import command

    state = {"name": "r", "options": {"jobs": 2, "threads": 1, "cpus_per_task": 1}}
    for given, named in (({"set": ["loss.epsilon=0.5"]}, "-S"), ({"targets": ["train_erm"]}, "--targets"),
                         ({"upstream": "infer_groups"}, "--upstream"), ({"file": "g.yaml"}, "--file")):
        with pytest.raises(grid.SweepError, match=f"{named} would change its experiments.*launch a new sweep"):
            command.resume_options(state, _resume_args(**given))
    with pytest.raises(grid.SweepError, match="--threads 4: sweep 'r' runs with --threads 1.*resume without --threads"):
        command.resume_options(state, _resume_args(threads=4))
    command.resume_options(state, _resume_args(threads=1))  # the plan's own count
    command.resume_options(state, _resume_args())
    assert state["options"]["jobs"] == 2  # not given: the plan's
    command.resume_options(state, _resume_args(jobs=1))
    assert state["options"]["jobs"] == 1


def test_an_interrupted_sequential_plan_goes_on_with_the_options_it_says_to_repeat(repo: Path, monkeypatch) -> None:
    """After a look's experiments failed, the sweep says to resume `with the same options`: the seeds its plan
    added since (6 where it started with 3) must not change the plan those options give."""
    from debias.tools.sweep import command

    commit = workspace.run(["git", "rev-parse", "HEAD"], repo).strip()
    jobs = grid.grid("q", {"loss.epsilon": [0.0, 0.25]}, list(range(6)))
    state = {"name": "q", "launcher": "local", "commit": commit, "upstream_stage": None, "phase1": [],
             "jobs": [{"name": j.name, "overrides": j.overrides, "targets": j.targets} for j in jobs],
             "options": {"jobs": 1, "threads": 1}, "sequential": {"metric": "s2_unbiased", "margin": 2.0,
                                                                  "looks": [3, 6, 9], "batch": 3, "alpha": 0.05}}
    workspace.save_state(repo, state)
    monkeypatch.setattr(command, "statuses", lambda root, state: {j["name"]: ("failed", "") for j in state["jobs"]})
    monkeypatch.setattr(command, "rerun_unfinished", lambda root, state, args, watch: 1)  # the look's runs fail again
    args = _resume_args(until_decided=9, margin=2.0)
    assert command.until_decided(repo, state, args) == 1  # not refused as "another plan"
    assert workspace.load_state(repo, "q")["sequential"]["looks"] == [3, 6, 9]


def test_ctrl_c_or_sigterm_takes_the_sweeps_experiments_off_dvcs_queue_and_says_so(monkeypatch, tmp_path,
                                                                                    capsys) -> None:
    """Killing `debias sweep` left DVC's queue running its experiments unseen: now its queued ones are removed and
    its running ones killed, by name (another sweep's stay), and it says how to resume."""
    import os
    import signal

    from debias.tools.sweep import command

    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt):
        with command.stopped_by_sigterm():
            os.kill(os.getpid(), signal.SIGTERM)
    assert signal.getsignal(signal.SIGTERM) is before  # put back
    texts = iter([queue_lines(), queue_lines("Running", "Queued")])

    def queue(root):
        try:
            return next(texts)
        except StopIteration:  # the user presses Ctrl-C while the sweep waits
            raise KeyboardInterrupt from None

    calls = []
    monkeypatch.setattr(local, "queue_text", queue)
    monkeypatch.setattr(local, "start_workers", lambda root, workers, env: True)
    monkeypatch.setattr(local, "finished_experiments", lambda root, commit: set())
    monkeypatch.setattr(local, "run", lambda args, root, env=None, check=True: calls.append(args) or "0" * 40)
    monkeypatch.setattr(local, "queue_experiment", lambda root, job, env: None)
    stopped = []
    monkeypatch.setattr(local, "stop_experiments", lambda root, names, say, log="sweep": stopped.append(set(names)))
    with pytest.raises(KeyboardInterrupt):
        local.run_local(tmp_path, [grid.Job("e0", {}), grid.Job("e1", {})], 1, {}, poll_s=0)
    assert stopped == [{"e0", "e1"}]
    # the stop itself: by name, queued removed, running killed
    monkeypatch.undo()
    monkeypatch.setattr(local, "queue_text", lambda root: queue_lines("Running", "Queued", "Queued") + "\n")
    ran = []
    monkeypatch.setattr(local, "run", lambda args, root, env=None, check=True: ran.append(args) or "")
    said = []
    local.stop_experiments(tmp_path, ["e0", "e1"], said.append)
    assert ["dvc", "queue", "remove", "e1"] in ran and ["dvc", "queue", "kill", "e0"] in ran
    assert not any("--queued" in args or "e2" in args for args in ran)  # another sweep's e2 stays queued
    assert "1 running experiment(s) killed, 1 queued one(s) taken off DVC's queue" in said[0]


def test_an_earlier_killed_attempt_of_an_experiment_that_finished_is_not_said_to_have_failed(tmp_path, monkeypatch,
                                                                                             capsys) -> None:
    """A resumed experiment that finished keeps, in DVC's queue, the entry of its killed attempt (listed Running,
    its process long gone): the sweep no longer calls it failed."""
    import time

    _process_record(tmp_path, "aaaaaaa", 4242, -1, age_s=3 * local.ORPHAN_GRACE_S)  # the killed attempt
    monkeypatch.setattr(local, "queue_text", lambda root: QUEUE_HEADER + "aaaaaaa  e0  01:16 AM  Running\n"
                        "bbbbbbb  e0  01:20 AM  Success\n")
    monkeypatch.setattr(local, "start_workers", lambda root, workers, env: True)
    monkeypatch.setattr(local, "finished_experiments", lambda root, commit: {"e0"})  # the finished attempt's
    monkeypatch.setattr(local, "run", lambda args, root, env=None, check=True: "0" * 40)
    monkeypatch.setattr(local, "queue_experiment", lambda root, job, env: None)
    assert local.run_local(tmp_path, [grid.Job("e0", {})], 1, {}, poll_s=0, deadline=time.time() + 30) == []
    out = capsys.readouterr()
    assert "counted as failed" not in out.out and "FAILED" not in out.err


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_shared_upstream_run_restores_from_the_run_cache_what_another_machines_dvc_lock_names(tmp_path: Path) -> None:
    """The committed dvc.lock names the outputs of the run that wrote it (its run records: that run's ids and times),
    in no cache here. A sweep's clone whose stage matched it reran the stage instead of restoring this machine's
    identical run from DVC's run-cache (153 s of upstream that `dvc repro` had just cached)."""
    from tests.test_pipeline import make_clone

    repo = make_clone(tmp_path / "repo")
    env = _e2e_env(repo)
    env.pop("PYTHONPATH")
    workspace.run(["dvc", "repro", "inject_bias"], repo, env)
    workspace.run(["git", "add", "dvc.lock"], repo)
    workspace.run(["git", "commit", "-qm", "the lock of a run on another machine"], repo, env)
    lock = yaml.safe_load((repo / "dvc.lock").read_text())
    record = next(out["md5"] for out in lock["stages"]["inject_bias"]["outs"]
                  if out["path"] == "reports/runs/inject_bias.json")
    workspace.run(["dvc", "repro", "-f", "inject_bias"], repo, env)  # this machine's run: in its cache and run-cache
    cache = Path(workspace.run(["dvc", "cache", "dir"], repo).strip())
    (cache / "files" / "md5" / record[:2] / record[2:]).unlink()  # the other machine's run record: not here
    commit = workspace.run(["git", "rev-parse", "HEAD"], repo).strip()
    log = tmp_path / "upstream.log"
    workspace.compute_upstream({"root": str(repo), "commit": commit, "clone": str(tmp_path / "clone"),
                                "overrides": {}, "stage": "inject_bias", "cache_dir": str(cache), "log": str(log),
                                "env": env})
    text = log.read_text()
    assert "Stage 'inject_bias' is cached - skipping run" in text, text
    assert "Running stage 'inject_bias'" not in text
