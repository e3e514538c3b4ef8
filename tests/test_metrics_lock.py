"""The git-tracked headline metrics against dvc.lock: every reader leaves out a file whose md5 is not the one dvc.lock
records (an edit, a merge, another run) and says so; a failed stage keeps the numbers dvc.lock records, which
``dvc checkout`` cannot restore; README's way back to the committed params leaves no other run's numbers in DVC's
views. Md5s are checked against DVC's own hashing (``dvc_data``) and ``dvc status``, never a hand-made assumption."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from debias.core import headline
from tests.conftest import REPO

ERM = "reports/metrics/train_erm.json"
S2 = "reports/metrics/train_contrastive.json"


def dvc_hash(path: Path, name: str = "md5") -> str:
    """DVC's own md5 of a file (the function DVC 3 hashes outputs with)."""
    from dvc_data.hashfile.hash import file_md5

    return file_md5(str(path), name=name)


def write(root: Path, name: str, text: str) -> Path:
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text.encode())
    return path


def lock_for(root: Path, outputs: dict[str, list[str]], hashed: dict[str, str] | None = None) -> dict:
    """A dvc.lock (written under ``root`` and returned) recording, per stage, the listed files with DVC's md5."""
    import yaml

    hashed = hashed or {}
    lock = {"schema": "2.0", "stages": {stage: {"cmd": f"python pipeline/{stage}.py", "outs": [
        {"path": name, "hash": "md5", "md5": hashed.get(name) or dvc_hash(root / name), "size": 1} for name in names]}
        for stage, names in outputs.items()}}
    (root / "dvc.lock").write_text(yaml.safe_dump(lock, sort_keys=False))
    return lock


# --------------------------------------------------------------------------- the md5 dvc.lock records


@pytest.mark.parametrize("text", ['{"s2_worst": 0.5}\n', '{\r\n  "s2_worst": 0.5\r\n}\r\n', ""])
def test_the_md5_is_dvcs_own_for_dvc_3_and_legacy_entries(tmp_path: Path, text: str) -> None:
    path = write(tmp_path, "m.json", text)
    assert headline.dvc_md5(path.read_bytes(), "md5") == dvc_hash(path)
    assert headline.dvc_md5(path.read_bytes(), None) == dvc_hash(path, "md5-dos2unix")  # no `hash:` field: DVC 2


def test_an_edited_metrics_file_does_not_match_and_nothing_else_is_named(tmp_path: Path) -> None:
    """s2_worst hand-edited to 0.9 after the run dvc.lock records: named, with why; the untouched file, a file inside
    a recorded folder (its md5 is in DVC's cache) and an absent one are not. A file dvc.lock names no run of is. No
    dvc.lock: nothing recorded, nothing to check."""
    write(tmp_path, ERM, '{"erm_worst": 0.1}\n')
    write(tmp_path, S2, '{"s2_worst": 0.5}\n')
    write(tmp_path, "data/groups/summary.json", "{}\n")
    lock_for(tmp_path, {"train_erm": [ERM], "train_contrastive": [S2]})
    with open(tmp_path / "dvc.lock", "a") as handle:  # a folder output, as DVC records one
        handle.write("  infer_groups:\n    outs:\n    - path: data/groups\n      hash: md5\n      md5: abc.dir\n")
    assert headline.lock_mismatches(tmp_path) == {}
    write(tmp_path, S2, '{"s2_worst": 0.9}\n')
    write(tmp_path, "reports/metrics/linear_probe.json", '{"probe_s2_worst": 0.4}\n')
    files = [ERM, S2, "reports/metrics/linear_probe.json", "data/groups/summary.json", "reports/metrics/absent.json"]
    assert headline.lock_mismatches(tmp_path, files) == {S2: headline.MISMATCH,
                                                         "reports/metrics/linear_probe.json": headline.UNRECORDED}
    assert headline.mismatch_message(S2, headline.MISMATCH) == (
        "reports/metrics/train_contrastive.json does not match dvc.lock (edited, merged or from another run): its "
        "numbers are left out; run `dvc repro`, or `git checkout` it with dvc.lock")
    (tmp_path / "dvc.lock").unlink()
    assert headline.lock_mismatches(tmp_path, files) == {}


# --------------------------------------------------------------------------- readers: compare and the report


