"""Fifth round of silent-wrong attacks: a workspace never shows an output under params it was not computed with."""

from __future__ import annotations

import copy

import pytest
import yaml

from tests.conftest import committed_text


@pytest.mark.slow
def test_params_changed_while_a_stage_ran_fail_it_and_remove_what_it_wrote(tmp_path, monkeypatch, capsys) -> None:
    """A second `dvc exp run -S` writes params.yaml while the first one's stage trains: the stage fails naming the
    change, and the outputs it computed with the values it read are gone (DVC would otherwise record the new values
    beside them: `dvc status` clean, the model another run's)."""
    from debias.harness.stage import main

    raw = yaml.safe_load(committed_text("params.yaml"))
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw))
    (tmp_path / "dvc.yaml").write_text(committed_text("dvc.yaml"))
    monkeypatch.chdir(tmp_path)
    model = tmp_path / "models/stage2.pt"

    def body(params, run) -> None:
        model.parent.mkdir(parents=True, exist_ok=True)
        model.write_bytes(b"trained at the first run's lr")
        other = copy.deepcopy(raw)
        other["stage2"]["lr"] = 0.004  # the second experiment's -S
        (tmp_path / "params.yaml").write_text(yaml.safe_dump(other))

    with pytest.raises(SystemExit) as stopped:
        main("train_contrastive", body)
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert f"params.yaml changed while train_contrastive ran (stage2.lr {raw['stage2']['lr']!r} -> 0.004)" in err
    assert "models/stage2.pt" in err and not model.exists()
    assert not (tmp_path / "reports/runs/train_contrastive.json").exists()  # no run record of a run that failed
    # unchanged params: the same body's outputs stay
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw))
    main("train_contrastive", lambda params, run: (model.parent.mkdir(parents=True, exist_ok=True),
                                                   model.write_bytes(b"ok")))
    assert model.read_bytes() == b"ok"


def test_check_params_names_the_file_it_checks(tmp_path, capsys) -> None:
    from debias.tools.cli import main as cli_main

    raw = yaml.safe_load(committed_text("params.yaml"))
    raw["loss"]["epsilon"] = -1
    other = tmp_path / "other.yaml"
    other.write_text(yaml.safe_dump(raw))
    assert cli_main(["check-params", str(other)]) == 2
    err = capsys.readouterr().err
    assert f"invalid {other}:" in err and "invalid params.yaml" not in err


def test_a_failed_queued_experiment_gets_no_workspace_hint(tmp_path, monkeypatch) -> None:
    """In DVC's temporary workspace (a queued or --temp experiment: DVC_ROOT is the repository, the working folder
    another) `git checkout params.yaml` would touch the wrong tree: the hint says the repository is untouched."""
    import subprocess

    from debias.core.errors import uncommitted_params_hint

    root, temporary = tmp_path / "repo", tmp_path / "repo/.dvc/tmp/exps/tmpx"
    temporary.mkdir(parents=True)
    (temporary / "params.yaml").write_text("seed: 1\n")
    for command in (["git", "init", "-q"], ["git", "add", "-A"],
                    ["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "base"]):
        subprocess.run(command, cwd=temporary, check=True)
    (temporary / "params.yaml").write_text("seed: 2\n")
    monkeypatch.chdir(temporary)
    monkeypatch.delenv("DVC_ROOT", raising=False)
    assert "`git checkout params.yaml` restores" in uncommitted_params_hint()  # a workspace run: the hint applies
    monkeypatch.setenv("DVC_ROOT", str(root))
    hint = uncommitted_params_hint()
    assert "DVC's temporary workspace" in hint and "git checkout" not in hint


def test_resuming_a_sweep_after_a_new_commit_is_refused(tmp_path) -> None:
    import argparse
    import subprocess

    from debias.tools.sweep.command import resume
    from debias.tools.sweep.grid import SweepError

    root = tmp_path / "repo"
    root.mkdir()
    (root / "a.txt").write_text("1")
    for command in (["git", "init", "-q"], ["git", "add", "-A"],
                    ["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "base"]):
        subprocess.run(command, cwd=root, check=True)
    launched = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True).stdout.strip()
    (root / "a.txt").write_text("2")
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "next"], cwd=root, check=True)
    state = {"name": "temp", "commit": launched, "jobs": [], "launcher": "local"}
    with pytest.raises(SweepError, match=f"sweep 'temp' ran at commit {launched[:12]}; HEAD is now"):
        resume(root, state, argparse.Namespace())


HELPED_STAGE = """
import helper
{extra}
from debias.harness.stage import main

main("report", lambda params, run: None)
"""


@pytest.mark.slow
def test_code_outside_the_package_is_a_dep_or_refused(tmp_path) -> None:
    """A helper module beside the entrypoints becomes a code dep of the stage importing it (`debias deps`); a stage
    process that imports one its dvc.yaml entry does not list, or a module from a folder on PYTHONPATH outside the
    repository and the installed packages, is refused naming it (editing it would rerun nothing)."""
    import os
    import subprocess
    import sys

    from debias.tools.deps import code_deps
    from tests.conftest import REPO

    (tmp_path / "pipeline").mkdir()
    (tmp_path / "pipeline/helper.py").write_text("VALUE = 1\n")
    (tmp_path / "pipeline/report.py").write_text(HELPED_STAGE.format(extra=""))
    assert "pipeline/helper.py" in code_deps("python pipeline/report.py", tmp_path)

    (tmp_path / "params.yaml").write_text(committed_text("params.yaml"))
    stage = {"cmd": "python pipeline/report.py", "deps": ["pipeline/report.py"], "params": ["report"]}
    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"report": stage}}))
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "DEBIAS_TRACKING": "off", "DEBIAS_FAST_EXIT": "0"}
    done = subprocess.run([sys.executable, "pipeline/report.py"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 2, done.stderr
    assert ("report imports code DVC does not track, so editing it would rerun nothing: helper (pipeline/helper.py, in "
            "the repository but not among report's deps in dvc.yaml)") in done.stderr
    stage["deps"].append("pipeline/helper.py")
    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"report": stage}}))
    done = subprocess.run([sys.executable, "pipeline/report.py"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    elsewhere = tmp_path.parent / f"{tmp_path.name}-lab"
    elsewhere.mkdir()
    (elsewhere / "outsider.py").write_text("VALUE = 2\n")
    (tmp_path / "pipeline/report.py").write_text(HELPED_STAGE.format(extra="import outsider"))
    done = subprocess.run([sys.executable, "pipeline/report.py"], cwd=tmp_path, capture_output=True, text=True,
                          env={**env, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(elsewhere)])})
    assert done.returncode == 2 and f"outsider ({elsewhere.resolve()}/outsider.py, outside the repository" in done.stderr