def test_compare_blanks_a_headline_file_that_does_not_match_its_dvc_lock(tmp_path: Path) -> None:
    """The numbers of the one stage whose file does not match are blanked, with the file and why, and the fix; the
    other stage's stay."""
    from debias.tools.compare.collect import Experiment, blank_stale

    write(tmp_path, ERM, '{"erm_worst": 0.1}\n')
    write(tmp_path, S2, '{"s2_worst": 0.5}\n')
    lock = lock_for(tmp_path, {"train_erm": [ERM], "train_contrastive": [S2]})
    files = {ERM: (tmp_path / ERM).read_bytes(), S2: b'{"s2_worst": 0.9}\n'}  # the committed file, edited
    experiment = Experiment("workspace", "workspace", {}, {"erm_worst": 0.1, "s2_worst": 0.9},
                            metric_stages={"erm_worst": "train_erm", "s2_worst": "train_contrastive"})
    blank_stale(experiment, lock, files.get)
    assert experiment.metrics == {"erm_worst": 0.1}
    assert set(experiment.stale) == {"train_contrastive"} and S2 in experiment.blanked
    assert experiment.reason == f"{S2} {headline.MISMATCH}: its numbers are left out" and experiment.fix == "dvc repro"
    matching = Experiment("b", "baseline", {}, {"erm_worst": 0.1, "s2_worst": 0.5}, rev="abc",
                          metric_stages={"erm_worst": "train_erm", "s2_worst": "train_contrastive"})
    blank_stale(matching, lock, {ERM: files[ERM], S2: (tmp_path / S2).read_bytes()}.get)
    assert matching.metrics == {"erm_worst": 0.1, "s2_worst": 0.5} and not matching.stale and not matching.reason


def edited_after_its_run(root: Path) -> None:
    """Two detailed metrics files and the dvc.lock of their run, then one of them edited (0.3 -> 0.9)."""
    write(root, "reports/metrics/erm.json", json.dumps({"test": {"avg": 0.3}}))
    write(root, "reports/metrics/probe.json", json.dumps({"erm": {"trained": False}}))
    write(root, ERM, '{"erm_avg": 0.3}\n')
    lock_for(root, {"train_erm": ["reports/metrics/erm.json", ERM], "linear_probe": ["reports/metrics/probe.json"]})
    write(root, "reports/metrics/erm.json", json.dumps({"test": {"avg": 0.9}}))


def test_the_report_run_by_hand_leaves_out_and_warns_about_a_metrics_file_that_does_not_match(
        tmp_path: Path, monkeypatch) -> None:
    """``python pipeline/report.py`` (no ``$DVC_STAGE``), a detailed metrics file edited after its run: the report
    does not read it (listed as missing) and its warnings name it under the stage that wrote it; the files that match
    are read. The warnings say nothing without a lock."""
    from debias.report.inputs import load_inputs

    monkeypatch.delenv("DVC_STAGE", raising=False)
    write(tmp_path, "reports/metrics/erm.json", json.dumps({"test": {"avg": 0.3}}))
    lock_for(tmp_path, {"train_erm": ["reports/metrics/erm.json"]})
    assert headline.run_warnings(tmp_path) == {}
    edited_after_its_run(tmp_path)
    inputs = load_inputs(tmp_path)
    assert "erm" not in inputs.json and Path("reports/metrics/erm.json") in inputs.missing
    assert inputs.json["probe"] == {"erm": {"trained": False}}
    assert headline.run_warnings(tmp_path) == {"train_erm": [
        f"metrics-mismatch: reports/metrics/erm.json {headline.MISMATCH}: {headline.LEFT_OUT}"]}
    (tmp_path / "dvc.lock").unlink()
    assert headline.run_warnings(tmp_path) == {} and load_inputs(tmp_path).json["erm"]["test"]["avg"] == 0.9


_SEEN: list[tuple[str, str]] | None = None  # (audit event, path) while a test records
_HOOKED: list[bool] = []  # an audit hook stays for the process: added once, idle outside opened_and_listed


def _record(event: str, args: tuple) -> None:
    if _SEEN is not None and event in ("open", "os.scandir", "os.listdir") and args and args[0] is not None:
        _SEEN.append((event, os.path.abspath(os.fsdecode(args[0])) if isinstance(args[0], (str, bytes, os.PathLike))
                      else str(args[0])))


def opened_and_listed(action: Callable[[], object]) -> list[tuple[str, str]]:
    """The files ``action`` opened and the folders it listed (Python's audit events)."""
    global _SEEN
    if not _HOOKED:
        sys.addaudithook(_record)
        _HOOKED.append(True)
    _SEEN = []
    try:
        action()
        return _SEEN
    finally:
        _SEEN = None


def test_the_report_under_dvc_reads_its_deps_as_dvc_saw_them(tmp_path: Path, monkeypatch) -> None:
    """Under DVC (``$DVC_STAGE`` set) the report's inputs are its deps, which DVC brought in line with dvc.lock before
    running it (the test below): it reads them as they are, warns of nothing, and opens no dvc.lock and no other
    stage's headline file, nor lists reports/metrics. The same calls by hand open dvc.lock and list the folder."""
    from debias.report.inputs import load_inputs

    edited_after_its_run(tmp_path)
    root = str(tmp_path)

    def report() -> tuple:
        return load_inputs(tmp_path), headline.run_warnings(tmp_path)

    monkeypatch.setenv("DVC_STAGE", "report")
    seen = opened_and_listed(report)
    inputs, warnings = report()
    assert inputs.json["erm"]["test"]["avg"] == 0.9 and warnings == {}
    assert (f"{root}/reports/metrics/erm.json") in {path for event, path in seen if event == "open"}  # it looks
    assert not [path for _, path in seen if path in (f"{root}/dvc.lock", f"{root}/{ERM}")], seen
    assert not [path for event, path in seen if event != "open" and path == f"{root}/reports/metrics"], seen

    monkeypatch.delenv("DVC_STAGE")
    seen = opened_and_listed(report)
    assert ("open", f"{root}/dvc.lock") in seen and ("os.scandir", f"{root}/reports/metrics") in seen, seen
    assert "erm" not in report()[0].json


# --------------------------------------------------------------------------- a failed stage keeps the recorded numbers


def fails(message: str = "the stage's own error", exception: type[BaseException] | None = None,
          write: bytes | None = None) -> Callable:
    """A stage body that (optionally) writes the headline file itself, as a run that fails after writing it would,
    then raises ``exception`` (default: a DebiasError with ``message``)."""
    from debias.core.errors import DebiasError

    def body(params, run) -> None:
        if write is not None:
            Path(ERM).write_bytes(write)
        raise (exception or DebiasError)(message)
    return body


def run_stage(workspace: Path, body: Callable, monkeypatch: pytest.MonkeyPatch, capsys, dvc: bool = True,
              code: int | None = 2) -> str:
    """train_erm run in-process with ``body``, under DVC's variables (``$DVC_STAGE``) unless ``dvc`` is false; it
    exits with ``code`` (None: it returns); returns its stderr."""
    from debias.harness import stage as harness

    monkeypatch.chdir(workspace)
    if dvc:
        monkeypatch.setenv("DVC_STAGE", "train_erm")
    else:
        monkeypatch.delenv("DVC_STAGE", raising=False)
    capsys.readouterr()
    if code is None:
        harness.main("train_erm", body)
    else:
        with pytest.raises(SystemExit) as exit_info:
            harness.main("train_erm", body)
        assert exit_info.value.code == code
    return " ".join(capsys.readouterr().err.split())


def git(root: Path, *command: str) -> None:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    subprocess.run(["git", *command], cwd=root, env=env, check=True, capture_output=True)


RECORDED = b'{\n  "erm_avg": 0.3123,\n  "erm_worst": 0.0\n}\n'
FROM_HEAD = (f"`dvc checkout train_erm` restores the ones dvc.lock records; {ERM} (git-tracked, which `dvc checkout` "
             "does not restore) holds the numbers dvc.lock records, put back from HEAD")
NO_COPY = (f"{ERM} (git-tracked, which `dvc checkout` does not restore) has no copy here that matches dvc.lock: "
           "`git checkout` it with dvc.lock, or `dvc repro` recomputes it")


@pytest.fixture
def committed(tmp_path: Path) -> Path:
    """A workspace whose commit holds train_erm's headline file and the dvc.lock that records it; DVC, about to run
    train_erm again, has deleted the file."""
    from tests.faults.conftest import make_workspace

    workspace = make_workspace(tmp_path / "ws")
    (workspace / ERM).parent.mkdir(parents=True, exist_ok=True)
    (workspace / ERM).write_bytes(RECORDED)
    lock_for(workspace, {"train_erm": [ERM]})
    git(workspace, "init", "-q")
    git(workspace, "add", "-A")
    git(workspace, "commit", "-qm", "run")
    (workspace / ERM).unlink()
    return workspace


@pytest.mark.parametrize("write", [None, b'{"erm_avg": 0.5}\n'], ids=["deleted", "rewritten"])
def test_a_failed_stage_under_dvc_puts_back_the_headline_dvc_lock_records(committed: Path, write: bytes | None,
                                                                          monkeypatch, capsys) -> None:
    """DVC deleted the file before the stage ran (cache: false: `dvc checkout` cannot bring it back) and the failed
    run may have written its own: on its way out the stage puts back HEAD's, byte-identical to what dvc.lock records,
    and the message says so, after the stage's own error."""
    err = run_stage(committed, fails(write=write), monkeypatch, capsys)
    assert (committed / ERM).read_bytes() == RECORDED
    assert "[train_erm] error: the stage's own error" in err and FROM_HEAD in err, err


def test_an_interrupted_or_crashed_stage_puts_back_the_headline_too(committed: Path, monkeypatch, capsys) -> None:
    """Ctrl-C (exit 130, its one line says what was put back) and an error no handler explains (the traceback
    follows a line saying what was put back) end with the recorded file as well."""
    err = run_stage(committed, fails(exception=KeyboardInterrupt, write=b"{}"), monkeypatch, capsys, code=130)
    assert (committed / ERM).read_bytes() == RECORDED
    assert f"[train_erm] interrupted (Ctrl-C); DVC removed this stage's previous outputs" in err and FROM_HEAD in err

    with pytest.raises(TypeError, match="a bug"):
        run_stage(committed, fails("a bug", exception=TypeError, write=b"{}"), monkeypatch, capsys, code=None)
    assert (committed / ERM).read_bytes() == RECORDED
    assert (f"[train_erm] {ERM} (git-tracked, which `dvc checkout` does not restore) holds the numbers dvc.lock "
            "records, put back from HEAD") in " ".join(capsys.readouterr().err.split())


def test_without_a_copy_that_matches_dvc_lock_the_failed_runs_file_is_removed_and_the_message_says_so(
        committed: Path, monkeypatch, capsys) -> None:
    """dvc.lock records another run's file (HEAD's does not match, no DVC cache here): the file the failed run wrote
    is no result, so it is removed, and the message says what brings the recorded one back. A dvc.lock that records
    no run of the stage: removed too, and said."""
    lock_for(committed, {"train_erm": [ERM]}, {ERM: headline.dvc_md5(b'{"erm_avg": 0.7}\n', "md5")})
    err = run_stage(committed, fails(write=b'{"erm_avg": 0.5}\n'), monkeypatch, capsys)
    assert not (committed / ERM).exists()
    assert f"`dvc checkout train_erm` restores the ones dvc.lock records; {NO_COPY}" in err, err

    lock_for(committed, {"linear_probe": []})
    err = run_stage(committed, fails(write=b'{"erm_avg": 0.5}\n'), monkeypatch, capsys)
    assert not (committed / ERM).exists()
    assert f"{ERM} is absent: dvc.lock records no run of this stage, and `dvc repro` writes it" in err, err


def test_only_a_failed_run_under_dvc_looks_for_a_copy(committed: Path, monkeypatch, capsys) -> None:
    """A run that succeeds under DVC writes its own headline and reads no dvc.lock, HEAD or DVC cache for it (the
    trace holds it to its deps); a run by hand that fails touches nothing: the previous file is intact, as its
    message says."""
    calls: list[str] = []
    real = headline.restore_recorded
    monkeypatch.setattr(headline, "restore_recorded", lambda stage, *a: calls.append(stage) or real(stage, *a))

    def succeeds(params, run) -> None:
        write(Path("."), "reports/metrics/erm.json", json.dumps({"test": {"avg": 0.4, "worst_group": 0.2}}))

    run_stage(committed, succeeds, monkeypatch, capsys, code=None)
    assert json.loads((committed / ERM).read_text()) == {"erm_avg": 0.4, "erm_worst": 0.2} and calls == []

    (committed / ERM).write_bytes(b'{"erm_avg": 0.4}\n')  # by hand: the previous run's file, whatever it holds
    err = run_stage(committed, fails(), monkeypatch, capsys, dvc=False)
    assert (committed / ERM).read_bytes() == b'{"erm_avg": 0.4}\n' and calls == []
    assert "git-tracked" not in err and "DVC removed" not in err, err

    err = run_stage(committed, fails(), monkeypatch, capsys)  # under DVC: the one place it looks
    assert calls == ["train_erm"] and (committed / ERM).read_bytes() == RECORDED and FROM_HEAD in err


@pytest.mark.slow
def test_the_recorded_headline_comes_back_from_head_or_dvcs_cache(tmp_path: Path) -> None:
    """A fresh clone's run recorded in the committed dvc.lock: HEAD's file; a run DVC's run-cache saved (queued,
    temporary, an uncommitted `dvc repro`): its object in DVC's cache. Only bytes with dvc.lock's md5 are written;
    none when nothing matches."""
    from dvc.repo import Repo

    recorded = write(tmp_path, S2, '{"s2_worst": 0.5}\n').read_bytes()
    lock_for(tmp_path, {"train_contrastive": [S2]})
    for command in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "run"]):
        git(tmp_path, *command)
    (tmp_path / S2).unlink()
    assert headline.restore_recorded("train_contrastive", tmp_path) == headline.Restored(S2, True, "HEAD")
    assert (tmp_path / S2).read_bytes() == recorded
    assert headline.restore_recorded("train_contrastive", tmp_path) == headline.Restored(S2, True, "")  # there

    other = b'{"s2_worst": 0.7}\n'  # another run's file, only in DVC's cache
    lock_for(tmp_path, {"train_contrastive": [S2]}, {S2: headline.dvc_md5(other, "md5")})
    assert headline.restore_recorded("train_contrastive", tmp_path) == headline.Restored(S2, True, None)
    assert not (tmp_path / S2).exists()  # HEAD's is not the recorded one
    subprocess.run(["dvc", "init", "-q"], cwd=tmp_path, check=True, capture_output=True)
    with Repo(str(tmp_path)) as repo:
        cached = Path(repo.cache.local.oid_to_path(headline.dvc_md5(other, "md5")))
    cached.parent.mkdir(parents=True, exist_ok=True)
    cached.write_bytes(other)
    assert headline.restore_recorded("train_contrastive", tmp_path) == headline.Restored(S2, True, "DVC's cache")
    assert (tmp_path / S2).read_bytes() == other
    assert headline.restore_recorded("inject_bias", tmp_path) == headline.Restored(
        "reports/metrics/inject_bias.json", False, None)  # dvc.lock records no run of it
    assert headline.restore_recorded("report", tmp_path) is None  # no headline file


def test_params_still_holding_the_bytes_read_are_not_validated_again_and_changed_ones_are(committed: Path,
                                                                                         monkeypatch) -> None:
    """The end-of-stage check with the bytes the stage read: the same bytes are the same params (no second parse or
    validation); other bytes are compared value by value, a comment added passing and a declared value refused."""
    import debias.harness.stage as stage
    from debias.schema import read_params
    from tests.faults.conftest import write_params

    monkeypatch.chdir(committed)
    params, read = read_params()
    assert read == (committed / "params.yaml").read_bytes()
    validated = []
    monkeypatch.setattr(stage, "load_params", lambda *a: validated.append(a) or read_params()[0])
    stage.check_params_unchanged("train_erm", params, read)
    assert validated == []
    (committed / "params.yaml").write_bytes(read + b"# a comment\n")
    stage.check_params_unchanged("train_erm", params, read)
    assert len(validated) == 1
    write_params(committed, {"erm": {"epochs": 5}})
    with pytest.raises(Exception, match="params.yaml changed while train_erm ran"):
        stage.check_params_unchanged("train_erm", params, read)


def test_params_that_change_while_a_stage_runs_end_with_the_recorded_headline(committed: Path, monkeypatch,
                                                                             capsys) -> None:
    """The check that removes what a stage wrote under params changed meanwhile: by hand it leaves the headline file
    (the stage had not written it yet); under DVC, which had deleted it, the stage puts back the recorded one."""
    from debias.harness.stage import check_params_unchanged
    from debias.schema import load_params
    from tests.faults.conftest import write_params

    monkeypatch.chdir(committed)
    (committed / ERM).write_bytes(RECORDED)
    write(committed, "reports/metrics/erm.json", "{}")
    params = load_params()
    write_params(committed, {"erm": {"epochs": 4}})
    with pytest.raises(Exception, match="params.yaml changed while train_erm ran"):
        check_params_unchanged("train_erm", params)
    assert not (committed / "reports/metrics/erm.json").exists() and (committed / ERM).read_bytes() == RECORDED

    git(committed, "checkout", "params.yaml")
    (committed / ERM).unlink()  # DVC, before it runs the stage

    def another_run_writes_params(params, run) -> None:
        write(Path("."), "reports/metrics/erm.json", json.dumps({"test": {"avg": 0.4}}))
        write_params(Path("."), {"erm": {"epochs": 4}})

    err = run_stage(committed, another_run_writes_params, monkeypatch, capsys)
    assert "params.yaml changed while train_erm ran" in err and FROM_HEAD in err, err
    assert not (committed / "reports/metrics/erm.json").exists() and (committed / ERM).read_bytes() == RECORDED


# --------------------------------------------------------------------------- for real: DVC, git and the pipeline


def fake_repo(root: Path) -> Callable[..., str]:
    """A git + DVC repository of one stage writing stage 2's git-tracked headline file (``cache: false``) from
    ``loss.epsilon``; returns a runner of commands in it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DVC_")}
    env.update(GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@t")

    def sh(*command: str) -> str:
        done = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"{command}: {done.stdout}{done.stderr}"
        return done.stdout + done.stderr

    write(root, "params.yaml", "loss:\n  epsilon: 0.5\n")
    write(root, "run.py", "import json, os, yaml\neps = yaml.safe_load(open('params.yaml'))['loss']['epsilon']\n"
                          "os.makedirs('reports/metrics', exist_ok=True)\nopen('model.txt', 'w').write(str(eps))\n"
                          f"json.dump({{'s2_worst': 0.5 if eps < 1 else 0.25}}, open('{S2}', 'w'))\n")
    write(root, "dvc.yaml", f"stages:\n  train_contrastive:\n    cmd: python run.py\n    deps: [run.py]\n"
                            f"    params: [loss]\n    outs: [model.txt]\n    metrics:\n      - {S2}:\n"
                            "          cache: false\n")
    for command in (["git", "init", "-q", "-b", "main"], ["dvc", "init", "-q"], ["git", "add", "-A"],
                    ["git", "commit", "-qm", "pipeline"]):
        sh(*command)
    return sh


@pytest.mark.slow
def test_a_merge_that_keeps_one_branchs_lock_with_the_others_metrics_is_shown_blank(tmp_path: Path) -> None:
    """Branch A ran ε 0.5, branch B ε 100; the merge kept A's dvc.lock and params.yaml with B's metrics. compare shows
    no stage-2 number under ε 0.5 for the commit or the workspace, and says why; `dvc status` (DVC itself) agrees that
    the file changed. A hand edit of the workspace's file to 0.9 is blanked the same way, the commit's stays blank."""
    from debias.tools.compare.collect import from_dvc

    sh = fake_repo(tmp_path)
    sh("git", "checkout", "-qb", "b")
    write(tmp_path, "params.yaml", "loss:\n  epsilon: 100\n")
    sh("dvc", "repro", "-q")
    sh("git", "add", "-A")
    sh("git", "commit", "-qm", "eps 100")
    sh("git", "checkout", "-q", "main")
    sh("dvc", "repro", "-q")
    sh("git", "add", "-A")
    sh("git", "commit", "-qm", "eps 0.5")
    baseline_numbers = json.loads((tmp_path / S2).read_text())
    sh("git", "merge", "-q", "-s", "ours", "--no-commit", "b")
    sh("git", "checkout", "b", "--", S2)
    sh("git", "commit", "-qm", "merge b: A's dvc.lock and params, B's metrics")
    assert json.loads((tmp_path / S2).read_text()) == {"s2_worst": 0.25} != baseline_numbers
    assert "reports/metrics/train_contrastive.json" in sh("dvc", "status")  # DVC notices: modified

    found = {e.kind: e for e in from_dvc(tmp_path) if e.kind in ("workspace", "baseline")}
    for experiment in found.values():
        assert "s2_worst" not in experiment.metrics, experiment
        assert f"{S2} does not match dvc.lock (edited, merged or from another run)" in experiment.reason
    assert found["workspace"].fix == "dvc repro"
    assert found["baseline"].fix == "dvc repro, then commit dvc.lock and reports/metrics"

    write(tmp_path, S2, '{"s2_worst": 0.9}')  # a hand edit of the workspace's
    found = {e.kind: e for e in from_dvc(tmp_path) if e.kind in ("workspace", "baseline")}
    assert "s2_worst" not in found["workspace"].metrics and "does not match dvc.lock" in found["workspace"].reason
    sh("dvc", "repro", "-q")  # what the message says: the numbers of the run dvc.lock records come back
    found = {e.kind: e for e in from_dvc(tmp_path) if e.kind == "workspace"}
    assert found["workspace"].metrics == baseline_numbers and not found["workspace"].reason


@pytest.mark.slow
@pytest.mark.parametrize("edited", ["a.json", "a.txt"], ids=["cache-false", "cached"])
def test_dvc_reruns_a_stage_whose_recorded_output_changed_before_the_stages_that_read_it(tmp_path: Path,
                                                                                         edited: str) -> None:
    """What the report relies on under DVC: a hand edit of a recorded output (`cache: false` or cached) shows in
    `dvc status`, and `dvc repro` brings its stage back in line with dvc.lock (rerun, or restored from DVC's cache)
    before it runs a stage that reads it, so that stage reads the recorded bytes, never the edited ones."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DVC_")}
    env.update(GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@t",
               DVC_NO_ANALYTICS="1")

    def sh(*command: str) -> str:
        done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"{command}: {done.stdout}{done.stderr}"
        return done.stdout + done.stderr

    write(tmp_path, "a.py", "open('a.json', 'w').write('{\"x\": 0.5}')\nopen('a.txt', 'w').write('A')\n")
    write(tmp_path, "b.py", "open('b.txt', 'w').write(open('a.json').read() + open('a.txt').read())\n")
    write(tmp_path, "dvc.yaml", "stages:\n  a:\n    cmd: python a.py\n    deps: [a.py]\n    outs: [a.txt]\n"
                                "    metrics:\n      - a.json:\n          cache: false\n"
                                "  b:\n    cmd: python b.py\n    deps: [b.py, a.json, a.txt]\n    outs: [b.txt]\n")
    for command in (["git", "init", "-q"], ["dvc", "init", "-q"], ["dvc", "repro", "-q"], ["git", "add", "-A"],
                    ["git", "commit", "-qm", "run"]):
        sh(*command)
    recorded = (tmp_path / "b.txt").read_text()
    assert recorded == '{"x": 0.5}A'

    for cache in ("kept", "removed"):  # restored from DVC's cache, then (no cache) rerun
        (tmp_path / edited).write_text("edited")
        status = sh("dvc", "status")
        assert re.search(rf"a:\s+changed outs:\s+modified:\s+{re.escape(edited)}", status), status
        write(tmp_path, "b.py", (tmp_path / "b.py").read_text() + "# b changed: it runs\n")
        if cache == "removed":
            shutil.rmtree(tmp_path / ".dvc/cache")
        output = sh("dvc", "repro")
        a_line = "Running stage 'a'" if cache == "removed" else "Stage 'a' is cached - skipping run, checking out"
        assert a_line in output and "Running stage 'b'" in output, output
        assert output.index(a_line) < output.index("Running stage 'b'"), output
        assert (tmp_path / "b.txt").read_text() == recorded and (tmp_path / edited).read_text() != "edited"
        assert "Data and pipelines are up to date" in sh("dvc", "status")


@pytest.fixture(scope="module")
def repro_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """README's first step in a fresh clone of the tiny pipeline: `dvc repro`, dvc.lock and the metrics left
    uncommitted."""
    from tests.faults.conftest import dvc, make_clone

    clone = make_clone(tmp_path_factory.mktemp("lock") / "clone")
    dvc(clone, "repro")
    return clone


@pytest.fixture
def repro_clone(repro_template: Path, tmp_path: Path) -> Path:
    target = tmp_path / "clone"
    shutil.copytree(repro_template, target, symlinks=True)
    return target


def changed(clone: Path) -> dict:
    """What `dvc status` finds changed, but the `source` stage (always_changed: it fingerprints the external data on
    every run)."""
    from tests.faults.conftest import dvc

    status = json.loads(dvc(clone, "status", "--json").stdout)
    return {stage: what for stage, what in status.items() if stage != "source"}


def headline_bytes(clone: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in headline.committed_metrics(clone)}


@pytest.mark.slow
def test_a_failed_rerun_keeps_the_metrics_from_dvcs_cache_then_from_head(repro_clone: Path) -> None:
    """After an uncommitted `dvc repro` (HEAD holds no such file), a rerun of linear_probe that fails leaves its
    git-tracked metrics byte-identical, put back from DVC's cache, and `dvc checkout linear_probe`, as the message
    says, restores the rest: `dvc status` is clean. Once the run is committed, a failed rerun puts them back from
    HEAD."""
    from tests.faults.conftest import dvc, git_commit_all

    clone = repro_clone
    before = headline_bytes(clone)
    for source in ("DVC's cache", "HEAD"):
        failed = dvc(clone, "repro", "-f", "-s", "linear_probe", check=False, DEBIAS_DEVICE="tpu")
        assert failed.returncode != 0 and "DEBIAS_DEVICE = 'tpu'" in failed.stderr, failed.stderr
        assert headline_bytes(clone) == before
        assert not (clone / "reports/metrics/probe.json").exists()  # a cached output: DVC removed it
        message = " ".join(failed.stderr.split())
        assert ("`dvc checkout linear_probe` restores the ones dvc.lock records; reports/metrics/linear_probe.json "
                "(git-tracked, which `dvc checkout` does not restore) holds the numbers dvc.lock records, put back "
                f"from {source}") in message, message
        assert "linear_probe" in changed(clone)
        dvc(clone, "checkout", "linear_probe")
        assert changed(clone) == {}
        if source != "HEAD":
            git_commit_all(clone, "the tiny run")  # HEAD holds it from now on


def readme_step(pattern: str) -> str:
    """The command of README's "Did it help?" section whose line matches ``pattern`` (its comment dropped)."""
    section = (REPO / "README.md").read_text(encoding="utf-8").split("## Did it help?")[1].split("\n## ")[0]
    line = next(line for line in section.splitlines() if re.match(rf"\s+{pattern}", line))
    return line.split("  #")[0].strip()


@pytest.mark.slow
def test_readmes_way_back_to_the_committed_params_leaves_no_other_runs_numbers(repro_clone: Path) -> None:
    """README's sequence: `dvc exp run -S loss.epsilon=0.25`, then its step back to the committed params. After it
    dvc.lock records the params in params.yaml and the metrics of the run `dvc repro` made (DVC restored them from
    its run-cache: no stage ran), so `dvc exp show`'s workspace row and `dvc metrics diff` pair nothing with another
    run's numbers; `dvc status` is clean, and compare, the report's warnings and every reader find nothing that
    disagrees with dvc.lock."""
    from debias.tools.compare.collect import from_dvc
    from tests.faults.conftest import dvc, stage_env

    clone = repro_clone
    before = headline_bytes(clone)
    committed_epsilon = headline.read_lock(clone)["stages"]["train_contrastive"]["params"]["params.yaml"]["loss"][
        "epsilon"]
    experiment = readme_step("dvc exp run -S loss.epsilon=")
    assert experiment == "dvc exp run -S loss.epsilon=0.25"
    dvc(clone, *experiment.split()[1:])
    assert headline.read_lock(clone)["stages"]["train_contrastive"]["params"]["params.yaml"]["loss"]["epsilon"] == 0.25
    # DVC records each stage's outputs in dvc.lock before the next stage runs: the report run by hand warns of nothing
    assert headline.mismatch_warnings(clone) == {}

    step = readme_step("git checkout params.yaml")
    done = subprocess.run(["bash", "-c", step], cwd=clone, env=stage_env(DVC_NO_ANALYTICS="1"), capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    output = done.stdout + done.stderr
    ran = [line.split("'")[1] for line in output.splitlines() if line.startswith("Running stage '")]
    assert set(ran) <= {"source"}, ran  # restored from DVC's run-cache, nothing trained
    assert "Stage 'train_contrastive' is cached - skipping run, checking out outputs" in output, output
    lock = headline.read_lock(clone)
    assert lock["stages"]["train_contrastive"]["params"]["params.yaml"]["loss"]["epsilon"] == committed_epsilon
    assert headline_bytes(clone) == before
    assert changed(clone) == {}
    shown = json.loads(dvc(clone, "exp", "show", "--json").stdout)
    workspace = next(entry for entry in shown if entry.get("rev") == "workspace")["data"]
    assert workspace["params"]["params.yaml"]["data"]["loss"]["epsilon"] == committed_epsilon
    assert workspace["metrics"][S2]["data"] == json.loads(before["train_contrastive.json"])

    assert headline.lock_mismatches(clone, headline.metrics_files(clone)) == {}
    assert headline.mismatch_warnings(clone) == {}
    found = {e.name: e for e in from_dvc(clone)}
    assert not found["workspace"].stale and found["workspace"].metrics.get("s2_worst") is not None
    assert all(not e.stale for e in found.values()), {e.name: e.reason for e in found.values()}


def test_the_sweep_reads_no_experiment_number_that_its_dvc_lock_does_not_record(tmp_path: Path, capsys) -> None:
    """An experiment's headline files at its revision against its dvc.lock there: a file edited after the run is left
    out of the numbers the sweep decides and logs on, and said so; one that matches is read."""
    from debias.tools.sweep.records import headline_values

    write(tmp_path, ERM, '{"erm_worst": 0.1}\n')
    write(tmp_path, S2, '{"s2_worst": 0.5}\n')
    lock_for(tmp_path, {"train_erm": [ERM], "train_contrastive": [S2]})
    write(tmp_path, S2, '{"s2_worst": 0.9}\n')  # committed beside the lock of the 0.5 run
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    for command in (["git", "init", "-q"], ["git", "add", "-A"], ["git", "commit", "-qm", "run"],
                    ["git", "update-ref", "refs/exps/ab/cdef/eps-s0", "HEAD"]):
        subprocess.run(command, cwd=tmp_path, env=env, check=True, capture_output=True)
    capsys.readouterr()
    assert headline_values(tmp_path, "refs/exps/ab/cdef/eps-s0") == {"erm_worst": 0.1}
    assert (f"[sweep] WARNING eps-s0: {S2} does not match dvc.lock (edited, merged or from another run): its numbers "
            "are left out") in capsys.readouterr().err
